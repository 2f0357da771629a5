"""Post-eval report: always written, even after a kill, so every run has the same histogram and step stats.

`post_eval_report.txt` goes inside the run dir; the returned `PostEvalSummary` is what the caller
logs to MLflow and later verifies there (mean score, ≥1 error bucket, ≥1 step stat).
"""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path

from controller.adapters.rundirs.tree import is_trial_dir_name
from controller.core.errors import ErrorClasses, ErrorKind
from controller.core.metrics import run_metrics
from controller.core.types import Frozen, RunDirFacts

REPORT_NAME = "post_eval_report.txt"
TRAJECTORY = os.path.join("agent", "trajectory.json")


class StepStats(Frozen):
    n_trajectories: int
    mean: float
    median: float
    max: int


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


def write_post_eval_report(
    run_dir_path: str | os.PathLike[str], facts: RunDirFacts, errors: ErrorClasses
) -> tuple[Path, PostEvalSummary]:
    """Write `post_eval_report.txt` in the (local) run dir; safe to repeat (the file is replaced)."""
    run_dir = Path(run_dir_path)
    computed = run_metrics(facts, errors)
    values = {m.name: m.value for m in computed.metrics}
    summary = PostEvalSummary(
        run_tag=facts.run_tag,
        mean_score=values["accuracy"],
        score_stderr=values["accuracy_stderr"],
        n_valid=computed.stats.n_trials,
        n_scored=facts.n_scored,
        n_completed=facts.n_completed,
        n_total=facts.n_total,
        error_histogram=errors.breakdown(facts.error_breakdown),
        steps=step_stats(run_dir),
    )
    path = run_dir / REPORT_NAME
    tmp = path.with_name(f".{REPORT_NAME}.tmp")
    tmp.write_text(render(summary, facts, errors))
    tmp.replace(path)
    return path, summary


def step_stats(run_dir: Path) -> StepStats | None:
    """Steps per trial from `agent/trajectory.json` (ATIF `steps`, or a bare list); bad files are skipped."""
    counts: list[int] = []
    with os.scandir(run_dir) as entries:
        trial_dirs = [e.path for e in entries if is_trial_dir_name(e.name) and e.is_dir()]
    for trial_dir in trial_dirs:
        n_steps = _n_steps(os.path.join(trial_dir, TRAJECTORY))
        if n_steps is not None:
            counts.append(n_steps)
    if not counts:
        return None
    return StepStats(
        n_trajectories=len(counts), mean=statistics.fmean(counts), median=statistics.median(counts), max=max(counts)
    )


def _n_steps(path: str) -> int | None:
    try:
        with open(path, "rb") as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return None
    steps = doc.get("steps") if isinstance(doc, dict) else doc
    return len(steps) if isinstance(steps, list) else None


def render(summary: PostEvalSummary, facts: RunDirFacts, errors: ErrorClasses) -> str:
    score = "none (nothing valid to score)" if summary.mean_score is None else f"{summary.mean_score:.4f}"
    stderr = "" if summary.score_stderr is None else f" ± {summary.score_stderr:.4f}"
    total = "?" if summary.n_total is None else str(summary.n_total)
    lines = [
        f"post-eval report: {facts.run_tag}",
        f"model: {facts.model or '?'}  benchmark: {facts.benchmark_name or '?'}  agent: {facts.agent or '?'}",
        f"mean score: {score}{stderr} over {summary.n_valid} valid trials",
        f"scored: {summary.n_scored} / {total} total "
        f"(completed {summary.n_completed}, trial dirs {facts.n_trial_dirs})",
        f"errors: infra {facts.n_infra_errors}  benign {facts.n_benign_errors}  other {facts.n_other_errors}",
    ]
    width = max(map(len, summary.error_histogram), default=0)
    for name, count in summary.error_histogram.items():
        kind = _kind_label(name, errors)
        lines.append(f"  {kind:<6}  {name:<{width}}  {count}")
    if summary.steps is None:
        lines.append("steps per trial: no readable agent/trajectory.json")
    else:
        s = summary.steps
        lines.append(
            f"steps per trial (n={s.n_trajectories}): mean {s.mean:.2f}  median {s.median:g}  max {s.max}"
        )
    return "\n".join(lines) + "\n"


def _kind_label(name: str, errors: ErrorClasses) -> str:
    if name in errors.infra:
        return ErrorKind.INFRA.value
    return ErrorKind.BENIGN.value if name in errors.benign | errors.benign_with_reward else ErrorKind.OTHER.value
