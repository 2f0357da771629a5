"""The SLURM backend: sbatch / squeue / sacct / scancel, run here or on a login node over ssh.

Observation is ONE `squeue` (the live queue, with time left) and ONE `sacct` (where jobs that left
the queue are found) per pass, both with explicit formats and `|`-separated fields, filtered to our
user server-side and to our job-name prefix here. A command that fails or times out raises
`ObservationError`: the core makes the cluster's cells Unknown, it never reads that as "no jobs".

Times are printed in UTC (`TZ=UTC` in the commands' environment) so a login node in another time
zone cannot shift submit or start times. Secrets reach `sbatch` in its environment (`--export=ALL`, the
submitter's own minus its secrets: see commands.py), never on the command line. Free text read back (a failed job's
tail, squeue/sacct reasons, error lines) is masked as it is read (adapters/secrets.py).

Running jobs' output is ONE `sh` script per pass over every cursor (`READ_SCRIPT`): for each file a header
line `#<index> <start>`, then the bytes from `start` base64-encoded. base64 keeps the bytes intact through a
runner that decodes text (ssh replaces bad UTF-8), and its alphabet has no `#`, so nothing a job prints can
pass for a header.
"""

from __future__ import annotations

import base64
import binascii
import itertools
import logging
import re
import time
from collections.abc import Sequence

from controller.adapters.scheduler.commands import (
    ANSWER_CAP,
    CommandFailed,
    CommandResult,
    CommandRunner,
)
from controller.adapters.scheduler.output import TAIL_BYTES, failure_tail, job_output
from controller.adapters.scheduler.slurm_parse import (
    SACCT_FIELDS,
    SQUEUE_FORMAT,
    job_order,
    merge,
    parse_sacct_line,
    parse_squeue_line,
    split_tail_output,
)
from controller.adapters.secrets import SecretMask, masking_errors
from controller.core.hostlist import HostlistError, expand
from controller.core.observed import JobOutput, JobState, ObservedJob
from controller.core.ports import OUTPUT_READ_CAP, ObservationError, OutputCursor, SubmitRequest
from controller.core.types import Frozen

log = logging.getLogger("evalctl.slurm")

UTC_ENV = {"TZ": "UTC", "SLURM_TIME_FORMAT": "standard"}
ACCOUNTING_WINDOW = "now-14days"
NODES_FRESH_S = 60.0  # how long one `sinfo` answer serves (a pass, and the submissions it makes)
UNUSABLE_STATES = ("down", "drain", "drng", "fail", "maint", "inval", "unk", "futr", "plnd", "pow")  # sinfo %t

# Positional arguments: the cap, then (offset, path) pairs. ONE `stat` sizes every file (a missing or non-regular
# one is asked as /dev/null, so sizes and files pair up; any mismatch exits 3 rather than guess), then only files
# that grew are read, each by one `dd | base64`: a process per file is what a pass costs, so idle ones cost none.
# Non-regular files (a FIFO would block a read) are left out like missing ones; an unreadable one is reported
# (`!<index>`); a file shorter than its offset is read from 0 (rotated or truncated). A missing tool fails the
# whole read, rather than reading as "no output".
# cursors per read command: each answers at most OUTPUT_READ_CAP bytes, base64 (4/3) and a header, so one command's
# answer stays under the runner's cap (commands.ANSWER_CAP) however many jobs run
OUTPUT_BATCH = ANSWER_CAP // (OUTPUT_READ_CAP * 4 // 3 + (4 << 10))
READ_MARKER = "@read-output"  # the script's first line: whatever a login shell printed before it is not output
READ_SCRIPT = r"""
printf '%s\n' '@read-output'
for tool in stat dd base64 xargs; do
  command -v "$tool" >/dev/null 2>&1 || { echo "$tool not found on PATH" >&2; exit 127; }
done
cap=$1; shift
n=0
for arg; do
  n=$((n + 1))
  if [ $((n % 2)) -eq 0 ]; then
    if [ -f "$arg" ]; then printf '%s\0' "$arg"; else printf '/dev/null\0'; fi
  fi
done | xargs -0 stat -L -c '%s %F' -- | {
  i=0
  while [ "$#" -ge 2 ]; do
    offset=$1; file=$2; shift 2
    IFS=' ' read -r size kind || exit 3
    case $kind in
      regular*)
        if [ ! -r "$file" ]; then
          printf '!%s\n' "$i"
        else
          [ "$size" -ge "$offset" ] || offset=0
          printf '#%s %s\n' "$i" "$offset"
          if [ "$size" -gt "$offset" ]; then
            dd if="$file" iflag=skip_bytes,count_bytes,nonblock skip="$offset" count="$cap" bs=65536 status=none \
              | base64 || exit 1
          fi
        fi ;;
    esac
    i=$((i + 1))
  done
  ! read -r extra || exit 3
}
"""

# scancel's answers for a job that is already over: cancelling it again is a no-op, not an error
ALREADY_OVER = re.compile(r"Invalid job id specified|already completing or completed|Job has already finished",
                          re.IGNORECASE)


class SlurmOptions(Frozen):
    """The EvalCluster's sbatch options."""

    partition: str | None = None
    account: str | None = None
    reservation: str | None = None
    qos: str | None = None
    gpus_per_job: int = 0
    command_timeout_s: float = 30.0


class SlurmScheduler:
    def __init__(self, commands: CommandRunner, options: SlurmOptions, logs_dir: str, user: str | None = None,
                 mask: SecretMask | None = None):
        self.commands, self.options, self.logs_dir = commands, options, logs_dir
        self.mask = mask or SecretMask()
        self._user = user
        self._logs_dir_made = False
        self._nodes: tuple[float, tuple[str, ...], tuple[str, ...]] | None = None  # (when, all, usable) by sinfo

    # ------------------------------------------------------------------ observe

    def observe(self) -> tuple[ObservedJob, ...]:
        queue = self._squeue(["--user", self.user])
        accounting = self._sacct(["--user", self.user, "--starttime", ACCOUNTING_WINDOW])
        return self._with_log_tails(merge(queue, accounting))

    def find(self, name: str) -> ObservedJob | None:
        """Both sources, by exact name: a pending job is only in squeue, an ended one only in sacct."""
        queue = self._squeue(["--user", self.user, "--name", name])
        accounting = self._sacct(["--user", self.user, "--name", name, "--starttime", ACCOUNTING_WINDOW])
        jobs = [job for job in merge(queue, accounting) if job.name == name]
        return max(jobs, key=job_order, default=None)

    @property
    def user(self) -> str:
        """The SLURM login user (asked once: over ssh it is the remote account, not ours)."""
        if self._user is None:
            self._user = _last_line(self._read(["id", "-un"], "id").stdout)
        return self._user

    def _squeue(self, filters: list[str]) -> list[ObservedJob]:
        out = self._read(["squeue", "--noheader", "--array", "--states=all", f"--format={SQUEUE_FORMAT}", *filters],
                         "squeue")
        return [self._masked(job) for line in out.stdout.splitlines() if (job := parse_squeue_line(line)) is not None]

    def _sacct(self, filters: list[str]) -> list[ObservedJob]:
        out = self._read(["sacct", "--noheader", "--parsable2", "--allocations", f"--format={SACCT_FIELDS}",
                          *filters], "sacct")
        return [self._masked(job) for line in out.stdout.splitlines() if (job := parse_sacct_line(line)) is not None]

    def _masked(self, job: ObservedJob) -> ObservedJob:
        """A reason is free text (an admin's hold message, a requeue's cause): masked as it is read, like a tail."""
        return job.model_copy(update={"reason": self.mask.known(job.reason)}) if job.reason else job

    def _read(self, argv: list[str], what: str) -> CommandResult:
        try:
            result = self.commands.run(argv, env=UTC_ENV, timeout=self.options.command_timeout_s)
        except CommandFailed as exc:
            raise ObservationError(f"{what}: {exc}") from exc
        if result.returncode != 0:
            raise ObservationError(f"{what} exited {result.returncode}: {self._error_line(result.stderr)}")
        return result

    def _with_log_tails(self, jobs: list[ObservedJob]) -> tuple[ObservedJob, ...]:
        """A job that failed says why in its output file: its last lines become `log_tail` and the short
        `reason` (one `tail` for all, its last TAIL_BYTES each: an endless progress-bar line stays small)."""
        paths = {self.output_path(job.name, job.job_id): job.job_id for job in jobs
                 if job.state in (JobState.FAILED, JobState.OUT_OF_MEMORY)}
        if not paths:
            return tuple(jobs)
        try:
            result = self.commands.run(["tail", "-v", "-c", str(TAIL_BYTES), "--", *paths], env=UTC_ENV,
                                       timeout=self.options.command_timeout_s)
        except CommandFailed:
            return tuple(jobs)  # the tail is a courtesy; the state is what the rules use
        # Whole file (first line included) only when surely less than tail was asked for: decoding never shrinks
        # bytes, but text mode turns \r\n into \n (halving at worst), and the split takes one newline.
        tails = {paths[path]: failure_tail(text, self.mask, whole=2 * len(text.encode()) < TAIL_BYTES - 2)
                 for path, text in split_tail_output(result.stdout, list(paths)).items()}
        return tuple(job.model_copy(update={"reason": tails[job.job_id][0], "log_tail": tails[job.job_id][1]})
                     if job.job_id in tails else job for job in jobs)

    def read_output(self, cursors: Sequence[OutputCursor]) -> tuple[JobOutput, ...]:
        """Every cursor's output file (`output_path`) read on from its offset: ONE command for all (READ_SCRIPT)."""
        return tuple(output for start in range(0, len(cursors), OUTPUT_BATCH)
                     for output in self._read_outputs(cursors[start : start + OUTPUT_BATCH]))

    def _read_outputs(self, cursors: Sequence[OutputCursor]) -> list[JobOutput]:
        argv = ["sh", "-c", READ_SCRIPT, "read-output", str(OUTPUT_READ_CAP)]
        for cursor in cursors:
            argv += [str(max(cursor.offset, 0)), self.output_path(cursor.name, cursor.job_id)]
        result = self._read(argv, "reading job output")
        with masking_errors(self.mask):  # a read that breaks the frames quotes what it found: a job's bytes
            frames = parse_output_frames(result.stdout, len(cursors))
        outputs = []
        for index, read in sorted(frames.items()):
            cursor = cursors[index]
            if read is None:
                raise ObservationError(f"job output {self.output_path(cursor.name, cursor.job_id)} is not readable")
            outputs.append(job_output(cursor.job_id, *read, OUTPUT_READ_CAP, self.mask))
        return outputs

    # ------------------------------------------------------------------ mutate

    def output_path(self, name: str, job_id: str) -> str:
        """sbatch's `--output=<logs>/%x_%j.out`, expanded."""
        return f"{self.logs_dir}/{name}_{job_id}.out"

    def submit(self, request: SubmitRequest) -> str:
        if not self._logs_dir_made:  # sbatch does not create --output's directory; the job would just fail
            self._run_checked(["mkdir", "-p", self.logs_dir], "mkdir")
            self._logs_dir_made = True
        argv = ["sbatch", "--parsable", f"--job-name={request.name}", f"--comment={request.comment}",
                f"--time={request.time_limit}", f"--output={self.output_path('%x', '%j')}", "--export=ALL",
                *self._placement(), *_exclude(self._known(request.exclude_nodes)), request.script, *request.args]
        try:
            result = self.commands.run(argv, env=request.env, timeout=self.options.command_timeout_s)
        except CommandFailed as exc:
            # sbatch may have queued the job before we lost it: the next pass finds it by name
            raise RuntimeError(f"sbatch did not answer ({exc}); the next pass adopts the job if it was queued") from exc
        job_id = _last_line(result.stdout).split(";")[0]  # the last line: a login shell may print a banner first
        if result.returncode != 0 or not job_id.isdigit():
            raise RuntimeError(f"sbatch failed (exit {result.returncode}): {self._error_line(result.stderr)}")
        return job_id

    def usable_nodes(self) -> tuple[str, ...] | None:
        """The nodes `sinfo` lists for the cluster's partition (every partition when it names none), in its order,
        less those down, drained, failed or in maintenance (they take no job: quarantining the last up node would
        leave every job pending); None when it lists none (cannot tell, never "no nodes")."""
        return self._sinfo()[1] or None

    def _sinfo(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(every node, the usable ones): one `sinfo` serves NODES_FRESH_S, the pass's read and its submissions'
        `--exclude` alike."""
        now = time.monotonic()
        if self._nodes is None or now - self._nodes[0] > NODES_FRESH_S:
            partition = ["--partition", self.options.partition] if self.options.partition else []
            out = self._read(["sinfo", "--noheader", "--Node", "--format=%N %t", *partition], "sinfo").stdout
            states: dict[str, str] = {}
            for line in out.splitlines():
                name, _, state = line.partition(" ")
                if name:
                    states.setdefault(name, state.strip().rstrip("*~#!%$@^-+"))
            usable = tuple(name for name, state in states.items() if not state.startswith(UNUSABLE_STATES))
            self._nodes = (now, tuple(states), usable)
        return self._nodes[1], self._nodes[2]

    def _known(self, nodes: Sequence[str]) -> list[str]:
        """The quarantined nodes to exclude, one name each, that the cluster has: sbatch refuses the whole job for
        a node it does not know (one since removed would block every submission). A hostlist expression a store
        still holds from older versions is expanded: taken literally, it excluded a whole rack or failed the job."""
        names = [name for node in nodes for name in _node_names(node)]
        if not names:
            return []
        try:
            listed = self._sinfo()[0]
        except ObservationError:
            listed = ()
        if not listed:
            return names  # cannot tell: exclude them all, and let sbatch say if one is unknown
        return [name for name in names if name in listed]

    def cancel(self, job_id: str) -> None:
        if not job_id.isdigit():
            raise ValueError(f"not a SLURM job id: {job_id!r}")
        result = self._run_checked(["scancel", job_id], "scancel", ok=ALREADY_OVER)
        if result.returncode != 0:
            log.info("scancel: job already over", extra={"job_id": job_id})

    def _run_checked(self, argv: list[str], what: str, ok: re.Pattern[str] | None = None) -> CommandResult:
        """Run a mutating command; anything but success (or an `ok` answer) is an error for the actor."""
        try:
            result = self.commands.run(argv, env=UTC_ENV, timeout=self.options.command_timeout_s)
        except CommandFailed as exc:
            raise RuntimeError(f"{what}: {exc}") from exc
        if result.returncode != 0 and not (ok is not None and ok.search(result.stderr)):
            raise RuntimeError(f"{what} failed (exit {result.returncode}): {self._error_line(result.stderr)}")
        return result

    def _error_line(self, stderr: str) -> str:
        """SLURM's message is its last stderr line (e.g. `sbatch: error: Invalid qos specification`), masked: over
        ssh it may be what the login shell printed."""
        return self.mask.known(_last_line(stderr)) or "(no message)"

    def _placement(self) -> list[str]:
        o = self.options
        flags = [f"--{flag}={value}" for flag, value in
                 (("partition", o.partition), ("account", o.account), ("reservation", o.reservation), ("qos", o.qos))
                 if value]
        return flags + ([f"--gres=gpu:{o.gpus_per_job}"] if o.gpus_per_job else [])


# ---------------------------------------------------------------------- node names, output frames (pure)


def _node_names(node: str) -> tuple[str, ...]:
    """A quarantined node's names: itself, or every node of a legacy hostlist expression; none for one that does not
    parse (sent to sbatch, it would fail the job)."""
    try:
        return expand(node)
    except HostlistError as exc:
        log.warning("quarantined node name not understood; not excluded", extra={"node": node, "error": str(exc)})
        return ()


def _exclude(nodes: Sequence[str]) -> list[str]:
    """`--exclude=a,b` for the cluster's quarantined nodes, one name each."""
    names = [node for node in dict.fromkeys(n.strip() for n in nodes) if node]
    return [f"--exclude={','.join(names)}"] if names else []


def parse_output_frames(text: str, count: int) -> dict[int, tuple[int, bytes] | None]:
    """READ_SCRIPT's output → {cursor index: (start, raw bytes)}, or None for a file it could not read.

    What comes before the script's first line (a login banner) is ignored; a missing first line, a header out of
    range or twice, or anything between headers that is not base64 mean the output is not what the script
    prints: an ObservationError, never a guess. Headers are found with `str.find` (a line starting with '#' or
    '!' is never base64), so a backlog of megabytes costs C loops, not a Python loop per line.
    """
    marker = re.search(rf"^{re.escape(READ_MARKER)}$", text, re.MULTILINE)
    if marker is None:
        raise ObservationError("reading job output: the read script printed nothing (is `sh` there?)")
    body = text[marker.end():]  # starts with the marker line's newline: every header follows a "\n"
    starts = [*sorted(_find_all(body, "\n#") + _find_all(body, "\n!")), len(body)]
    if body[:starts[0]].strip():
        raise ObservationError(f"reading job output: unexpected text {body[:starts[0]].strip()[:80]!r}")
    reads: dict[int, tuple[int, bytes] | None] = {}
    for at, after in itertools.pairwise(starts):
        header, _, payload = body[at + 1:after].partition("\n")
        number, _, start = header[1:].partition(" ")
        if not number.isdigit() or int(number) >= count or int(number) in reads or (
                header[0] == "#" and not start.isdigit()) or (header[0] == "!" and payload.strip()):
            raise ObservationError(f"reading job output: unexpected line {header[:80]!r}")
        if header[0] == "!":
            reads[int(number)] = None
            continue
        try:
            raw = base64.b64decode(payload.replace("\n", "").replace("\r", ""), validate=True)
        except binascii.Error as exc:
            raise ObservationError(f"reading job output: the bytes of file {number} are not base64 ({exc})") from exc
        reads[int(number)] = (int(start), raw)
    return reads


def _find_all(text: str, needle: str) -> list[int]:
    found, at = [], text.find(needle)
    while at >= 0:
        found.append(at)
        at = text.find(needle, at + 1)
    return found


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""
