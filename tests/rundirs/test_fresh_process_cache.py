"""Fresh processes remember finished run dirs (issue 19): cron, GitOps CI and `reconcile --once` start a new process
every pass, and each used to read every trial result of dirs that finished weeks ago.

Each observation here runs in a process of its own, as those do. What was read is told by the trial results
themselves: after the first process, they are overwritten with garbage (keeping the dirs' own stat), which any
read would report as unreadable.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.fixtures.harbor_dirs import write_synthetic_run_dir

OBSERVE = """
import json, sys
from controller.adapters.rundirs.harbor import HarborRunDirs
from tests.fixtures.harbor_dirs import REFERENCE_ERRORS
facts = HarborRunDirs(sys.argv[1], REFERENCE_ERRORS).observe()
print(json.dumps({f.run_tag: [f.n_scored, f.unreadable] for f in facts}))
"""


def _observe_fresh(jobs: Path, cache: Path) -> dict[str, list[object]]:
    out = subprocess.run([sys.executable, "-c", OBSERVE, str(jobs)], check=True, capture_output=True, text=True,
                         env={**os.environ, "EVALCTL_CACHE_DIR": str(cache)})
    observed: dict[str, list[object]] = json.loads(out.stdout)
    return observed


def _fleet(jobs: Path) -> list[Path]:
    runs = [jobs / f"ev_org__m{index}-8B__tb__0123456789ab__a1" for index in range(3)]
    for run in runs:
        write_synthetic_run_dir(run, 6)
    return runs


def _garble_trial_results(run: Path) -> None:
    """Every trial's result.json made unparsable; the run dir's own mtime and job files stay as they were."""
    for result in run.glob("*__*/result.json"):
        stat = result.stat()
        result.write_text("{garbage")
        os.utime(result, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def test_a_fresh_process_reads_no_trial_of_a_finished_dir_and_rereads_a_dir_whose_job_file_changed(
        tmp_path: Path) -> None:
    jobs, cache = tmp_path / "jobs", tmp_path / "cache"
    runs = _fleet(jobs)
    first = _observe_fresh(jobs, cache)
    assert all(unreadable == "" for _, unreadable in first.values()), first
    for run in runs:
        _garble_trial_results(run)

    assert _observe_fresh(jobs, cache) == first, "a fresh process read trial results of finished dirs"

    (runs[0] / "result.json").write_text((runs[0] / "result.json").read_text() + " ")  # a resume rewrites it
    changed = _observe_fresh(jobs, cache)
    assert "result.json" in str(changed[runs[0].name][1]), "the dir whose job file changed was read again"
    assert {tag: changed[tag] for tag in first if tag != runs[0].name} == {
        tag: first[tag] for tag in first if tag != runs[0].name}


def test_a_cache_that_cannot_be_decoded_is_ignored_and_rewritten(tmp_path: Path) -> None:
    jobs, cache = tmp_path / "jobs", tmp_path / "cache"
    runs = _fleet(jobs)
    first = _observe_fresh(jobs, cache)
    [cache_file] = cache.glob("rundirs-*.json")
    for garbage in ('{"format": 1, "runs": [["x", 3]]}', "\x00\xff not json", "[]"):
        cache_file.write_text(garbage)
        assert _observe_fresh(jobs, cache) == first
        assert json.loads(cache_file.read_text())["runs"], "rebuilt by the pass that ignored it"
    _garble_trial_results(runs[1])
    cache_file.write_text("{garbage")
    reread = _observe_fresh(jobs, cache)
    assert "result.json" in str(reread[runs[1].name][1]), "an ignored cache is never trusted: the dirs are read"


def test_the_cache_is_per_set_of_error_classes(tmp_path: Path) -> None:
    """What a trial counts as depends on the error classes: facts kept under others are not reused."""
    jobs, cache = tmp_path / "jobs", tmp_path / "cache"
    _fleet(jobs)
    _observe_fresh(jobs, cache)
    code = OBSERVE.replace("REFERENCE_ERRORS).observe()",
                           "REFERENCE_ERRORS.model_copy(update={'benign': frozenset()})).observe()")
    subprocess.run([sys.executable, "-c", code, str(jobs)], check=True, capture_output=True,
                   env={**os.environ, "EVALCTL_CACHE_DIR": str(cache)})
    assert len(list(cache.glob("rundirs-*.json"))) == 2


def test_dirs_the_cache_knows_by_an_old_signature_are_cold_reads(tmp_path: Path) -> None:
    """A cache whose every entry went stale (the dirs were resumed, or rebuilt) must not make a process read them
    serially as if it knew them: they are cold, and the cold pass may read them in workers."""
    jobs, cache = tmp_path / "jobs", tmp_path / "cache"
    runs = _fleet(jobs)
    _observe_fresh(jobs, cache)
    (runs[0] / "result.json").write_text((runs[0] / "result.json").read_text() + " ")
    code = """
import json, sys
from controller.adapters.rundirs.memo import memo_for
from tests.fixtures.harbor_dirs import REFERENCE_ERRORS
memo = memo_for(sys.argv[1], REFERENCE_ERRORS)
print(json.dumps(sorted(run.rsplit("/", 1)[1] for run in memo._runs if memo.knows(run))))
"""
    out = subprocess.run([sys.executable, "-c", code, str(jobs)], check=True, capture_output=True, text=True,
                         env={**os.environ, "EVALCTL_CACHE_DIR": str(cache)})
    assert json.loads(out.stdout) == sorted(run.name for run in runs[1:])
