"""Prometheus metrics of the operator: cells by phase, actions by kind, pass duration, observation errors."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import Counter, Gauge, Histogram, start_http_server

from controller.core.vocabulary import Phase

if TYPE_CHECKING:
    from controller.entry.operator_pass import PassReport

CELLS = Gauge("evalrun_cells", "Cells of an EvalRun by phase.", ["namespace", "evalrun", "phase"])
ACTIONS = Counter("evalrun_actions_total", "Actions taken, by kind and result.", ["kind", "result"])
PASS_SECONDS = Histogram("evalrun_pass_seconds", "Duration of one EvalRun pass (observe, plan, act).",
                         buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120))
UNOBSERVED = Counter("evalrun_unobserved_cells_total", "Cells left Unknown by a pass (a source could not be read).",
                     ["namespace", "evalrun"])


def serve(port: int) -> None:
    start_http_server(port)


def record(namespace: str, evalrun: str, report: PassReport) -> None:
    if report.summary is None:
        return
    for phase, count in report.summary.counts.items():
        CELLS.labels(namespace, evalrun, phase.value).set(count)
    UNOBSERVED.labels(namespace, evalrun).inc(report.summary.counts[Phase.UNKNOWN])
    for outcome in report.outcomes:
        ACTIONS.labels(outcome.action, "ok" if outcome.ok else "failed").inc()


def forget(namespace: str, evalrun: str) -> None:
    for phase in Phase:
        try:
            CELLS.remove(namespace, evalrun, phase.value)
        except KeyError:  # never reported
            pass
