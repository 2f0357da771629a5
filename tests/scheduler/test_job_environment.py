"""Jobs inherit their submitter's environment, minus the reconciler's own variables, every secret and the job
contract's names: a job gets a secret only through what its cluster declares, and a contract setting only from its
cell. Over ssh the login shell's secrets and contract names are dropped the same way."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from controller.adapters.remote.ssh import remote_script
from controller.adapters.scheduler.commands import LocalCommands, inherited_environment
from controller.adapters.scheduler.local import LocalScheduler
from controller.core.ports import SubmitRequest

OTHER_SECRET = "tok-meant-for-another-cluster"
MLFLOW_PASSWORD = "mlflow-login-of-the-reconciler"
HF_TOKEN = "hf_" + "a1B2c3D4e5" * 4  # in the reconciler's shell, meant for nobody's job
SECRETS = {"HF_TOKEN": HF_TOKEN, "OPENAI_API_KEY": "sk-reconcilers-own-0123456789", "db_password": "hunter2",
           "KEY_COLUMN": "id"}  # a short value named like a secret is not inherited either: declare it in `env`
# contract settings a researcher's shell may export (the old runbooks did): they would change what a cell measures
SHELL_CONTRACT = {"EVAL_CONFIG_YAML": "shell-config.yaml", "EVAL_SHARD": "0/2", "EVAL_VLLM_MAX_MODEL_LEN": "8192"}
SETTINGS = {"SITE_SETTING": "kept", "TOKENIZERS_PARALLELISM": "false", "MAX_TOKENS": "4096",
            "HF_TOKEN_PATH": "/"}  # named like secrets, holding a switch, a number, a path: settings


@pytest.fixture(autouse=True)
def reconciler_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EVALCTL_SECRET_PINGGY_B_TOKEN", OTHER_SECRET)
    monkeypatch.setenv("EVALCTL_STORE", "sqlite:///secret-path.db")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", MLFLOW_PASSWORD)  # the reconciler uploads; jobs never do
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", MLFLOW_PASSWORD)
    for name, value in {**SECRETS, **SETTINGS, **SHELL_CONTRACT}.items():
        monkeypatch.setenv(name, value)


def printed_env(out: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def assert_inherits_settings_not_secrets(seen: dict[str, str]) -> None:
    assert {name: seen.get(name) for name in SETTINGS} == SETTINGS and seen["PATH"] == os.environ["PATH"]
    assert not set(SECRETS) & set(seen) and not [name for name in seen if name.startswith("EVALCTL_")]
    assert HF_TOKEN not in str(seen) and OTHER_SECRET not in str(seen) and MLFLOW_PASSWORD not in str(seen)
    assert not set(SHELL_CONTRACT) & set(seen), "a contract setting the job took from its submitter's shell"


def test_the_inherited_environment_keeps_settings_and_drops_every_secret() -> None:
    assert_inherits_settings_not_secrets(inherited_environment())


def test_a_declared_secret_reaches_the_job_whatever_its_name() -> None:
    out = LocalCommands().run(["env"], env={"HF_TOKEN": "hf-declared-by-the-cluster"}, timeout=10).stdout
    assert printed_env(out)["HF_TOKEN"] == "hf-declared-by-the-cluster"


def test_over_ssh_the_login_shells_own_secrets_are_dropped_there_and_declared_ones_set() -> None:
    """The script the remote `sh -s` runs, run by a real `sh` here with the login shell's environment."""
    login = {**inherited_environment(), **SECRETS, **SHELL_CONTRACT, "WEIRD_KEY": "line one\nFAKE_TOKEN=x",
             "SSH_KEY_FILE": "/nonexistent/id"}
    script = remote_script(["env"], {"EVAL_PINGGY_TOKEN": "tok-for-this-job", "HF_TOKEN": "hf-declared"})
    out = subprocess.run(["sh", "-s"], input=script, env=login, capture_output=True, text=True, timeout=10, check=True)
    seen = printed_env(out.stdout)
    assert (seen["EVAL_PINGGY_TOKEN"], seen["HF_TOKEN"]) == ("tok-for-this-job", "hf-declared")
    assert_inherits_settings_not_secrets({k: v for k, v in seen.items() if k != "HF_TOKEN"} | {"PATH": login["PATH"]})
    assert not {"WEIRD_KEY", "FAKE_TOKEN", "SSH_KEY_FILE"} & set(seen) and out.stderr == ""


def test_commands_like_sbatch_do_not_pass_the_reconcilers_secrets_on(tmp_path: Path) -> None:
    out = LocalCommands().run(["env"], env={"EVAL_PINGGY_TOKEN": "tok-for-this-job"}, timeout=10).stdout
    assert "EVAL_PINGGY_TOKEN=tok-for-this-job" in out
    assert_inherits_settings_not_secrets({k: v for k, v in printed_env(out).items() if k != "EVAL_PINGGY_TOKEN"})


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
    assert "EVAL_PINGGY_TOKEN=tok-for-this-job" in out
    assert_inherits_settings_not_secrets({k: v for k, v in printed_env(out).items() if k != "EVAL_PINGGY_TOKEN"})
