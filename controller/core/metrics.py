"""What gets uploaded for one admitted run dir: metrics as a LIST of {name, value} and the stats dict.

Pure. The numbers are the admission gate's (`admission.admit`): nothing here computes a score. The stats carry the
gate's evidence, `n_scored` and the `provisional` and `partial` flags, so a leaderboard can filter and a reviewer
can audit why a number was published.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from controller.core.admission import Admitted
from controller.core.observed import Metric, RunDirFacts
from controller.core.records import ResultUpload
from controller.core.trial_errors import ErrorClasses
from controller.core.types import Frozen


class UploadStats(Frozen):
    """`sandbox_jobs.stats` as the dashboards read it; every known class present so rows stay comparable."""

    n_trials: int
    n_scored: int
    n_infra_errors: int
    infra_error_breakdown: dict[str, int]
    n_errors_by_class: dict[str, int]
    provisional: bool
    partial: bool
    evidence: dict[str, Any]


class RunMetrics(Frozen):
    metrics: tuple[Metric, ...]
    stats: UploadStats

    @property
    def score(self) -> float | None:
        return next(m.value for m in self.metrics if m.name == "accuracy")

    def upload(self, ended_at: datetime, is_overlong: bool, env: str) -> ResultUpload:
        return ResultUpload(metrics=self.metrics, stats=self.stats.model_dump(), n_trials=self.stats.n_trials,
                            ended_at=ended_at, is_overlong=is_overlong, env=env)


def admitted_metrics(admitted: Admitted) -> tuple[Metric, ...]:
    """The row's metrics list: what an upload writes and a Finished row is compared with."""
    return (
        Metric(name="accuracy", value=admitted.score),
        Metric(name="accuracy_stderr", value=admitted.stderr),
        Metric(name="n_valid_trials", value=float(admitted.n_scored)),
    )


def run_metrics(admitted: Admitted, facts: RunDirFacts, errors: ErrorClasses) -> RunMetrics:
    return RunMetrics(
        metrics=admitted_metrics(admitted),
        stats=UploadStats(
            n_trials=admitted.n_scored,
            n_scored=admitted.n_scored,
            n_infra_errors=facts.n_infra_errors,
            infra_error_breakdown=errors.infra_breakdown(facts.infra_error_breakdown),
            n_errors_by_class=errors.breakdown(facts.error_breakdown),
            provisional=admitted.provisional,
            partial=admitted.partial,
            evidence=admitted.evidence.model_dump(mode="json") | {"partial_why": admitted.partial_why},
        ),
    )


def holds_the_gates_numbers(stored: Iterable[Metric] | None, admitted: Admitted) -> bool:
    """Does a Finished row hold what the gate gives its run dir today: its accuracy, and every other of the gate's
    metrics it holds (an older tool's row may hold fewer)? To a float's last digits: the same sum taken in another
    order (an earlier gate version) differs there, and is the same number. A row naming a metric twice never does
    (`repeated_names`)."""
    held = tuple(stored or ())
    if repeated_names(held):
        return False
    values = {metric.name: metric.value for metric in held}
    if "accuracy" not in values:
        return False
    return all(same_number(values[m.name], m.value) for m in admitted_metrics(admitted) if m.name in values)


def same_number(held: float | None, computed: float | None) -> bool:
    """One number, to a float's last digits."""
    if held is None or computed is None:
        return held is computed
    return math.isclose(held, computed, rel_tol=1e-9, abs_tol=1e-12)


def same_metrics(stored: Iterable[Metric] | None, written: Iterable[Metric]) -> bool:
    """Does a row hold exactly these metrics (names and values)? How an upload is verified and found done. A row
    naming a metric twice never does (`repeated_names`): it is written again."""
    held = tuple(stored or ())
    expected = {metric.name: metric.value for metric in written}
    return bool(expected) and not repeated_names(held) and {metric.name: metric.value for metric in held} == expected


def repeated_names(stored: Iterable[Metric] | None) -> tuple[str, ...]:
    """The metric names a row's list holds more than once. Every reader shows the first of a name (`status`, the
    report, `db audit`); a dict of the list keeps the last. So such a row never counts as holding any numbers of
    ours: it would be shown with one accuracy and verified with another (SCORES.md)."""
    names = [metric.name for metric in stored or ()]
    return tuple(sorted({name for name in names if names.count(name) > 1}))
