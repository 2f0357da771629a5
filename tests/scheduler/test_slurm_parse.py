"""The SLURM backend's parsing, on text in the exact shapes squeue/sacct print, and its failure modes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

import pytest

from controller.adapters.scheduler.commands import CommandFailed, CommandResult
from controller.adapters.scheduler.output import TAIL_BYTES
from controller.adapters.scheduler.slurm import SlurmOptions, SlurmScheduler
from controller.adapters.scheduler.slurm_parse import (
    SLURM_STATES,
    merge,
    parse_duration,
    parse_sacct_line,
    parse_squeue_line,
    slurm_state,
    split_tail_output,
)
from controller.core.observed import JobState
from controller.core.ports import ObservationError, SubmitRequest


class Scripted:
    """A CommandRunner that answers from a table and records what it was asked (the boundary under test)."""

    def __init__(self, answers: Mapping[str, CommandResult | Exception]):
        self.answers = answers
        self.calls: list[tuple[list[str], dict[str, str]]] = []

    def run(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, timeout: float) -> CommandResult:
        self.calls.append((list(argv), dict(env or {})))
        answer = self.answers[argv[0]]
        if isinstance(answer, Exception):
            raise answer
        return answer


def ok(stdout: str = "", stderr: str = "", returncode: int = 0) -> CommandResult:
    return CommandResult(returncode=returncode, stdout=stdout, stderr=stderr)


def scheduler(runner: Scripted) -> SlurmScheduler:
    return SlurmScheduler(runner, SlurmOptions(partition="debug", qos="high", gpus_per_job=4), logs_dir="/logs",
                          user="alice")


@pytest.mark.parametrize(("text", "state"), [
    ("PENDING", JobState.QUEUED), ("RUNNING", JobState.RUNNING), ("COMPLETING", JobState.RUNNING),
    ("COMPLETED", JobState.COMPLETED), ("FAILED", JobState.FAILED), ("TIMEOUT", JobState.TIMEOUT),
    ("CANCELLED by 0", JobState.CANCELLED), ("CANCELLED+", JobState.CANCELLED), ("NODE_FAIL", JobState.NODE_FAIL),
    ("PREEMPTED", JobState.PREEMPTED), ("OUT_OF_MEMORY", JobState.OUT_OF_MEMORY), ("BOOT_FAIL", JobState.NODE_FAIL),
    ("DEADLINE", JobState.TIMEOUT), ("SUSPENDED", JobState.RUNNING), ("REQUEUED", JobState.QUEUED),
    ("SOMETHING_NEW", JobState.RUNNING),
])
def test_every_slurm_state_maps_and_an_unknown_one_is_never_read_as_over(text: str, state: JobState) -> None:
    assert slurm_state(text) == state


def test_no_slurm_state_maps_to_lost() -> None:
    assert JobState.LOST not in SLURM_STATES.values()


def test_squeue_line_of_a_running_job_has_start_and_time_left() -> None:
    job = parse_squeue_line("41|ev_m__b__a1|RUNNING|2026-11-29T14:15:12|2026-11-29T14:15:20|2026-11-30T16:18:24|1-02:03:04|"
                            "1-06:00:00|gpu[01-02]|None")
    assert job is not None
    assert (job.job_id, job.state, job.time_left_s, job.reason) == ("41", JobState.RUNNING, 93784, "")
    assert job.time_limit_s == 30 * 3600, "the --time it asked for (%l), which status shows"
    assert job.nodes == "gpu[01-02]", "a hostlist is kept as SLURM prints it (--exclude takes it back)"
    assert job.started_at == datetime(2026, 11, 29, 14, 15, 20, tzinfo=UTC) and job.expected_start is None


# What the lab's squeue 22.05 printed (TZ=UTC) for a job sbatch'ed with --begin, and for one with --hold.
PENDING_WITH_START = ("2106|ev_m__b__a1|PENDING|2026-12-03T05:28:28|2026-12-03T07:10:00|2026-12-03T07:15:00|5:00|5:00||"
                      "BeginTime")
PENDING_WITHOUT = "2107|ev_n__b__a1|PENDING|2026-12-03T05:28:28|N/A|N/A|5:00|5:00||JobHeldUser"


def test_squeue_line_of_a_pending_job_has_the_schedulers_expected_start_not_a_start() -> None:
    estimated, unestimated = parse_squeue_line(PENDING_WITH_START), parse_squeue_line(PENDING_WITHOUT)

    assert estimated is not None and unestimated is not None
    assert (estimated.state, estimated.started_at, estimated.expected_start) == (
        JobState.QUEUED, None, datetime(2026, 12, 3, 7, 10, tzinfo=UTC))
    assert (estimated.reason, estimated.nodes, estimated.time_left_s) == ("BeginTime", "", None)
    assert (unestimated.state, unestimated.started_at, unestimated.expected_start) == (JobState.QUEUED, None, None)
    assert unestimated.reason == "JobHeldUser"


@pytest.mark.parametrize("start", ["Unknown", ""])
def test_a_pending_jobs_start_that_is_no_time_is_no_estimate(start: str) -> None:
    job = parse_squeue_line(f"42|ev_m__b__a1|PENDING|2026-11-29T14:15:12|{start}|N/A|10:00|10:00||Priority")
    assert job is not None and job.expected_start is None and job.started_at is None


def test_a_job_cancelled_while_pending_never_started_whatever_squeue_prints_as_its_start() -> None:
    """squeue shows the cancel time as %S of a job cancelled while pending (sacct: Start None): it never ran."""
    job = parse_squeue_line("27|ev_m__b__a1|CANCELLED|2026-12-03T05:49:18|2026-12-03T05:50:24|2026-12-03T05:50:24|"
                            "0:00|5:00||PartitionDown")
    assert job is not None and job.state == JobState.CANCELLED and job.started_at is None
    assert job.ended_at == datetime(2026, 12, 3, 5, 50, 24, tzinfo=UTC)


def test_squeue_line_of_a_job_that_just_ended_is_over_with_its_end_time() -> None:
    """squeue --states=all still lists it while accounting may not have it yet."""
    job = parse_squeue_line("44|ev_m__b__a1|CANCELLED|2026-11-29T14:15:12|2026-11-29T14:15:13|2026-11-29T14:16:00|"
                            "0:00|10:00|vm|None")
    assert job is not None and job.state == JobState.CANCELLED and job.time_left_s is None
    assert job.ended_at == datetime(2026, 11, 29, 14, 16, tzinfo=UTC)


def test_other_peoples_job_names_are_not_ours() -> None:
    assert parse_squeue_line("43|interactive|RUNNING|2026-11-29T14:15:12|N/A|N/A|10:00|10:00|vm|None") is None
    assert parse_sacct_line("43|allocation|COMPLETED|0:0|2026-11-29T14:15:12|Unknown|Unknown|vm|0||None") is None


def test_sacct_line_with_exit_code_and_unknown_times() -> None:
    job = parse_sacct_line("29|ev_t|CANCELLED by 0|0:15|2026-11-29T14:15:35|Unknown|2026-11-29T14:17:00|None assigned|0||None")
    assert job is not None
    assert (job.state, job.exit_code, job.started_at, job.nodes) == (JobState.CANCELLED, 0, None, "")
    assert job.ended_at == datetime(2026, 11, 29, 14, 17, tzinfo=UTC)
    assert parse_sacct_line("29.batch|batch|COMPLETED|0:0|x|x|x|vm|0||None") is None, "steps are not jobs"


@pytest.mark.parametrize(("text", "seconds"), [("59:58", 3598), ("1:00:00", 3600), ("2-00:00:01", 172801),
                                               ("UNLIMITED", None), ("NOT_SET", None), ("INVALID", None)])
def test_time_left(text: str, seconds: int | None) -> None:
    assert parse_duration(text) == seconds


def test_squeue_wins_for_live_jobs_and_sacct_finds_jobs_that_left_the_queue() -> None:
    queued = parse_squeue_line("7|ev_a|RUNNING|2026-11-29T14:00:00|2026-11-29T14:01:00|2026-11-29T14:06:00|5:00|10:00|vm|None")
    lagging = parse_sacct_line("7|ev_a|PENDING|0:0|2026-11-29T14:00:00|Unknown|Unknown|None assigned|0||None")
    ended = parse_sacct_line("6|ev_b|TIMEOUT|0:0|2026-11-29T13:00:00|2026-11-29T13:00:01|2026-11-29T14:00:01|vm|3600|"
                             "billing=1,cpu=1,gres/gpu=4,node=1|None")
    jobs = merge([queued], [lagging, ended])
    assert [(j.job_id, j.state, j.time_left_s) for j in jobs] == [("6", JobState.TIMEOUT, None),
                                                                   ("7", JobState.RUNNING, 300)]
    assert [j.gpu_hours for j in jobs] == [4.0, None], "an hour on 4 GPUs; a job never allocated: not known"


@pytest.mark.parametrize(("elapsed", "tres", "hours"), [
    ("5400", "billing=2,cpu=2,gres/gpu=2,mem=8G,node=1", 3.0),  # 1.5 h × 2 GPUs
    ("7200", "cpu=8,gres/gpu:a100=4,gres/gpu=4,node=1", 8.0),  # typed and untyped: counted once
    ("3600", "cpu=8,gres/gpu:a100=2,node=1", 2.0),  # only typed ones accounted
    ("3600", "billing=1,cpu=1,node=1", 0.0),  # a CPU job: no GPU-hours, and says so
    ("0", "", None),  # pending: nothing allocated yet
])
def test_sacct_gpu_hours_are_elapsed_times_allocated_gpus(elapsed: str, tres: str, hours: float | None) -> None:
    job = parse_sacct_line(f"9|ev_g|COMPLETED|0:0|2026-11-29T13:00:00|2026-11-29T13:00:01|2026-11-29T14:00:01|vm|"
                           f"{elapsed}|{tres}|None")
    assert job is not None and job.gpu_hours == hours


def test_a_running_job_keeps_the_gpu_hours_accounting_says_so_far() -> None:
    queued = parse_squeue_line("7|ev_a|RUNNING|2026-11-29T14:00:00|2026-11-29T14:01:00|2026-11-29T14:06:00|5:00|10:00|vm|None")
    accounted = parse_sacct_line("7|ev_a|RUNNING|0:0|2026-11-29T14:00:00|2026-11-29T14:01:00|Unknown|vm|1800|"
                                 "cpu=1,gres/gpu=2|None")
    [job] = merge([queued], [accounted])
    assert (job.time_left_s, job.gpu_hours) == (300, 1.0)


def test_tail_output_is_split_per_file() -> None:
    text = "==> /logs/a_1.out <==\nstarting\nError: no GPU\n\n==> /logs/b_2.out <==\nKilled\n"
    assert split_tail_output(text, ["/logs/a_1.out", "/logs/b_2.out"]) == {"/logs/a_1.out": "starting\nError: no GPU",
                                                                           "/logs/b_2.out": "Killed"}


def test_a_job_printing_a_tail_header_cannot_claim_an_earlier_jobs_tail() -> None:
    text = ("==> /logs/a_1.out <==\nreal a\n\n==> /logs/b_2.out <==\n==> /logs/a_1.out <==\nforged\n"
            "==> /logs/zzz.out <==\nb goes on\n")
    assert split_tail_output(text, ["/logs/a_1.out", "/logs/b_2.out"]) == {
        "/logs/a_1.out": "real a", "/logs/b_2.out": "==> /logs/a_1.out <==\nforged\n==> /logs/zzz.out <==\nb goes on"}


def test_observe_is_one_squeue_and_one_sacct_filtered_to_our_user_in_utc() -> None:
    runner = Scripted({"squeue": ok("5|ev_a|PENDING|2026-11-29T14:00:00|N/A|N/A|10:00|10:00||Priority\n"),
                       "sacct": ok("4|ev_b|COMPLETED|0:0|2026-11-29T13:00:00|2026-11-29T13:00:01|"
                                   "2026-11-29T13:30:00|vm|1799|cpu=1|None\n")})
    jobs = scheduler(runner).observe()
    assert [j.job_id for j in jobs] == ["4", "5"]
    assert [argv[0] for argv, _ in runner.calls] == ["squeue", "sacct"]
    assert all("--user" in argv and argv[argv.index("--user") + 1] == "alice" for argv, _ in runner.calls)
    assert all(env["TZ"] == "UTC" for _, env in runner.calls)


@pytest.mark.parametrize("failure", [ok(returncode=1, stderr="slurm_load_jobs error: Unable to contact slurm "
                                                             "controller"), CommandFailed("squeue: timed out")])
def test_a_failed_or_timed_out_queue_read_is_unknown_never_empty(failure: CommandResult | Exception) -> None:
    runner = Scripted({"squeue": failure, "sacct": ok("")})
    with pytest.raises(ObservationError, match="squeue"):
        scheduler(runner).observe()


def test_a_failed_job_carries_its_log_tail_with_the_reconcilers_secrets_masked(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EVALCTL_SECRET_PINGGY_A_TOKEN", "tok-12345")
    runner = Scripted({"squeue": ok(""),
                       "sacct": ok("9|ev_c|FAILED|1:0|2026-11-29T13:00:00|2026-11-29T13:00:01|2026-11-29T13:00:02|"
                                   "vm|1|cpu=1|None\n"),
                       "tail": ok("==> /logs/ev_c_9.out <==\npinggy: login with tok-12345 refused\n"
                                  "harbor: command not found\n")})
    [job] = scheduler(runner).observe()
    assert job.reason == "pinggy: login with *** refused | harbor: command not found"
    assert job.log_tail == "pinggy: login with *** refused\nharbor: command not found"
    assert job.nodes == "vm"
    argv = runner.calls[-1][0]
    assert argv[:4] == ["tail", "-v", "-c", str(TAIL_BYTES)] and argv[-1] == "/logs/ev_c_9.out"


def test_submit_puts_secrets_in_the_environment_only_and_the_placement_in_flags() -> None:
    runner = Scripted({"mkdir": ok(), "sbatch": ok("123;evalrun\n")})
    request = SubmitRequest(name="ev_m__b__a1", comment="m|b|fp", script="/s/eval.sbatch",
                            args=("m", "b_ds", "b", "ev_m__b__a1"), env={"EVAL_PINGGY_TOKEN": "tok-SECRET"},
                            logs_dir="/logs", time_limit="01:00:00")
    assert scheduler(runner).submit(request) == "123"
    argv, env = runner.calls[-1]
    assert not any("tok-SECRET" in arg for arg in argv)
    assert env["EVAL_PINGGY_TOKEN"] == "tok-SECRET"
    assert {"--parsable", "--job-name=ev_m__b__a1", "--comment=m|b|fp", "--partition=debug", "--qos=high",
            "--gres=gpu:4", "--time=01:00:00", "--output=/logs/%x_%j.out", "--export=ALL"} <= set(argv)
    assert argv[-5:] == ["/s/eval.sbatch", "m", "b_ds", "b", "ev_m__b__a1"]


def test_a_rejected_submission_is_an_error_with_slurms_message() -> None:
    runner = Scripted({"mkdir": ok(), "sbatch": ok(returncode=1, stderr="sbatch: error: Invalid qos specification")})
    with pytest.raises(RuntimeError, match="Invalid qos"):
        scheduler(runner).submit(SubmitRequest(name="ev_x", comment="k", script="s", args=(), env={},
                                               logs_dir="/logs", time_limit="10"))


def test_cancel_of_a_job_that_already_ended_is_a_no_op_but_other_errors_are_not() -> None:
    scheduler(Scripted({"scancel": ok(returncode=1, stderr="scancel: error: Kill job error on job id 5: "
                                                          "Invalid job id specified")})).cancel("5")
    with pytest.raises(RuntimeError, match="Access/permission denied"):
        scheduler(Scripted({"scancel": ok(returncode=1, stderr="scancel: error: Kill job error on job id 5: "
                                                              "Access/permission denied")})).cancel("5")


def test_an_array_task_named_like_ours_does_not_break_the_pass() -> None:
    array_task = parse_squeue_line("50_3|ev_someones_array|RUNNING|2026-11-29T14:00:00|2026-11-29T14:00:01|N/A|"
                                   "10:00|10:00|vm|None")
    plain = parse_squeue_line("49|ev_a|RUNNING|2026-11-29T14:00:00|2026-11-29T14:00:01|N/A|10:00|10:00|vm|None")
    assert [j.job_id for j in merge([array_task, plain], [])] == ["49", "50_3"]


def test_a_job_accounting_calls_running_but_the_controller_does_not_know_is_lost_not_live() -> None:
    runaway = parse_sacct_line("8|ev_c|RUNNING|0:0|2026-11-20T13:00:00|2026-11-20T13:00:01|Unknown|vm|60|cpu=1|None")
    [job] = merge([], [runaway])
    assert job.state == JobState.LOST and not job.state.active
    assert "runaway" in job.reason
