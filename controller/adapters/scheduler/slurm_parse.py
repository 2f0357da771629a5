"""Reading what squeue, sacct and `tail -v` print (pure): the formats asked for, their lines as observed jobs,
SLURM's states as the core's, and the queue and accounting merged into one view of our jobs.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime

from controller.core.observed import JobState, ObservedJob
from controller.core.types import RUN_TAG_PREFIX

log = logging.getLogger("evalctl.slurm")

# squeue: %i id, %j name, %T state, %V submit, %S start (of a pending job: when it is expected to start, its --begin
# or the backfill scheduler's estimate; N/A while nothing says), %e end, %L time left, %N nodes, %r reason (free
# text, last). `--states=all` also lists jobs that ended within MinJobAge: accounting can lag behind the queue, and
# a job must never drop out of sight between leaving the queue and appearing in sacct.
SQUEUE_FORMAT = "%i|%j|%T|%V|%S|%e|%L|%l|%N|%r"  # Reason last: free text
# ElapsedRaw (seconds) × AllocTRES' gres/gpu=N is a job's GPU-hours; Reason: free text, last
SACCT_FIELDS = "JobID,JobName,State,ExitCode,Submit,Start,End,NodeList,ElapsedRaw,AllocTRES,Reason"
# `gres/gpu=4`; typed ones (`gres/gpu:a100=4`) are listed besides it where the site accounts types, else alone
GPU_TRES = re.compile(r"(?:^|,)gres/gpu=(\d+)")
TYPED_GPU_TRES = re.compile(r"(?:^|,)gres/gpu:[^=,]+=(\d+)")
NO_NODES = frozenset({"", "None assigned", "(null)", "None"})  # what squeue / sacct print before a job has a node

# Every state SLURM 22.05–24.x prints (squeue long names, sacct base names), onto the core's states.
SLURM_STATES: Mapping[str, JobState] = {
    "PENDING": JobState.QUEUED,
    "CONFIGURING": JobState.QUEUED,
    "REQUEUED": JobState.QUEUED,
    "REQUEUE_HOLD": JobState.QUEUED,
    "REQUEUE_FED": JobState.QUEUED,
    "RESV_DEL_HOLD": JobState.QUEUED,
    "SPECIAL_EXIT": JobState.QUEUED,  # held by the controller after an exit the admins marked special
    "RUNNING": JobState.RUNNING,
    "COMPLETING": JobState.RUNNING,  # still cleaning up; its sandboxes may still write
    "STAGE_OUT": JobState.RUNNING,
    "SIGNALING": JobState.RUNNING,
    "RESIZING": JobState.RUNNING,
    "SUSPENDED": JobState.RUNNING,  # paused, not gone: never resubmit under it
    "STOPPED": JobState.RUNNING,
    "COMPLETED": JobState.COMPLETED,
    "FAILED": JobState.FAILED,
    "TIMEOUT": JobState.TIMEOUT,
    "DEADLINE": JobState.TIMEOUT,
    "CANCELLED": JobState.CANCELLED,
    "REVOKED": JobState.CANCELLED,  # a federation sibling started elsewhere
    "NODE_FAIL": JobState.NODE_FAIL,
    "BOOT_FAIL": JobState.NODE_FAIL,
    "PREEMPTED": JobState.PREEMPTED,
    "OUT_OF_MEMORY": JobState.OUT_OF_MEMORY,
}


def parse_squeue_line(line: str) -> ObservedJob | None:
    parts = line.split("|", 9)
    if len(parts) != 10 or not parts[1].startswith(RUN_TAG_PREFIX):
        return None
    job_id, name, state, submit, start, end, left, limit, nodes, reason = parts
    job_state = slurm_state(state)
    queued = job_state == JobState.QUEUED
    never_ran = not job_state.active and not _nodes(nodes)  # cancelled while pending: %S is when it was cancelled
    return ObservedJob(job_id=job_id, name=name, state=job_state, submitted_at=parse_time(submit),
                       started_at=None if queued or never_ran else parse_time(start),
                       expected_start=parse_time(start) if queued else None,
                       ended_at=None if job_state.active else parse_time(end),
                       time_left_s=parse_duration(left) if job_state == JobState.RUNNING else None,
                       time_limit_s=parse_duration(limit), nodes=_nodes(nodes), reason="" if reason in ("None", "") else reason)


def parse_sacct_line(line: str) -> ObservedJob | None:
    parts = line.split("|")
    if len(parts) < 11 or not parts[1].startswith(RUN_TAG_PREFIX) or "." in parts[0]:
        return None
    job_id, name, state, exit_code, submit, start, end, nodes, elapsed, tres = parts[:10]
    reason = "|".join(parts[10:])
    code = exit_code.split(":")[0]
    return ObservedJob(job_id=job_id, name=name, state=slurm_state(state), submitted_at=parse_time(submit),
                       started_at=parse_time(start), ended_at=parse_time(end), nodes=_nodes(nodes),
                       exit_code=int(code) if code.isdigit() else None, reason="" if reason == "None" else reason,
                       gpu_hours=gpu_hours(elapsed, tres))


def gpu_hours(elapsed_raw: str, alloc_tres: str) -> float | None:
    """ElapsedRaw seconds × the GPUs AllocTRES says were allocated (none listed: 0); None before an allocation."""
    if not elapsed_raw.isdigit() or not alloc_tres.strip():
        return None
    untyped = GPU_TRES.search(alloc_tres)
    gpus = int(untyped[1]) if untyped else sum(int(count) for count in TYPED_GPU_TRES.findall(alloc_tres))
    return int(elapsed_raw) * gpus / 3600


def _nodes(text: str) -> str:
    """A NodeList (`vm`, `gpu[01-04]`); '' until the job has one."""
    return "" if text.strip() in NO_NODES else text.strip()


def merge(queue: Iterable[ObservedJob], accounting: Iterable[ObservedJob]) -> list[ObservedJob]:
    """squeue is the truth for a job it lists (it alone has time left); sacct for every job that left it.

    `squeue --states=all` still lists a job for MinJobAge after it ends, so a job sacct calls active
    that squeue does not know at all is one the controller lost (a "runaway" accounting record): it is
    not running, and waiting on it would stall its cell forever.
    """
    jobs = {job.job_id: _runaway(job) if job.state.active else job for job in accounting}
    for job in queue:
        known = jobs.get(job.job_id)
        jobs[job.job_id] = job if known is None else job.model_copy(update={
            "submitted_at": job.submitted_at or known.submitted_at, "nodes": job.nodes or known.nodes,
            "gpu_hours": known.gpu_hours})  # accounting alone knows the allocation
    return sorted(jobs.values(), key=job_order)


def _runaway(job: ObservedJob) -> ObservedJob:
    reason = (f"accounting says {job.state.value} but the controller does not know job {job.job_id} "
              "(a runaway record; see `sacctmgr show runawayjobs`)")
    return job.model_copy(update={"state": JobState.LOST, "reason": reason})


def job_order(job: ObservedJob) -> tuple[int, str]:
    """Submission order; an array task id (`123_4`) sorts by its array's id instead of breaking the sort."""
    head = job.job_id.split("_")[0]
    return (int(head) if head.isdigit() else -1, job.job_id)


def slurm_state(text: str) -> JobState:
    """`CANCELLED by 0` → CANCELLED; an unknown state counts as running: never resubmit under it."""
    word = text.split(" ")[0].rstrip("+").upper()
    state = SLURM_STATES.get(word)
    if state is None:
        log.warning("unknown SLURM state, treating the job as still running", extra={"state": text})
        return JobState.RUNNING
    return state


def parse_time(text: str) -> datetime | None:
    """`2026-11-29T14:15:12` printed under TZ=UTC; `Unknown`, `None`, `N/A` → None."""
    try:
        return datetime.fromisoformat(text).replace(tzinfo=UTC)
    except ValueError:
        return None


def parse_duration(text: str) -> int | None:
    """squeue %L: `[D-]HH:MM:SS`, `MM:SS`; `UNLIMITED`, `NOT_SET`, `INVALID` → None."""
    match = re.fullmatch(r"(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)", text.strip())
    if match is None:
        return None
    days, hours, minutes, seconds = (int(g) if g else 0 for g in match.groups())
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


def split_tail_output(text: str, paths: Sequence[str]) -> dict[str, str]:
    """`tail -v` output (`==> path <==` headers) → {path: its text}.

    tail prints the files in argv order (a missing one only on stderr), so a header counts only when it names
    a path asked for after the current one: a job printing a header line cannot claim an earlier job's tail.
    """
    tails: dict[str, list[str]] = {}
    remaining = list(paths)
    current: list[str] | None = None
    for line in text.split("\n"):
        header = re.fullmatch(r"==> (.*) <==", line)
        if header and header.group(1) in remaining:
            del remaining[:remaining.index(header.group(1)) + 1]
            current = tails.setdefault(header.group(1), [])
        elif current is not None:
            current.append(line)
    # tail separates files with a blank line; the text of each is as printed
    return {path: "\n".join(lines[:-1] if lines and lines[-1] == "" else lines) for path, lines in tails.items()}
