"""The run-dir probe on the lab sshd (the login node is this machine, so the same dirs can be read locally too).

Its facts are the local reader's over every hostile dir of tests/adversarial; a pass costs two probe calls, and
a warm one is told what it knows and answers only what changed; whatever goes wrong with the probe is an
`ObservationError` with why (the cells Unknown), never a dir read as absent.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest

from controller.adapters.remote.ssh import SshCommands
from controller.adapters.rundirs import memo
from controller.adapters.rundirs.harbor import HarborRunDirs
from controller.adapters.rundirs.remote import RunDirProbe
from controller.adapters.scheduler.commands import CommandResult
from controller.core.observed import RunDirFacts
from controller.core.ports import JobsDirMissing, ObservationError
from tests.adversarial.test_hostile_run_dirs import CASES, TAG, finished_run
from tests.fixtures.harbor_dirs import REFERENCE_ERRORS, write_synthetic_run_dir, write_trial
from tests.ssh.conftest import SshLab

PYTHON_39 = "/root/.pyenv/versions/3.9.18/bin/python3"
PYTHON_36 = "/root/.pyenv/versions/3.6.15/bin/python3"


class Recording:
    """The lab's ssh commands, with each call's request size and answer kept."""

    def __init__(self, commands: SshCommands) -> None:
        self.commands = commands
        self.answers: list[dict[str, object]] = []

    def run(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, timeout: float,
            stdin: str | None = None) -> CommandResult:
        result = self.commands.run(argv, env=env, timeout=timeout, stdin=stdin)
        try:
            self.answers.append(json.loads(result.stdout))
        except ValueError:
            pass  # cut short: what the probe's client says of it is under test
        return result


@pytest.fixture
def login(ssh_lab: SshLab, control_dir: str) -> Iterator[Recording]:
    commands = SshCommands(ssh_lab.alias, config_file=ssh_lab.config_file, control_dir=control_dir)
    yield Recording(commands)
    commands.close()


@pytest.fixture
def jobs() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="evalrun-probe-"))
    yield root / "jobs"
    shutil.rmtree(root)


@pytest.fixture(autouse=True)
def fresh_memos(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each observation below starts as a new process would, without a cache: the reads are what is compared."""
    monkeypatch.setattr(memo, "_MEMOS", {})
    monkeypatch.setenv("EVALCTL_CACHE_DIR", "")


def probed(jobs: Path, login: Recording, python: str = "python3") -> tuple[RunDirFacts, ...]:
    return HarborRunDirs(str(jobs), REFERENCE_ERRORS, probe=RunDirProbe(login, "evalrun-login", python)).observe()


def local(jobs: Path) -> tuple[RunDirFacts, ...]:
    facts = HarborRunDirs(str(jobs), REFERENCE_ERRORS).observe()
    memo._MEMOS.clear()
    return facts


@pytest.mark.parametrize("name", [name for name, case in CASES.items() if not case.as_nobody])
def test_the_probes_facts_are_the_local_readers_over_every_hostile_dir(jobs: Path, login: Recording,
                                                                      name: str) -> None:
    """(The permission case is left out: the lab's login is root, who reads any file.)"""
    CASES[name].build(finished_run(jobs))
    expected = local(jobs)
    assert expected[0].unreadable, "the case is hostile"
    assert probed(jobs, login) == expected


def test_a_fleet_reads_alike_on_python_3_9_and_a_warm_pass_answers_only_what_changed(jobs: Path,
                                                                                     login: Recording) -> None:
    for index in range(3):
        write_synthetic_run_dir(jobs / f"ev_done_{index}", 8, infra_every=3, benign_every=4)
    running = jobs / "ev_running"
    write_synthetic_run_dir(running, 5, n_total=10, finished=False)
    write_trial(running, "late__xxxxxxx", result=False)
    (jobs / "old-listener-run").mkdir(parents=True)
    expected = local(jobs)

    first = probed(jobs, login, PYTHON_39)
    assert first == expected
    assert [answer.get("run_tags") is not None for answer in login.answers] == [True, False], "list, then scan"

    login.answers.clear()
    write_trial(running, "late__xxxxxxx", reward=1.0)
    again = probed(jobs, login)
    assert again == local(jobs)
    assert len(login.answers) == 2, "a pass is two probe calls"
    runs = login.answers[1]["runs"]
    assert isinstance(runs, dict)
    assert all(runs[f"ev_done_{index}"] == {"same": True} for index in range(3)), "finished dirs: nothing sent"
    kinds = {trial[0]: trial[1] for trial in runs["ev_running"]["trials"]}
    assert kinds.pop("late__xxxxxxx") == "outcome" and set(kinds.values()) == {"known"}, kinds


def test_a_missing_jobs_dir_is_not_an_empty_one(jobs: Path, login: Recording) -> None:
    with pytest.raises(JobsDirMissing, match=f"jobs dir {jobs} on evalrun-login does not exist"):
        probed(jobs, login)


def _wrapper(tmp_path: Path, body: str) -> str:
    """A `python` on the login node (this machine) that runs the real one through `body`."""
    path = tmp_path / "python"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


@pytest.mark.parametrize(("body", "said"), [
    ("python3 - | head -c 120", r"does not decode \(cut short\?\)"),
    ("python3 - | head -c 120; kill -9 $$", "could not run: .* ssh exited with 255"),  # ssh's word for a signal
    ("""python3 - | sed 's/"probe":"[0-9a-f]*"/"probe":"0123456789abcdef"/'""",
     "answered as version '0123456789abcdef'"),
])
def test_a_probe_cut_short_killed_or_of_another_version_is_unknown_with_why(
        jobs: Path, login: Recording, tmp_path: Path, body: str, said: str) -> None:
    finished_run(jobs)
    with pytest.raises(ObservationError, match=said):
        probed(jobs, login, _wrapper(tmp_path, body))


def test_a_login_node_without_that_python_names_scheduler_python(jobs: Path, login: Recording) -> None:
    finished_run(jobs)
    with pytest.raises(ObservationError, match=r"/no/python3 was not found on evalrun-login: set scheduler\.python"):
        probed(jobs, login, "/no/python3")
    if os.path.exists(PYTHON_36):
        with pytest.raises(ObservationError, match=r"is Python 3\.6\.15: the run-dir probe needs 3\.9 or later"):
            probed(jobs, login, PYTHON_36)


def test_a_dir_that_is_not_ours_and_cannot_be_listed_is_skipped_and_ours_unreadable(jobs: Path,
                                                                                     login: Recording) -> None:
    finished_run(jobs)
    os.symlink("other_loop", jobs / "other_loop")
    (jobs / f"{TAG[:-1]}9").write_text("a file named like ours")
    facts = {f.run_tag: f for f in probed(jobs, login)}
    assert facts == {f.run_tag: f for f in local(jobs)}
    assert "other_loop" not in facts and facts[f"{TAG[:-1]}9"].unreadable.endswith("Not a directory")
