"""A run dir is written by the job: the names it holds leave `observe` masked, its numbers as they are.

Real files, read by the local reader and by the run-dir probe (run here through LocalCommands, as over ssh).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.adapters.rundirs import memo
from controller.adapters.rundirs.harbor import HarborRunDirs
from controller.adapters.rundirs.remote import RunDirProbe
from controller.adapters.scheduler.commands import LocalCommands
from controller.adapters.secrets import SecretMask
from controller.core.ports import ObservationError
from tests.fixtures.harbor_dirs import REFERENCE_ERRORS, write_config, write_job_result, write_trial

SECRET = "dtn-9f8e7d6c5b4a-live"  # the cluster's secretEnv value
TOKEN = "hf_" + "Qm7" * 12  # a shape nobody gave the job
TAG = "ev_org__m-8B__tb__0123456789ab__a1"


@pytest.fixture(autouse=True)
def fresh_memos(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memo, "_MEMOS", {})
    monkeypatch.setenv("EVALCTL_CACHE_DIR", "")


def leaky_run_dir(jobs: Path) -> Path:
    run = jobs / TAG
    write_config(run, model="hosted_vllm/org/m-8B", dataset="/data/tb")
    write_job_result(run, n_total=5, n_completed=5)
    write_trial(run, "t1__aaaaaaa", exception=TOKEN, output_tokens=0)
    write_trial(run, "t2__bbbbbbb", exception=TOKEN, output_tokens=0)
    write_trial(run, f"{SECRET}__ccccccc", reward=1.0, output_tokens=12,  # the first trial: its endpoint is the dir's
                api_base=f"http://10.0.0.1:8000/v1?key={TOKEN}")
    write_trial(run, "t3__ddddddd", reward=0.0, output_tokens=12)
    write_trial(run, "t4__eeeeeee", exception="DaytonaError", output_tokens=12)
    return run


def test_names_a_job_wrote_are_masked_and_counted_as_before(tmp_path: Path) -> None:
    leaky_run_dir(tmp_path)
    [facts] = HarborRunDirs(str(tmp_path), REFERENCE_ERRORS, mask=SecretMask([SECRET])).observe()
    assert {name: n for name, n in facts.error_breakdown.items() if n} == {"hf_***": 2, "DaytonaError": 1}
    assert facts.tasks["***"] == (1, 1, 1.0) and SECRET not in str(facts.tasks)
    assert facts.api_base == "http://10.0.0.1:8000/v1?key=hf_***"
    assert {q.exception_type for q in facts.quiet_failures} == {"hf_***"}
    assert (facts.n_completed, facts.n_infra_errors, facts.n_scored, facts.reward_sum) == (5, 3, 2, 1.0)
    assert (facts.run_tag, facts.model) == (TAG, "org/m-8B"), "our own names and clean ones as they were"
    assert TOKEN not in facts.model_dump_json() and SECRET not in facts.model_dump_json()


def test_the_probes_error_line_is_masked(tmp_path: Path) -> None:
    """What the login node's Python prints when it fails may quote a file the job wrote."""
    python = tmp_path / "python3"
    python.write_text(f"#!/bin/sh\ncat >/dev/null\necho 'ValueError: cannot read {TOKEN}' >&2\nexit 1\n")
    python.chmod(0o755)
    probe = RunDirProbe(LocalCommands(), "login", str(python))
    with pytest.raises(ObservationError, match=r"failed: ValueError: cannot read hf_\*\*\*$"):
        HarborRunDirs(str(tmp_path / "jobs"), REFERENCE_ERRORS, probe=probe, mask=SecretMask([SECRET])).observe()


def test_the_probe_reads_the_same_masked_facts(tmp_path: Path) -> None:
    leaky_run_dir(tmp_path)
    probe = RunDirProbe(LocalCommands(), "login")
    [probed] = HarborRunDirs(str(tmp_path), REFERENCE_ERRORS, probe=probe, mask=SecretMask([SECRET])).observe()
    memo._MEMOS.clear()
    [local] = HarborRunDirs(str(tmp_path), REFERENCE_ERRORS, mask=SecretMask([SECRET])).observe()
    assert probed == local and TOKEN not in probed.model_dump_json()
