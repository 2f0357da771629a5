"""What a cell logs to the tracker, and whether what the server reads back is exactly that. Pure.

"Exit 0" and "a report on disk" were how success was misreported (RULES §5): a cell is Completed only
when every metric logged (score, each error bucket, the step stats) and every param read back equal.
"""

from __future__ import annotations

import math

from controller.core.admission import trial_pairs
from controller.core.metrics import RunMetrics
from controller.core.observed import RunDirFacts
from controller.core.ports import TrackedRun, TrackerRecord
from controller.core.trial_errors import ErrorClasses
from controller.core.types import Cell, Frozen

REPORT_ARTIFACT = "post_eval_report.txt"


class Analysis(Frozen):
    """A post-eval analysis as the actor hands it on: the report's text and its step statistics."""

    report: str
    step_stats: dict[str, float]  # steps_* (and tokens_* where reported) per trial; empty without trajectories


def tracker_record(cell: Cell, facts: RunDirFacts, owner: str, result: RunMetrics, analysis: Analysis,
                   errors: ErrorClasses, gpu_hours: float | None = None) -> TrackerRecord:
    """Every known error class is a metric, zeros included, and the classes not in the catalog are summed in
    `errors.other`, so all runs share the same metric names (dashboards stay dimensionally stable). `gpu_hours`:
    the attempt's actual GPU-hours, where the scheduler said."""
    metrics = {m.name: float(m.value) for m in result.metrics if m.value is not None}
    completed, measured = trial_pairs(facts, cell.n_attempts)  # a task's re-runs count once
    metrics |= {"n_valid_trials": float(result.stats.n_scored), "n_infra_errors": float(result.stats.n_infra_errors),
                "n_completed_trials": float(completed), "n_scored_trials": float(measured)}
    if facts.n_total is not None:
        metrics["n_total_trials"] = float(facts.n_total)
    known = set(errors.known)
    by_class = result.stats.n_errors_by_class
    metrics |= {f"errors.{name}": float(by_class.get(name, 0)) for name in sorted(known)}
    metrics["errors.other"] = float(sum(count for name, count in by_class.items() if name not in known))
    metrics |= analysis.step_stats
    if gpu_hours is not None:
        metrics["gpu_hours"] = gpu_hours
    return TrackerRecord(
        run_tag=facts.run_tag,
        owner=owner,
        tags={"cell_key": cell.key, "model": cell.model, "benchmark": cell.benchmark_name, "dataset": cell.dataset,
              "cluster": cell.cluster, "evalrun": str(cell.evalrun),
              "provisional": str(result.stats.provisional).lower(), "partial": str(result.stats.partial).lower(),
              "admission": _admission_tag(result),
              **({"shards": " ".join(facts.shard_run_tags())[:5000]} if facts.shards else {})},
        params={"agent": cell.agent, "harbor_config": cell.harbor_config,
                "timeout_multiplier": f"{cell.timeout_multiplier:g}", "n_attempts": str(cell.n_attempts),
                "fingerprint": cell.fingerprint},
        metrics=metrics,
        report=analysis.report,
    )


def _admission_tag(result: RunMetrics) -> str:
    """The gate's evidence in a line (an MLflow tag holds at most 5,000 characters)."""
    evidence = result.stats.evidence
    return ", ".join(f"{key}={evidence[key]}" for key in sorted(evidence))[:5000]


def differences(record: TrackerRecord, tracked: TrackedRun | None) -> list[str]:
    """What the server does not hold as logged; empty means verified."""
    if tracked is None:
        return [f"no MLflow run tagged {record.run_tag}"]
    missing = [f"metric {name}: logged {value:g}, server has {_shown(tracked.metrics.get(name))}"
               for name, value in sorted(record.metrics.items()) if not _equal(tracked.metrics.get(name), value)]
    missing += [f"param {name}: logged {value!r}, server has {tracked.params.get(name)!r}"
                for name, value in sorted(record.params.items()) if tracked.params.get(name) != value]
    if REPORT_ARTIFACT not in tracked.artifacts:
        missing.append(f"artifact {REPORT_ARTIFACT} missing")
    return missing


def _equal(stored: float | None, logged: float) -> bool:
    return stored is not None and math.isclose(stored, logged, rel_tol=1e-12, abs_tol=0.0)


def _shown(value: float | None) -> str:
    return "nothing" if value is None else f"{value:g}"
