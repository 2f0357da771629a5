"""A cluster's preflight (RULES §12): what its one command prints, read strictly, and each failure said with its
fix; the script itself run here by `sh` on real files (the SLURM checks run over ssh in tests/ssh_e2e)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from controller.adapters.scheduler.commands import CommandResult, LocalCommands
from controller.adapters.scheduler.preflight import (
    PreflightAnswer,
    PreflightTarget,
    findings,
    parse_answer,
    run_preflight,
)
from controller.core.ports import ObservationError

TARGET = PreflightTarget(cluster="hpc1", host="login.hpc1", remote=True, jobs_dir="/scratch/evals/jobs",
                         job_script="/home/alice/eval.sbatch", partition="gpu-a100", account="proj42",
                         python="python3", slurm=True)
ALL_OK = {"user": "alice", "jobs_dir": "ok", "script": "ok", "partition": "ok", "partitions": "debug,gpu",
          "account": "ok", "accounts": "proj42", "python": "ok", "python_version": "3.11"}


def answer(**changes: str) -> PreflightAnswer:
    return PreflightAnswer.model_validate({**ALL_OK, **changes})


def printed(fields: dict[str, str], banner: str = "") -> str:
    return banner + "@preflight\n" + "".join(f"{key}={value}\n" for key, value in fields.items())


def test_the_answer_is_read_after_its_marker_whatever_a_login_shell_printed_first() -> None:
    read = parse_answer(printed(ALL_OK, banner="Welcome to hpc1\npartition=missing\n"))
    assert read == answer()


@pytest.mark.parametrize(("text", "says"), [
    ("Welcome to hpc1\n", "printed nothing"),
    (printed(ALL_OK) + "partition=missing\n", "unexpected line"),
    (printed(ALL_OK) + "an error line\n", "unexpected line"),
    (printed({**ALL_OK, "partition": "maybe"}), "partition"),
    (printed({**ALL_OK, "surprise": "1"}), "surprise"),
    (printed({key: value for key, value in ALL_OK.items() if key != "script"}), "script"),
])
def test_an_answer_not_understood_is_no_preflight_passed(text: str, says: str) -> None:
    with pytest.raises(ObservationError, match=says):
        parse_answer(text)


def test_everything_fine_passes_and_says_what_was_checked() -> None:
    found = findings(answer(), TARGET)
    assert found.ok and not found.failures
    assert found.passed == ("jobs dir /scratch/evals/jobs writable", "job script /home/alice/eval.sbatch readable",
                            "partition gpu-a100", "account proj42", "python 3.11")


@pytest.mark.parametrize(("changes", "field", "message"), [
    ({"partition": "missing"}, "partition",
     "partition gpu-a100 does not exist on login.hpc1 (sinfo lists: debug, gpu); set spec.partition to one of them"),
    ({"account": "no_account", "accounts": "proj1,proj2"}, "account",
     "account proj42 does not exist on login.hpc1 (sacctmgr); set spec.account to one of alice's: proj1, proj2"),
    ({"account": "no_association", "accounts": ""}, "account",
     "alice has no association with account proj42 on login.hpc1 (sacctmgr): ask its admins to add one, or set "
     "spec.account to an account of alice"),
    ({"jobs_dir": "unwritable"}, "jobsDir",
     "jobsDir /scratch/evals/jobs on login.hpc1 is not writable by alice (a probe file could not be made there): "
     "fix its permissions, or set spec.jobsDir to a directory alice can write"),
    ({"jobs_dir": "parent_not_dir", "jobs_dir_parent": "/scratch/evals"}, "jobsDir",
     "jobsDir /scratch/evals/jobs on login.hpc1 does not exist and cannot be made: /scratch/evals is not a "
     "directory; fix spec.jobsDir"),
    ({"jobs_dir": "parent_unwritable", "jobs_dir_parent": "/scratch"}, "jobsDir",
     "jobsDir /scratch/evals/jobs on login.hpc1 does not exist and alice cannot make it in /scratch"),
    ({"script": "missing"}, "jobScript",
     "jobScript /home/alice/eval.sbatch does not exist on login.hpc1: fix spec.jobScript (a path on the login node)"),
    ({"script": "unreadable"}, "jobScript", "jobScript /home/alice/eval.sbatch cannot be read by alice"),
    ({"python": "missing", "python_error": "python3: not found"}, "scheduler.python",
     "scheduler.python python3 on login.hpc1 was not found; set spec.scheduler.python to the login node's Python "
     "3.9 or later"),
    ({"python_version": "3.6"}, "scheduler.python", "scheduler.python python3 on login.hpc1 is Python 3.6; set"),
    ({"python_version": "three"}, "scheduler.python", "scheduler.python python3 on login.hpc1 is Python three; set"),
    ({"python": "failed", "python_error": "exit 1"}, "scheduler.python",
     "scheduler.python python3 on login.hpc1 does not run (exit 1); set"),
])
def test_each_failure_says_what_is_wrong_and_which_field_to_fix(changes: dict[str, str], field: str,
                                                               message: str) -> None:
    found = findings(answer(**changes), TARGET)
    [failure] = found.failures
    assert failure.field == field and failure.message.startswith(message), failure.message
    assert not found.ok and found.summary.startswith("the preflight of hpc1 failed: ")


def test_sinfo_that_failed_is_no_pass_and_no_verdict() -> None:
    found = findings(answer(partition="unknown", partition_error="slurm_load_partitions: Unable to contact slurm "
                                                                 "controller (connect failure)"), TARGET)
    assert not found.failures and not found.ok
    assert found.unobserved == "sinfo failed on login.hpc1: slurm_load_partitions: Unable to contact slurm " \
                               "controller (connect failure)"


def test_an_account_sacctmgr_cannot_tell_about_is_not_held() -> None:
    found = findings(answer(account="unknown", account_error="sacctmgr: error: Problem talking to the database"),
                     TARGET)
    assert found.ok and "account proj42 not checked (sacctmgr: sacctmgr: error: Problem talking to the database)" \
        in found.passed


# ------------------------------------------------------------------ the script, run by sh on this host


def local(tmp_path: Path, **changes: object) -> PreflightTarget:
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\n")
    values: dict[str, object] = {"cluster": "local", "host": "this host", "remote": False,
                                 "jobs_dir": str(tmp_path / "jobs"), "job_script": str(script), "slurm": False}
    return PreflightTarget.model_validate({**values, **changes})


def test_a_writable_jobs_dir_passes_and_keeps_no_probe_file(tmp_path: Path) -> None:
    (tmp_path / "jobs").mkdir()
    found = run_preflight(LocalCommands(), local(tmp_path, python="python3"))
    assert found.ok, found.summary
    assert os.listdir(tmp_path / "jobs") == []
    assert found.passed[0] == f"jobs dir {tmp_path}/jobs writable" and found.passed[-1].startswith("python 3.")


def test_a_missing_jobs_dir_the_first_job_can_make_passes_and_is_not_made(tmp_path: Path) -> None:
    found = run_preflight(LocalCommands(), local(tmp_path, jobs_dir=str(tmp_path / "new" / "deeper")))
    assert found.ok and found.passed[0] == f"jobs dir {tmp_path}/new/deeper made by the first job ({tmp_path} is " \
                                           "writable)"
    assert sorted(os.listdir(tmp_path)) == ["job.sh"], "the check leaves nothing behind"


def test_what_is_wrong_on_this_host_is_found_in_one_run(tmp_path: Path) -> None:
    (tmp_path / "blocker").write_text("a file where a directory should be\n")
    found = run_preflight(LocalCommands(), local(tmp_path, jobs_dir=str(tmp_path / "blocker" / "jobs"),
                                                 job_script=str(tmp_path), python="no-such-python-3"))
    assert [(f.field, f.message.split(":")[0]) for f in found.failures] == [
        ("jobsDir", f"jobsDir {tmp_path}/blocker/jobs on this host does not exist and cannot be made"),
        ("jobScript", f"jobScript {tmp_path} is not a file on this host"),
        ("scheduler.python", "scheduler.python no-such-python-3 on this host was not found; set spec.scheduler.python "
                             "to the login node's Python 3.9 or later (a name on its PATH or an absolute path)"),
    ]


def test_a_tenants_fields_are_arguments_never_shell(tmp_path: Path) -> None:
    """Every field a tenant writes reaches the script as an argument: quoting tricks stay text."""
    pwned = tmp_path / "pwned"
    hostile = f"$(touch {pwned})'; touch {pwned}; '`touch {pwned}`"
    found = run_preflight(LocalCommands(), local(tmp_path, jobs_dir=f"{tmp_path}/{hostile}", job_script=hostile,
                                                 python=hostile, partition=hostile, account=hostile))
    assert not pwned.exists()
    assert {f.field for f in found.failures} == {"jobScript", "scheduler.python"}, found.summary
    assert found.passed[0].startswith(f"jobs dir {tmp_path}/$(touch"), "a missing dir whose parent takes it"


class Answering:
    """A runner that answers with a fixed result: what a login node might send back."""

    def __init__(self, result: CommandResult) -> None:
        self.result = result

    def run(self, argv: list[str], **_: object) -> CommandResult:
        return self.result


def test_a_command_that_failed_is_unobserved_with_its_last_error_line() -> None:
    runner = Answering(CommandResult(returncode=127, stdout="", stderr="bash: line 1: sh: command not found\n"))
    with pytest.raises(ObservationError) as raised:
        run_preflight(runner, TARGET)  # type: ignore[arg-type]
    assert str(raised.value) == "the preflight on login.hpc1 exited 127: bash: line 1: sh: command not found"
