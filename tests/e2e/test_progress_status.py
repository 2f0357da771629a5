"""Progress, not fake scores (issue 21), through the real CLI: a job hung 5 trials into 18 (the fake Harbor's
FAKE_HARBOR_HANG_AFTER) is `Running 5/18 · ETA N min` in `status`, in `-o json` and in `explain`, which prints
values, never reprs; and no score anywhere until one is uploaded."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys

from tests.e2e.conftest import Cluster
from tests.fixtures.evalctl import wait_until

MODEL = "org/m1-8B"
DATASET = "DCAgent/tiny"
HUNG_AT_5_OF_18 = {"FAKE_HARBOR_TASKS": "6", "FAKE_HARBOR_HANG_AFTER": "5", "FAKE_HARBOR_INFRA_ERRORS": "0"}
REPR = re.compile(r"<\w+\.\w+: |datetime\.|datetime\(")
SCORE = re.compile(r"\b\d\.\d{3}\b")


def _running_cell(cluster: Cluster) -> dict:
    cluster.write(models=[MODEL], datasets=[DATASET], env=HUNG_AT_5_OF_18)
    cluster.evalctl("reconcile", "--once")

    def hung() -> dict | None:
        [run] = json.loads(cluster.evalctl("status", "-o", "json").stdout)["evalruns"]
        [cell] = run["cells"]
        return cell if cell["phase"] == "Running" and (cell["progress"] or {}).get("scored") == 5 else None

    found = wait_until(hung, "the job to hang after 5 scored trials", timeout_s=60, step_s=0.3)
    assert isinstance(found, dict)
    return found


def test_a_running_cell_shows_scored_of_total_and_an_eta_and_never_a_score(cluster: Cluster) -> None:
    cell = _running_cell(cluster)  # its row still Pending: explain shows the record that moves it to Started

    assert cell["score"] is None, cell
    assert cell["progress"]["total"] == 18 and isinstance(cell["progress"]["eta_minutes"], int), cell

    grid = cluster.evalctl("status").stdout
    assert re.search(r"Running 5/18 · ETA \d+ min", grid), grid
    assert not SCORE.search(grid), f"a score for a cell with none uploaded:\n{grid}"

    told = cluster.evalctl("explain", MODEL, DATASET).stdout
    assert not REPR.search(told), told
    assert re.search(r"record: row_id \S+; status Started; started_at \d{4}-\d\d-\d\d \d\d:\d\d UTC", told), told
    assert re.search(r"phase:  Running 5/18 · ETA \d+ min", told) and "score:  — (none uploaded)" in told, told
    assert re.search(r"started: \d{4}-\d\d-\d\d \d\d:\d\d UTC \(\d+ (s|min) ago\)", told), told


def test_watch_on_a_pipe_prints_the_table_without_terminal_codes_and_stops_on_ctrl_c(cluster: Cluster) -> None:
    _running_cell(cluster)
    log = cluster.root / "watch.log"
    command = [sys.executable, "-m", "controller.entry.cli", "status", "--watch", "--interval", "0.5",
               "-f", str(cluster.spec), "--store", cluster.store]
    with log.open("w") as sink:
        watcher = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   env={**os.environ, "COLUMNS": "200"})
        try:
            wait_until(lambda: "5/18 · ETA" in log.read_text(), "the first frame", timeout_s=60)
        finally:
            watcher.send_signal(signal.SIGINT)
            code = watcher.wait(timeout=60)

    text = log.read_text()
    assert code == 130, text
    assert "\x1b" not in text and "━" in text, text
    assert not SCORE.search(text), text
