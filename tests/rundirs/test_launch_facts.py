"""The facts the launch-health rules read (RULES §8), from real files in Harbor's layout: the trials that raised
without an output token (`quiet_failures`), the trials that started (`n_started_trials`) and the endpoint the first
trial calls (`api_base`) — read from a local tree, through fsspec, from the memo on a later pass."""

from __future__ import annotations

import errno
import json
import os
import re
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import fsspec
import pytest
from fsspec.implementations.local import LocalFileSystem
from fsspec.implementations.memory import MemoryFileSystem

from controller.adapters.rundirs import tree
from controller.adapters.rundirs.harbor import HarborRunDirs
from controller.adapters.rundirs.harbor_format import FormatError, trial_outcome
from controller.core.health import count_instant_failures
from controller.core.observed import ErrorKind, QuietFailure, RunDirFacts
from controller.core.ports import ObservationError
from tests.fixtures.harbor_dirs import REFERENCE_ERRORS, T0, write_job_result, write_meta_env, write_trial

PINGGY = "https://abc-1-2-3-4.a.pinggy.link/v1"


def observe(jobs: Path | str, fs: fsspec.AbstractFileSystem | None = None) -> dict[str, RunDirFacts]:
    return {f.run_tag: f for f in HarborRunDirs(str(jobs), REFERENCE_ERRORS, fs=fs).observe()}


def build_launch(run: Path, *, finished: bool = False) -> Path:
    """A launch whose model was not reachable for some trials, with one trial of each way to (not) have started."""
    write_meta_env(run, MODEL="org/m", REPO_ID="DCAgent/tiny", RESUME_COUNT=0)
    write_job_result(run, n_total=12, finished=finished)
    # instant failures: raised, no output token, (almost) no agent time
    write_trial(run, "a-conn__aaaaaaa", exception="APIConnectionError", output_tokens=None, agent_seconds=0.5,
                api_base=PINGGY)
    bad = write_trial(run, "b-bad__bbbbbbb", exception="BadRequestError", reward=0.0, output_tokens=0,
                      agent_seconds=0.5, api_base="http://10.0.0.7:8000/v1")
    from_litellm(bad / "result.json")  # the model's failure only as litellm's, not as a sandbox SDK's
    write_trial(run, "c-sandbox__ccccccc", exception="DaytonaError", agent_seconds=None)  # never ran, no usage
    # raised without a token, but after a long time: quiet, not instant (the core tells them apart)
    write_trial(run, "d-slow__ddddddd", exception="AgentTimeoutError", reward=0.0, output_tokens=0, agent_seconds=900,
                input_tokens=52000)  # the model answered, then went silent: the timeout is the model's
    # genuine: a real 0, a timeout that produced tokens, a pass
    write_trial(run, "e-zero__eeeeeee", reward=0.0, output_tokens=800, agent_seconds=0.5)
    write_trial(run, "f-timeout__fffffff", exception="AgentTimeoutError", reward=0.0, output_tokens=5000)
    write_trial(run, "g-pass__ggggggg", reward=1.0, output_tokens=1200)
    # interrupted by a cancel: not completed, so not a failure; it did start
    write_trial(run, "h-cancelled__hhhhhhh", exception="CancelledError", output_tokens=None, agent_seconds=0.1)
    # no result yet: the agent is working (content in agent/), or the trial dir is only created
    write_trial(run, "i-working__iiiiiii", result=False, steps=3)
    (write_trial(run, "j-created__jjjjjjj", result=False) / "agent").mkdir()
    write_trial(run, "k-bare__kkkkkkk", result=False)  # no agent/ at all
    (write_trial(run, "l-agent-file__lllllll", result=False) / "agent").write_text("not a dir")
    return run


def from_litellm(result: Path) -> None:
    """Make a trial's exception litellm's, as Harbor records it: the bare class, the package in the message."""
    doc = json.loads(result.read_text())
    name = doc["exception_info"]["exception_type"]
    doc["exception_info"]["exception_message"] = f"litellm.{name}: Hosted_vllmException - request rejected"
    result.write_text(json.dumps(doc))


QUIET = (  # an unknown class (APIConnectionError) is infra like DaytonaError; litellm's BadRequestError the model's
    QuietFailure(exception_type="APIConnectionError", kind=ErrorKind.INFRA, agent_seconds=0.5, reward=None,
                 task="a-conn"),
    QuietFailure(exception_type="BadRequestError", kind=ErrorKind.BENIGN, agent_seconds=0.5, reward=0.0,
                 task="b-bad"),
    QuietFailure(exception_type="DaytonaError", kind=ErrorKind.INFRA, agent_seconds=None, reward=None,
                 task="c-sandbox"),
    QuietFailure(exception_type="AgentTimeoutError", kind=ErrorKind.BENIGN, agent_seconds=900.0, reward=0.0,
                 answered=True, task="d-slow"),
)
N_STARTED = 9  # the 8 with a result (the cancelled one too) and i-working


def test_quiet_failures_started_trials_and_api_base(tmp_path: Path) -> None:
    build_launch(tmp_path / "r")
    facts = observe(tmp_path)["r"]
    assert facts.unreadable == ""
    assert facts.quiet_failures == QUIET  # in trial name order, each counted as its class says
    assert facts.n_started_trials == N_STARTED
    assert facts.api_base == PINGGY  # the first trial's, not b's internal address
    # the tallies are what they were: reclassifying is the core's, with the EvalRun's threshold
    assert (facts.n_trial_dirs, facts.n_completed, facts.n_scored) == (12, 7, 5)
    assert (facts.n_graded, facts.n_infra_errors, facts.n_benign_errors, facts.n_invalid) == (2, 2, 3, 0)
    assert (facts.reward_sum, facts.n_instant_failures) == (1.0, 0)
    # usage: b, d, e, f, g report output tokens (a's is null, c has none); only e, f and g got any
    assert (facts.n_usage_reported, facts.n_answered) == (5, 3)
    assert facts.tasks == {"a-conn": (1, 0, 0.0), "b-bad": (1, 1, 0.0), "c-sandbox": (1, 0, 0.0),
                           "d-slow": (1, 1, 0.0), "e-zero": (1, 1, 0.0), "f-timeout": (1, 1, 0.0),
                           "g-pass": (1, 1, 1.0)}


def test_the_core_moves_the_instant_ones_to_infra(tmp_path: Path) -> None:
    """The contract with `count_instant_failures`: the slow quiet failure and the genuine zero stay scores."""
    build_launch(tmp_path / "r")
    facts = count_instant_failures(observe(tmp_path)["r"], timedelta(seconds=10))
    assert facts.n_instant_failures == 3
    assert (facts.n_graded, facts.n_infra_errors, facts.n_benign_errors) == (2, 3, 2)
    assert facts.error_breakdown["InstantFailure"] == 3 and facts.error_breakdown["AgentTimeoutError"] == 2
    assert facts.error_breakdown["BadRequestError"] == 0 and facts.error_breakdown["NoModelOutput"] == 0
    assert facts.infra_error_breakdown["InstantFailure"] == 3 == sum(facts.infra_error_breakdown.values()), \
        "the infra breakdown moves with them"
    assert facts.reward_sum == 1.0  # b's 0.0 left the sums; e's and d's genuine zeros stayed
    assert facts.tasks["b-bad"] == (1, 0, 0.0) and facts.tasks["d-slow"] == (1, 1, 0.0), "and its task's tally"


def test_a_bare_bad_request_error_is_infra(tmp_path: Path) -> None:
    """Without litellm named in its message or traceback, a BadRequestError may be the sandbox SDK's: not the
    model's failure, whatever its reward."""
    write_trial(tmp_path / "r", "a__aaaaaaa", exception="BadRequestError", reward=0.0, output_tokens=10)
    write_trial(tmp_path / "r", "b__bbbbbbb", exception="BadRequestError", reward=0.0, output_tokens=10)
    from_litellm(tmp_path / "r" / "b__bbbbbbb" / "result.json")
    facts = observe(tmp_path)["r"]
    assert (facts.n_infra_errors, facts.n_benign_errors, facts.n_graded) == (1, 1, 0)
    assert facts.tasks == {"a": (1, 0, 0.0), "b": (1, 1, 0.0)}


def test_a_graded_trial_without_an_output_token_is_quiet_and_moved_to_no_model_output(tmp_path: Path) -> None:
    """The verifier graded an untouched workspace: listed with no exception and no kind, then infra in the core."""
    write_trial(tmp_path / "r", "a__aaaaaaa", reward=1.0, output_tokens=0, agent_seconds=300)
    write_trial(tmp_path / "r", "b__bbbbbbb", reward=1.0, output_tokens=40)
    write_trial(tmp_path / "r", "c__ccccccc", reward=0.0)  # no usage reported: not known to be silent
    facts = observe(tmp_path)["r"]
    assert facts.quiet_failures == (
        QuietFailure(exception_type=None, kind=None, agent_seconds=300.0, reward=1.0, task="a"),)
    assert (facts.n_graded, facts.reward_sum, facts.n_usage_reported, facts.n_answered) == (3, 2.0, 2, 1)
    moved = count_instant_failures(facts, timedelta(seconds=10))
    assert (moved.n_graded, moved.n_infra_errors, moved.n_instant_failures) == (2, 1, 0)
    assert moved.error_breakdown["NoModelOutput"] == 1 and moved.reward_sum == 1.0
    assert moved.tasks == {"a": (1, 0, 0.0), "b": (1, 1, 1.0), "c": (1, 1, 0.0)}


@pytest.mark.parametrize(("config", "expected"), [
    ({"agent": {"name": "terminus-2", "kwargs": {"api_base": PINGGY}}}, PINGGY),
    ({"agent": {"name": "terminus-2", "base_url": PINGGY}}, PINGGY),  # Harbor's own endpoint override
    ({"agent": {"name": "terminus-2", "kwargs": {"api_base": ""}}}, None),
    ({"agent": {"name": "terminus-2", "kwargs": {}}}, None),
    ({"task": {"path": "tasks/x"}}, None),
])
def test_api_base_of_the_first_trial_config(tmp_path: Path, config: dict[str, Any], expected: str | None) -> None:
    run = tmp_path / "r"
    write_trial(run, "a__aaaaaaa", reward=1.0)
    (run / "a__aaaaaaa" / "config.json").write_text(json.dumps(config))
    write_trial(run, "b__bbbbbbb", reward=1.0, api_base="http://10.0.0.7:8000/v1")  # never the second's
    assert observe(tmp_path)["r"].api_base == expected


def fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def directory(path: Path) -> None:
    path.unlink()
    path.mkdir()


@pytest.mark.parametrize("spoil", [
    lambda p: p.write_bytes(b'{"agent": {"kwargs": {"api_base": "https://'),  # caught half-written
    lambda p: p.write_bytes(b""),
    lambda p: p.write_bytes(b"\xff\xfe"),
    lambda p: p.write_text('{"agent": {"kwargs": ["api_base"]}}'),
    lambda p: p.write_text('{"agent": {"kwargs": {"api_base": 8000}}}'),
    fifo,
    directory,
    lambda p: (p.unlink(), p.symlink_to("/nonexistent")),
    lambda p: os.truncate(p, tree.TRIAL_RESULT_CAP + 1),
], ids=["torn", "empty", "not-utf8", "kwargs-a-list", "api-base-a-number", "fifo", "directory", "dangling",
        "oversize"])
def test_a_bad_first_trial_config_is_no_api_base_not_an_unreadable_dir(tmp_path: Path, spoil: Callable[[Path], object]) -> None:
    """It only feeds the pinggy check: the dir's counts are still data."""
    run = tmp_path / "r"
    write_trial(run, "a__aaaaaaa", reward=1.0, output_tokens=10, api_base=PINGGY)
    write_trial(run, "b__bbbbbbb", reward=0.0, output_tokens=10, api_base=PINGGY)
    spoil(run / "a__aaaaaaa" / "config.json")
    facts = observe(tmp_path)["r"]
    assert (facts.api_base, facts.unreadable, facts.n_completed, facts.n_started_trials) == (None, "", 2, 2)


def test_no_trial_dir_no_api_base(tmp_path: Path) -> None:
    write_meta_env(tmp_path / "r", MODEL="org/m")
    facts = observe(tmp_path)["r"]
    assert (facts.api_base, facts.n_started_trials, facts.quiet_failures) == (None, 0, ())


def result_doc(**fields: object) -> bytes:
    doc: dict[str, Any] = {"task_name": "t", "verifier_result": None, "exception_info": {"exception_type": "X"}}
    return json.dumps(doc | fields).encode()


AGENT_RAN = {"started_at": T0.isoformat(), "finished_at": (T0 + timedelta(seconds=1.25)).isoformat()}


@pytest.mark.parametrize(("fields", "tokens", "seconds"), [
    ({"agent_result": {"n_output_tokens": 7}, "agent_execution": AGENT_RAN}, 7, 1.25),
    ({"agent_result": {"n_output_tokens": None}, "agent_execution": {"started_at": T0.isoformat()}}, None, None),
    ({"agent_result": None, "agent_execution": None}, None, None),
    ({}, None, None),  # older Harbor: neither field
    # multi-step trials record usage and times per step (Harbor's compute_token_cost_totals sums them)
    ({"step_results": [{"step_name": "1", "agent_result": {"n_output_tokens": 3}, "agent_execution": AGENT_RAN},
                       {"step_name": "2", "agent_result": {"n_output_tokens": None}, "agent_execution": AGENT_RAN}]},
     3, 2.5),
    ({"step_results": [{"step_name": "1", "agent_result": None, "agent_execution": None}]}, None, None),
])
def test_trial_outcome_reads_tokens_and_agent_time(fields: dict[str, Any], tokens: int | None, seconds: float | None) -> None:
    outcome = trial_outcome(result_doc(**fields))
    assert (outcome.n_output_tokens, outcome.agent_seconds) == (tokens, seconds)


@pytest.mark.parametrize(("fields", "reason"), [
    ({"agent_result": {"n_output_tokens": "many"}}, "agent_result.n_output_tokens is 'many', not a count"),
    ({"agent_result": {"n_output_tokens": 1.5}}, "agent_result.n_output_tokens is 1.5, not a count"),
    ({"agent_result": {"n_output_tokens": True}}, "agent_result.n_output_tokens is True, not a count"),
    ({"agent_result": {"n_output_tokens": -1}}, "agent_result.n_output_tokens is -1, not a count"),
    ({"agent_result": [1]}, "agent_result is a JSON array, not an object"),
    ({"agent_execution": {"started_at": 1764417600}}, "agent_execution.started_at is 1764417600, not an ISO"),
    ({"agent_execution": {"started_at": T0.isoformat(), "finished_at": "soon"}},
     "agent_execution.finished_at is 'soon', not an ISO"),
    ({"step_results": {"1": {}}}, "step_results is not a list of objects"),
    ({"step_results": [{"agent_result": {"n_output_tokens": "x"}}]},
     "step_results[0].agent_result.n_output_tokens is 'x', not a count"),
])
def test_garbage_in_the_fields_the_rules_read_is_a_format_error(fields: dict[str, Any], reason: str) -> None:
    with pytest.raises(FormatError, match=f"^{re.escape(reason)}"):
        trial_outcome(result_doc(**fields))


def test_an_unlistable_agent_dir_is_not_started_a_transport_error_is_unknown(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    run = tmp_path / "r"
    write_trial(run, "a__aaaaaaa", result=False, steps=2)
    write_trial(run, "b__bbbbbbb", result=False, steps=2)
    (run / "b__bbbbbbb" / "agent" / "trajectory.json").unlink()
    (run / "b__bbbbbbb" / "agent").rmdir()
    os.symlink("agent", run / "b__bbbbbbb" / "agent")  # a symlink loop: ELOOP
    real_scandir = os.scandir

    def denied(path: str) -> object:
        if str(path).endswith("a__aaaaaaa/agent"):
            raise PermissionError(errno.EACCES, "Permission denied", path)
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", denied)
    facts = observe(tmp_path)["r"]
    assert (facts.n_started_trials, facts.unreadable) == (0, "")

    def timing_out(path: str) -> object:
        if str(path).endswith("a__aaaaaaa/agent"):
            raise TimeoutError(errno.ETIMEDOUT, "Connection timed out")
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", timing_out)
    with pytest.raises(ObservationError, match="timed out"):
        observe(tmp_path)


# --------------------------------------------------------------------------- through fsspec


class CountingMemoryFS(MemoryFileSystem):  # type: ignore[misc]
    """The in-memory filesystem, counting `ls` calls (each a round trip over sftp)."""

    listed: list[str]

    def ls(self, path: str, detail: bool = True, **kwargs: object) -> list[Any]:
        self.listed.append(path)
        listed: list[Any] = super().ls(path, detail=detail, **kwargs)
        return listed


@pytest.fixture
def memory_jobs(tmp_path: Path) -> Iterator[tuple[CountingMemoryFS, str]]:
    fs = CountingMemoryFS()
    fs.listed = []
    root = f"/evalrun-launch-test-{uuid.uuid4().hex[:8]}/jobs"
    build_launch(tmp_path / "local" / "r")
    fs.put(str(tmp_path / "local") + "/", root + "/", recursive=True)
    fs.makedirs(f"{root}/r/j-created__jjjjjjj/agent", exist_ok=True)
    yield fs, root
    fs.rm(root.rsplit("/", 1)[0], recursive=True)


def test_through_fsspec_the_same_facts(tmp_path: Path, memory_jobs: tuple[CountingMemoryFS, str]) -> None:
    fs, root = memory_jobs
    local = observe(tmp_path / "local")["r"]
    fs.listed.clear()
    remote = observe(root, fs)["r"]
    assert remote.model_dump(exclude={"path", "last_progress_at"}) == local.model_dump(
        exclude={"path", "last_progress_at"})
    assert (remote.quiet_failures, remote.n_started_trials, remote.api_base) == (QUIET, N_STARTED, PINGGY)
    # one ls per trial without a result whose listing shows an agent/: i-working and j-created, not k or l
    assert sorted(p for p in fs.listed if p.endswith("/agent")) == [
        f"{root}/r/i-working__iiiiiii/agent", f"{root}/r/j-created__jjjjjjj/agent"]


def test_through_a_local_fsspec_tree_the_same_facts(tmp_path: Path) -> None:
    build_launch(tmp_path / "jobs" / "r")
    via_fs = observe(tmp_path / "jobs", LocalFileSystem())["r"]
    assert via_fs.model_dump(exclude={"last_progress_at"}) == observe(tmp_path / "jobs")["r"].model_dump(
        exclude={"last_progress_at"})


class AgentLsFailingFS(CountingMemoryFS):
    error: OSError | None

    def ls(self, path: str, detail: bool = True, **kwargs: object) -> list[Any]:
        if self.error is not None and path.endswith("i-working__iiiiiii/agent"):
            raise self.error
        listed: list[Any] = super().ls(path, detail=detail, **kwargs)
        return listed


@pytest.mark.parametrize(("error", "outcome"), [
    (PermissionError(errno.EACCES, "Permission denied"), "not started"),
    (FileNotFoundError(errno.ENOENT, "gone since the listing"), "not started"),
    (OSError("Socket is closed"), "unknown"),  # paramiko's dropped channel
])
def test_through_fsspec_an_agent_dir_that_cannot_be_listed(tmp_path: Path, error: OSError, outcome: str) -> None:
    fs = AgentLsFailingFS()
    fs.listed, fs.error = [], error
    root = f"/evalrun-launch-test-{uuid.uuid4().hex[:8]}/jobs"
    build_launch(tmp_path / "local" / "r")
    fs.put(str(tmp_path / "local") + "/", root + "/", recursive=True)
    try:
        if outcome == "unknown":
            with pytest.raises(ObservationError, match="Socket is closed"):
                observe(root, fs)
        else:
            facts = observe(root, fs)["r"]
            assert (facts.n_started_trials, facts.unreadable) == (N_STARTED - 1, "")
    finally:
        fs.error = None
        fs.rm(root.rsplit("/", 1)[0], recursive=True)


def test_through_fsspec_a_bad_first_trial_config_is_no_api_base(memory_jobs: tuple[CountingMemoryFS, str]) -> None:
    fs, root = memory_jobs
    fs.pipe_file(f"{root}/r/a-conn__aaaaaaa/config.json", b"")  # over sftp, what a FIFO looks like
    facts = observe(root, fs)["r"]
    assert (facts.api_base, facts.unreadable, facts.quiet_failures) == (None, "", QUIET)


# --------------------------------------------------------------------------- the memo's later passes



def test_a_later_pass_keeps_what_the_memo_parsed(tmp_path: Path, reads: list[str]) -> None:
    """The remembered trial outcomes carry tokens and agent time; started trials are counted anew each pass."""
    run = build_launch(tmp_path / "jobs" / "r")
    first = observe(tmp_path / "jobs")["r"]
    reads.clear()
    write_trial(run, "k-bare__kkkkkkk", result=False, steps=1)  # its agent starts working
    again = observe(tmp_path / "jobs")["r"]

    running = {"i-working__iiiiiii", "j-created__jjjjjjj", "k-bare__kkkkkkk", "l-agent-file__lllllll"}
    probed = {Path(p).parent.name for p in reads if p.endswith("/result.json") and "__" in p}
    assert probed == running, "every trial result is recalled; only the running trials are looked at for one"
    assert again.quiet_failures == first.quiet_failures == QUIET
    assert (first.n_started_trials, again.n_started_trials) == (N_STARTED, N_STARTED + 1)
    assert again.api_base == PINGGY


def test_a_finished_dir_is_kept_whole(tmp_path: Path, reads: list[str]) -> None:
    build_launch(tmp_path / "jobs" / "r", finished=True)
    first = observe(tmp_path / "jobs")["r"]
    reads.clear()
    again = observe(tmp_path / "jobs")["r"]
    assert reads == [] and again == first
    assert (again.quiet_failures, again.n_started_trials, again.api_base) == (QUIET, N_STARTED, PINGGY)


STEP_FAILED = {"exception_type": "SandboxBuildFailedError", "exception_message": "build failed",
               "exception_traceback": "Traceback ...", "occurred_at": T0.isoformat()}


@pytest.mark.parametrize(("fields", "exception_type", "steps"), [
    ({"exception_info": {"exception_message": "lost"}}, "UnnamedException", ()),  # a class nobody named: infra
    ({"exception_info": {"exception_type": " "}}, "UnnamedException", ()),
    ({"exception_info": {}}, "UnnamedException", ()),
    # Harbor 0.26 multi-step: the step's failure is on the step, the trial's exception_info null
    ({"exception_info": None, "step_results": [{"step_name": "1", "exception_info": None},
                                               {"step_name": "2", "exception_info": STEP_FAILED}]},
     None, (("SandboxBuildFailedError", None),)),
    ({"step_results": [{"step_name": "1", "exception_info": {"exception_type": ""}}]},
     "X", (("UnnamedException", None),)),
])
def test_trial_outcome_reads_every_recorded_exception(fields: dict[str, Any], exception_type: str | None,
                                                      steps: tuple[tuple[str, str | None], ...]) -> None:
    outcome = trial_outcome(result_doc(**fields))
    assert (outcome.exception_type, outcome.step_exceptions) == (exception_type, steps)


@pytest.mark.parametrize(("fields", "ran"), [
    ({}, False),
    ({"agent_result": None, "agent_execution": None}, False),
    ({"agent_execution": {"started_at": T0.isoformat()}}, True),
    ({"agent_result": {"n_output_tokens": None}}, True),
    ({"step_results": [{"step_name": "1", "agent_result": {"n_output_tokens": 3}}]}, True),
    ({"step_results": [{"step_name": "1"}]}, False),
])
def test_trial_outcome_says_whether_any_agent_ran(fields: dict[str, Any], ran: bool) -> None:
    assert trial_outcome(result_doc(**fields)).agent_ran is ran
