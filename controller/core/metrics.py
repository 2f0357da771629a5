"""What gets uploaded for one run dir: metrics as a LIST of {name, value} and the stats dict.

Pure. Valid trials are the completed ones minus infra errors (not the model's fault); an errored
valid trial without a reward scores 0. A value of None means "could not be computed" and the
caller must treat it as a failed analysis, never as a score.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from datetime import datetime

from controller.core.ports import ResultUpload
from controller.core.trial_errors import ErrorClasses
from controller.core.types import Frozen, Metric, RunDirFacts


class UploadStats(Frozen):
    """`sandbox_jobs.stats` as the dashboards read it; every known class present so rows stay comparable."""

    n_trials: int
    n_infra_errors: int
    infra_error_breakdown: dict[str, int]
    n_errors_by_class: dict[str, int]


class RunMetrics(Frozen):
    metrics: tuple[Metric, ...]
    stats: UploadStats

    @property
    def score(self) -> float | None:
        return next(m.value for m in self.metrics if m.name == "accuracy")

    def upload(self, ended_at: datetime, is_overlong: bool) -> ResultUpload:
        return ResultUpload(metrics=self.metrics, stats=self.stats.model_dump(), n_trials=self.stats.n_trials,
                            ended_at=ended_at, is_overlong=is_overlong)


def valid_trials(facts: RunDirFacts) -> int:
    return max(facts.n_completed - facts.n_infra_errors, 0)


def accuracy(facts: RunDirFacts) -> float | None:
    n_valid = valid_trials(facts)
    return facts.reward_sum / n_valid if n_valid else None


def run_metrics(facts: RunDirFacts, errors: ErrorClasses) -> RunMetrics:
    n_valid = valid_trials(facts)
    return RunMetrics(
        metrics=(
            Metric(name="accuracy", value=accuracy(facts)),
            Metric(name="accuracy_stderr", value=_stderr(facts.reward_sum, facts.reward_sq_sum, n_valid)),
            Metric(name="n_valid_trials", value=float(n_valid)),
        ),
        stats=UploadStats(
            n_trials=n_valid,
            n_infra_errors=facts.n_infra_errors,
            infra_error_breakdown=errors.infra_breakdown(facts.error_breakdown),
            n_errors_by_class=errors.breakdown(facts.error_breakdown),
        ),
    )


def same_metrics(stored: Iterable[Metric] | None, written: Iterable[Metric]) -> bool:
    """Does a row hold exactly these metrics (names and values)? How an upload is verified and found done."""
    expected = {metric.name: metric.value for metric in written}
    return bool(expected) and {metric.name: metric.value for metric in stored or ()} == expected


def _stderr(total: float, sq_total: float, n: int) -> float | None:
    """Standard error of the mean with the sample (n-1) variance, from running sums."""
    if n < 2:
        return None
    variance = max(sq_total - total * total / n, 0.0) / (n - 1)
    return math.sqrt(variance / n)
