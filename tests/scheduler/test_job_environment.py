"""Jobs inherit their submitter's environment, minus the reconciler's own variables and secrets."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from controller.adapters.scheduler.commands import LocalCommands
from controller.adapters.scheduler.local import LocalScheduler
from controller.core.ports import SubmitRequest

OTHER_SECRET = "tok-meant-for-another-cluster"
MLFLOW_PASSWORD = "mlflow-login-of-the-reconciler"


@pytest.fixture(autouse=True)
def reconciler_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EVALCTL_SECRET_PINGGY_B_TOKEN", OTHER_SECRET)
    monkeypatch.setenv("EVALCTL_STORE", "sqlite:///secret-path.db")
    monkeypatch.setenv("SITE_SETTING", "kept")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", MLFLOW_PASSWORD)  # the reconciler uploads; jobs never do
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", MLFLOW_PASSWORD)


def test_commands_like_sbatch_do_not_pass_the_reconcilers_secrets_on(tmp_path: Path) -> None:
    out = LocalCommands().run(["env"], env={"EVAL_PINGGY_TOKEN": "tok-for-this-job"}, timeout=10).stdout
    assert "EVAL_PINGGY_TOKEN=tok-for-this-job" in out and "SITE_SETTING=kept" in out
    assert OTHER_SECRET not in out and "EVALCTL_" not in out and MLFLOW_PASSWORD not in out


def test_local_jobs_do_not_see_the_reconcilers_secrets(tmp_path: Path) -> None:
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\nenv\n")
    script.chmod(0o755)
    scheduler = LocalScheduler(tmp_path / "state")
    job_id = scheduler.submit(SubmitRequest(name="ev_env_check", comment="k", script=str(script), args=(),
                                            env={"EVAL_PINGGY_TOKEN": "tok-for-this-job"},
                                            logs_dir=str(tmp_path / "logs"), time_limit="1"))
    deadline = time.monotonic() + 30
    while scheduler.find("ev_env_check").state.active:
        assert time.monotonic() < deadline, "the job did not end"
        time.sleep(0.05)
    out = (tmp_path / "logs" / f"ev_env_check_{job_id}.out").read_text()
    assert "EVAL_PINGGY_TOKEN=tok-for-this-job" in out and "SITE_SETTING=kept" in out
    assert OTHER_SECRET not in out and "EVALCTL_" not in out and MLFLOW_PASSWORD not in out
