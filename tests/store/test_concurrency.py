"""Two stores on one file (two processes in real life) see each other's writes and never lose one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from controller.adapters.store.sqlite import SqliteStore
from controller.core.store import Store
from tests.store.builders import new_row, submission

MODEL = "laion/Qwen3-8B-sft-v3"


def test_two_instances_see_each_others_writes(db_path: Path) -> None:
    a, b = SqliteStore(db_path), SqliteStore(db_path)

    a.record_submission(submission())
    a.create_row(new_row())
    b.record_job_id(submission().name, "77")
    b.update_row("row-1", owner="alice", slurm_job_id="77")
    snapshot = Store(a, a).observe("qwen-evals", [MODEL], ["dev_set_v2"])

    assert snapshot.submissions[0].job_id == "77"
    assert snapshot.rows[0].slurm_job_id == "77"
    assert a.try_lease("qwen-evals", "a", 60)
    assert not b.try_lease("qwen-evals", "b", 60)
    a.close()
    b.close()


def test_two_processes_writing_at_once_lose_nothing(db_path: Path) -> None:
    SqliteStore(db_path).close()
    writer = (
        "import sys\n"
        "from controller.adapters.store.sqlite import SqliteStore\n"
        "from tests.store.builders import new_row, submission\n"
        "store = SqliteStore(sys.argv[1])\n"
        "for i in range(100):\n"
        "    name = f'{sys.argv[2]}-{i}'\n"
        "    store.record_submission(submission(name, row_id=name))\n"
        "    store.create_row(new_row(name))\n"
        "    store.read_results(['laion/Qwen3-8B-sft-v3'], ['dev_set_v2'])\n"
    )
    root = Path(__file__).parents[2]
    procs = [subprocess.Popen([sys.executable, "-c", writer, str(db_path), tag], cwd=root) for tag in ("p", "q")]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]

    store = SqliteStore(db_path, readonly=True)
    snapshot = Store(store, store).observe("qwen-evals", [MODEL], ["dev_set_v2"])
    store.close()
    assert len(snapshot.submissions) == len(snapshot.rows) == 200
    assert len(snapshot.models) == len(snapshot.benchmarks) == 1
