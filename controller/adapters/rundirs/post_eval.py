"""Post-eval report: always written, even after a kill, so every run has the same histogram and step stats.

`post_eval_report.txt` goes inside the run dir (local, or through an fsspec filesystem such as sftp to the
login node); the returned `PostEvalSummary` is what the caller logs to MLflow and later verifies there
(mean score, ≥1 error bucket, ≥1 step stat).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import posixpath
import secrets
import stat
import statistics
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import NamedTuple, overload

import fsspec
from fsspec import AbstractFileSystem
from fsspec.implementations.local import LocalFileSystem

from controller.adapters.rundirs.harbor_format import FormatError, trial_outcome
from controller.adapters.rundirs.localfs import TRIAL_RESULT, TRIAL_RESULT_CAP, describe, is_trial_dir_name, read_local
from controller.adapters.rundirs.tally import completed
from controller.core.metrics import RunMetrics
from controller.core.observed import RunDirFacts
from controller.core.tracking import Analysis
from controller.core.trial_errors import ErrorClasses, ErrorKind
from controller.core.types import Frozen

REPORT_NAME = "post_eval_report.txt"
TRAJECTORY = os.path.join("agent", "trajectory.json")
TRAJECTORY_POSIX = "agent/trajectory.json"
TRAJECTORY_CAP = 64 << 20  # a long agent run's ATIF trajectory is a few MiB
_CAT_BATCH = 256
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_TMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class TokenStats(Frozen):
    """LLM tokens per trial, over the trajectories that report them (prompt includes cached tokens, as in ATIF)."""

    n_trajectories: int
    prompt_mean: float
    completion_mean: float
    total_mean: float
    total_median: float
    total_max: int


class StepStats(Frozen):
    n_trajectories: int
    mean: float
    median: float
    max: int
    tokens: TokenStats | None = None


class _Trajectory(NamedTuple):
    """What one `agent/trajectory.json` contributes: its step count and, when reported, its token counts."""

    steps: int
    tokens: tuple[int, int] | None  # (prompt, completion)


class PostEvalSummary(Frozen):
    run_tag: str
    mean_score: float | None
    score_stderr: float | None
    n_valid: int
    n_scored: int
    n_completed: int
    n_total: int | None
    error_histogram: dict[str, int]
    steps: StepStats | None


@overload
def write_post_eval_report(
    run_dir_path: str | os.PathLike[str], facts: RunDirFacts, errors: ErrorClasses, metrics: RunMetrics,
    fs: None = None,
) -> tuple[Path, PostEvalSummary]: ...


@overload
def write_post_eval_report(
    run_dir_path: str | os.PathLike[str], facts: RunDirFacts, errors: ErrorClasses, metrics: RunMetrics,
    fs: AbstractFileSystem,
) -> tuple[PurePosixPath, PostEvalSummary]: ...


def write_post_eval_report(
    run_dir_path: str | os.PathLike[str], facts: RunDirFacts, errors: ErrorClasses, metrics: RunMetrics,
    fs: AbstractFileSystem | None = None,
) -> tuple[Path | PurePosixPath, PostEvalSummary]:
    """Write `post_eval_report.txt` in the run dir; safe to repeat (the file is replaced).

    Locally nothing the job planted in or as the run dir is written through: a run dir that is a symlink is
    refused, the temporary file is a new one of a random name, and the rename replaces whatever entry has the
    report's name (see `_replace_in_dir`). A refusal or failure is an OSError naming the path and why.

    The run dir is local unless `fs` is given (e.g. sftp to the login node: the path is then on that host) or
    the path is an fsspec URL. Local: returns the report's `Path`; through a filesystem: its `PurePosixPath`
    there (the URL's path part for a URL).
    """
    if fs is None and "://" in os.fspath(run_dir_path):
        fs, root = fsspec.core.url_to_fs(os.fspath(run_dir_path))
        if isinstance(fs, LocalFileSystem):
            fs, run_dir_path = None, root
    if fs is None:
        run_dir = Path(run_dir_path)
        dir_fd = _open_run_dir(run_dir)  # refused (a symlink, not a dir) before anything is computed or written
        try:
            summary = _summary(facts, errors, metrics, step_stats(run_dir, errors, more=facts.shards[1:]))
            _replace_in_dir(dir_fd, run_dir, render(summary, facts, errors).encode())
        finally:
            os.close(dir_fd)
        return run_dir / REPORT_NAME, summary
    # Through fsspec (sftp) the write stays by path, without the local checks: `pipe_file` opens the fixed
    # temp name for writing on the far side (the sftp server's open follows a symlink planted there, and a
    # symlinked run dir), then `mv` posix-renames it (atomic over an older report; a rename replaces a
    # symlink at the report name, it does not follow it). The remote side therefore relies on the sftp account
    # having no more rights than the job that writes the run dir (the same user, as when a job runs under the
    # operator's cluster account: a symlink then reaches nothing the job could not write itself), or on other
    # tenants' jobs being unable to write our run dirs. sftp offers no O_NOFOLLOW or dir fd to do better.
    remote = fs._strip_protocol(os.fspath(run_dir_path)).rstrip("/")
    summary = _summary(facts, errors, metrics, step_stats(remote, errors, fs, more=facts.shards[1:]))
    target = f"{remote}/{REPORT_NAME}"
    tmp_name = f"{remote}/.{REPORT_NAME}.tmp"
    fs.pipe_file(tmp_name, render(summary, facts, errors).encode())
    fs.mv(tmp_name, target)  # sftp: posix-rename, atomic over an older report
    return PurePosixPath(target), summary


def _refused(exc: OSError, path: str | os.PathLike[str], why: str) -> OSError:
    """The same errno (so the same OSError subclass), the path and a message saying what was refused."""
    return OSError(exc.errno, f"post-eval report not written: {why}", os.fspath(path))


def _open_run_dir(run_dir: Path) -> int:
    """An fd of the run dir itself: O_NOFOLLOW refuses a run dir that is (or was replaced by) a symlink, so
    nothing is ever written through it into a directory of someone else's."""
    try:
        return os.open(run_dir, _DIR_FLAGS)
    except OSError as exc:
        why = describe(exc)
        if exc.errno in (errno.ENOTDIR, errno.ELOOP):  # O_NOFOLLOW on a symlink: ELOOP, or ENOTDIR (O_DIRECTORY)
            try:
                why = "the run dir is a symlink" if stat.S_ISLNK(os.lstat(run_dir).st_mode) else why
            except OSError:
                pass
        raise _refused(exc, run_dir, why) from exc


def _replace_in_dir(dir_fd: int, run_dir: Path, data: bytes) -> None:
    """Write `data` to a new file of a fresh random name in the dir of `dir_fd`, fsync it, and rename it over
    `REPORT_NAME` there; every step is relative to `dir_fd`, never by a path the job could redirect.

    O_CREAT|O_EXCL|O_NOFOLLOW: the temp file is one we created now, never an entry planted there (a symlink,
    a FIFO, a hard link to a file of ours); its random name cannot be taken in advance. rename(2) replaces the
    entry `REPORT_NAME` (a symlink, a FIFO, a hard link, an older report) without opening or following it. On
    any failure the temp file is removed and an OSError naming what failed is raised."""
    tmp = f".{REPORT_NAME}.{secrets.token_hex(8)}.tmp"
    try:
        fd = os.open(tmp, _TMP_FLAGS, 0o666, dir_fd=dir_fd)  # 0o666 & ~umask, as Path.write_text made it
    except OSError as exc:
        raise _refused(exc, run_dir / tmp, f"cannot create its temporary file: {describe(exc)}") from exc
    try:
        try:
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, REPORT_NAME, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)  # unlink removes the entry; it follows nothing
        raise _refused(exc, run_dir / REPORT_NAME, describe(exc)) from exc


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _summary(facts: RunDirFacts, errors: ErrorClasses, computed: RunMetrics, steps: StepStats | None) -> PostEvalSummary:
    values = {m.name: m.value for m in computed.metrics}
    return PostEvalSummary(
        run_tag=facts.run_tag,
        mean_score=values["accuracy"],
        score_stderr=values["accuracy_stderr"],
        n_valid=computed.stats.n_trials,
        n_scored=facts.n_scored,
        n_completed=facts.n_completed,
        n_total=facts.n_total,
        error_histogram=errors.breakdown(facts.error_breakdown),
        steps=steps,
    )


def step_stats(run_dir: str | os.PathLike[str], errors: ErrorClasses, fs: AbstractFileSystem | None = None,
               more: Sequence[str] = ()) -> StepStats | None:
    """Steps (and LLM tokens) per trial from `agent/trajectory.json` (ATIF, or a bare step list); bad files are
    skipped. Tokens come from ATIF `final_metrics`, else from the sum of the steps' `metrics`.

    Only the trials the tally counts as completed are described, as the score and the error buckets are: a trial
    with a readable result.json (one killed mid-run has none, and its trajectory stops where it was cut off) that
    no cancel of `errors.interrupted` cut off (a resume runs it again).

    Local run dirs (no `fs`) are read with scandir/open; through `fs` with one listing and batched `cat`s. `more`:
    the other run dirs of a sharded cell's union (RULES §17), read alike.
    """
    trajectories = []
    for path in (os.fspath(run_dir), *more):
        trajectories += (_local_trajectories(path, errors) if fs is None
                         else _fs_trajectories(fs, fs._strip_protocol(path).rstrip("/"), errors))
    if not trajectories:
        return None
    counts = [t.steps for t in trajectories]
    return StepStats(
        n_trajectories=len(counts), mean=statistics.fmean(counts), median=statistics.median(counts), max=max(counts),
        tokens=_token_stats([t.tokens for t in trajectories if t.tokens is not None]),
    )


def _token_stats(tokens: list[tuple[int, int]]) -> TokenStats | None:
    if not tokens:
        return None
    totals = [prompt + completion for prompt, completion in tokens]
    return TokenStats(
        n_trajectories=len(tokens), prompt_mean=statistics.fmean(p for p, _ in tokens),
        completion_mean=statistics.fmean(c for _, c in tokens), total_mean=statistics.fmean(totals),
        total_median=statistics.median(totals), total_max=max(totals),
    )


def _local_trajectories(run_dir: str, errors: ErrorClasses) -> list[_Trajectory]:
    with os.scandir(run_dir) as entries:
        trial_dirs = [e.path for e in entries if is_trial_dir_name(e.name) and e.is_dir()]
    found = (_read_trajectory(os.path.join(trial_dir, TRAJECTORY)) for trial_dir in trial_dirs
             if _completed(_read_capped(os.path.join(trial_dir, TRIAL_RESULT), TRIAL_RESULT_CAP), errors))
    return [t for t in found if t is not None]


def _fs_trajectories(fs: AbstractFileSystem, run_dir: str, errors: ErrorClasses) -> list[_Trajectory]:
    entries = fs.ls(run_dir, detail=True)  # a missing run dir raises, as scandir does locally
    trial_dirs = sorted(
        name for e in entries
        if e.get("type") == "directory" and is_trial_dir_name(name := posixpath.basename(e["name"].rstrip("/")))
    )
    found: list[_Trajectory] = []
    for start in range(0, len(trial_dirs), _CAT_BATCH):
        batch = trial_dirs[start : start + _CAT_BATCH]
        # per-file errors (a trial with no result or trajectory) come back as values; cap + 1 bytes tells an
        # oversize file; a result is matched to its trial by its parent dir, whatever order `cat` answers in
        results = fs.cat([f"{run_dir}/{name}/{TRIAL_RESULT}" for name in batch], on_error="return",
                         end=TRIAL_RESULT_CAP + 1)
        done = [posixpath.dirname(path) for path, data in results.items()
                if _completed(_capped(data, TRIAL_RESULT_CAP), errors)]
        got = fs.cat([f"{trial}/{TRAJECTORY_POSIX}" for trial in done], on_error="return",
                     end=TRAJECTORY_CAP + 1) if done else {}
        for data in got.values():
            trajectory = _parse_trajectory(capped) if (capped := _capped(data, TRAJECTORY_CAP)) is not None else None
            if trajectory is not None:
                found.append(trajectory)
    return found


def _capped(data: object, cap: int) -> bytes | None:
    """What `cat` read, when it is a file's whole content (not an error, not over `cap`)."""
    return data if isinstance(data, bytes) and len(data) <= cap else None


def _completed(result: bytes | None, errors: ErrorClasses) -> bool:
    """Whether the trial of this result.json is one the tally counts as completed (`tally.completed`)."""
    if result is None:
        return False
    try:
        outcome = trial_outcome(result)
    except FormatError:
        return False
    return completed(outcome, errors)


def _read_trajectory(path: str) -> _Trajectory | None:
    data = _read_capped(path, TRAJECTORY_CAP)
    return None if data is None else _parse_trajectory(data)


def _read_capped(path: str, cap: int) -> bytes | None:
    """A regular file's content; None when it is absent, unreadable or over `cap`."""
    try:
        data, _ = read_local(path, cap)  # a FIFO or /dev/zero there must not hang or fill memory
    except OSError:
        return None
    return data if isinstance(data, bytes) else None


def _parse_trajectory(data: bytes) -> _Trajectory | None:
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):  # RecursionError: nested too deeply
        return None
    steps = doc.get("steps") if isinstance(doc, dict) else doc
    if not isinstance(steps, list):
        return None
    final = doc.get("final_metrics") if isinstance(doc, dict) else None
    tokens = _token_pair(final, "total_prompt_tokens", "total_completion_tokens") if isinstance(final, dict) else None
    if tokens is None:
        per_step = [_token_pair(step.get("metrics"), "prompt_tokens", "completion_tokens")
                    for step in steps if isinstance(step, dict)]
        reported = [pair for pair in per_step if pair is not None]
        tokens = (sum(p for p, _ in reported), sum(c for _, c in reported)) if reported else None
    return _Trajectory(len(steps), tokens)


def _token_pair(metrics: object, prompt_key: str, completion_key: str) -> tuple[int, int] | None:
    """(prompt, completion) when at least one is a non-negative integer; a missing one counts as 0."""
    if not isinstance(metrics, dict):
        return None
    pair = [metrics.get(prompt_key), metrics.get(completion_key)]
    counts = [v if type(v) is int and v >= 0 else None for v in pair]  # bool is no count; neither is -1
    if counts == [None, None]:
        return None
    return counts[0] or 0, counts[1] or 0


def render(summary: PostEvalSummary, facts: RunDirFacts, errors: ErrorClasses) -> str:
    score = "none (nothing valid to score)" if summary.mean_score is None else f"{summary.mean_score:.4f}"
    stderr = "" if summary.score_stderr is None else f" ± {summary.score_stderr:.4f}"
    total = "?" if summary.n_total is None else str(summary.n_total)
    lines = [
        f"post-eval report: {facts.run_tag}",
        f"model: {facts.model or '?'}  benchmark: {facts.benchmark_name or '?'}  agent: {facts.agent or '?'}",
        f"mean score: {score}{stderr} over {summary.n_valid} valid trials",
        (f"with a reward: {summary.n_scored} / {total} total "
         f"(completed {summary.n_completed}, trial dirs {facts.n_trial_dirs})"),
        f"trials: graded {facts.n_graded}  model failures {facts.n_benign_errors}  infra {facts.n_infra_errors}"
        f"  invalid {facts.n_invalid}",
    ]
    width = max(map(len, summary.error_histogram), default=0)
    for name, count in summary.error_histogram.items():
        for kind, trials in _by_kind(name, count, facts, errors):
            lines.append(f"  {kind:<6}  {name:<{width}}  {trials}")
    if summary.steps is None:
        lines.append("steps per trial: no readable agent/trajectory.json")
    else:
        s = summary.steps
        lines.append(
            f"steps per trial (n={s.n_trajectories}): mean {s.mean:.2f}  median {s.median:g}  max {s.max}"
        )
        t = s.tokens
        lines.append("tokens per trial: not reported by the trajectories" if t is None else
                     f"tokens per trial (n={t.n_trajectories}): mean {t.total_mean:.1f} (prompt {t.prompt_mean:.1f}, "
                     f"completion {t.completion_mean:.1f})  median {t.total_median:g}  max {t.total_max}")
    return "\n".join(lines) + "\n"


def _by_kind(name: str, count: int, facts: RunDirFacts, errors: ErrorClasses) -> list[tuple[str, int]]:
    """A class's trials by how the tally counted each (`facts.infra_error_breakdown` holds its infra ones): a class
    the model's failures share by name (an ungraded AgentTimeoutError, a BadRequestError not from litellm) has a
    benign line, and an infra line when some of its trials were infra; every other class, known or not, is infra."""
    model = {known.rsplit(".", 1)[-1] for known in errors.benign | errors.benign_with_reward}
    if name not in model:
        return [(ErrorKind.INFRA.value, count)]
    infra = facts.infra_error_breakdown.get(name, 0)
    return [(ErrorKind.BENIGN.value, count - infra)] + ([(ErrorKind.INFRA.value, infra)] if infra else [])


def post_eval_analysis(summary: PostEvalSummary, facts: RunDirFacts, errors: ErrorClasses) -> Analysis:
    """The report as the tracker logs it: its text, and the step statistics as metrics."""
    return Analysis(report=render(summary, facts, errors), step_stats=step_metrics(summary.steps))


def step_metrics(steps: StepStats | None) -> dict[str, float]:
    """Step (and token) statistics under the names MLflow logs them by; empty without trajectories."""
    stats = {} if steps is None else {"n_trajectories": float(steps.n_trajectories), "steps_mean": steps.mean,
                                      "steps_median": steps.median, "steps_max": float(steps.max)}
    if steps is not None and (tokens := steps.tokens) is not None:
        stats |= {"tokens_n_trajectories": float(tokens.n_trajectories), "tokens_prompt_mean": tokens.prompt_mean,
                  "tokens_completion_mean": tokens.completion_mean, "tokens_mean": tokens.total_mean,
                  "tokens_median": tokens.total_median, "tokens_max": float(tokens.total_max)}
    return stats
