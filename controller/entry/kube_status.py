"""How a RunStatus (core/status.py) looks as an EvalRun's `.status`, a cluster's quarantined nodes as its
`.status`, and a pass's outcomes as Events.

Conditions keep their `lastTransitionTime` while their status does not change (Kubernetes API
conventions); lists are replaced whole by a merge patch, so a condition that went away disappears.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Literal

from controller.core.actions import Step
from controller.core.remedies import Quarantined
from controller.core.status import ATTENTION_LIMIT, Condition, RunStatus
from controller.core.types import Frozen
from controller.core.vocabulary import Outcome

EVENT_SAMPLES = 5  # cells named in one aggregated Event; the rest are counted
EVENT_MESSAGE_MAX = 1000  # the API server refuses messages over 1 KiB in events.k8s.io
QUARANTINED_NODES_MAX = 100  # nodes an EvalCluster's status lists; `evalctl nodes list` shows them all


class EventNote(Frozen):
    type: Literal["Normal", "Warning"]
    reason: str
    message: str


def status_patch(summary: RunStatus, previous: Mapping[str, Any] | None, now: datetime, *,
                 requested_at: str | None = None, note: str = "") -> dict[str, Any]:
    return {
        "observedGeneration": summary.observed_generation,
        "conditions": conditions_patch(summary.conditions, previous, now),
        "summary": {
            "total": summary.total, "done": summary.done, "running": summary.running, "failed": summary.failed,
            "phases": {phase.value: n for phase, n in summary.counts.items()},  # zeros too: a merge patch keeps keys
            "clusters": summary.clusters or None,  # several clusters: cells per cluster; null drops the key
        },
        "attention": [item.model_dump(mode="json", exclude_none=True) for item in summary.attention],
        "attentionOmitted": summary.attention_omitted,
        "lastPass": {"at": _timestamp(now), "failedActions": summary.failed_actions, "note": note},
        "lastHandledReconcileAt": requested_at,
        "modelSelector": {"selected": summary.selected, "note": summary.selection} if summary.selection else None,
        "gpuHours": _gpu_hours(summary),
        "notifications": summary.notifications or None,  # messages not delivered (yet); null drops the key
        "walltime": summary.walltime or None,  # walltime auto: sized jobs against their estimate, the margin
        "effects": [e.model_dump(mode="json") for e in summary.effects[:ATTENTION_LIMIT]],  # remedies in force
    }


def _gpu_hours(summary: RunStatus) -> dict[str, Any]:
    """Spent, estimated for the cells not yet run (and from what), and the budget (null: none)."""
    gpu = summary.gpu_hours
    return {"spent": round(gpu.spent, 3), "estimated": round(gpu.estimated, 3), "notYetRun": gpu.not_yet_run,
            "estimatedFrom": gpu.by_source, "max": gpu.max_hours, "heldByBudget": gpu.held}


def quarantined_nodes_patch(nodes: Sequence[Quarantined]) -> dict[str, Any]:
    """An EvalCluster's `.status`: its nodes quarantined now, by node (the first QUARANTINED_NODES_MAX; the rest
    counted)."""
    shown = sorted(nodes, key=lambda q: q.name)[:QUARANTINED_NODES_MAX]
    return {"quarantinedNodes": [{"node": q.name, "reason": q.reason,
                                  "since": None if q.since is None else _timestamp(q.since),
                                  "until": _timestamp(q.until), "owner": q.owner} for q in shown],
            "quarantinedNodesOmitted": len(nodes) - len(shown)}


def invalid_spec_patch(messages: Sequence[str], generation: int | None, previous: Mapping[str, Any] | None,
                       now: datetime, reason: str = "InvalidSpec") -> dict[str, Any]:
    """A spec the loader refuses, or one over its namespace's quota (`QuotaExceeded`): nothing runs, and status
    says why (never a crash loop)."""
    message = "; ".join(messages)[:EVENT_MESSAGE_MAX]
    conditions = (Condition(type="Ready", status="False", reason=reason, message=message,
                            observed_generation=generation),
                  Condition(type="Stalled", status="True", reason=reason, message=message,
                            observed_generation=generation))
    note = "invalid spec" if reason == "InvalidSpec" else reason
    return {"observedGeneration": generation, "conditions": conditions_patch(conditions, previous, now),
            "lastPass": {"at": _timestamp(now), "failedActions": 0, "note": note}}


def not_run_patch(message: str, generation: int | None, previous: Mapping[str, Any] | None,
                  now: datetime) -> dict[str, Any]:
    """A pass that did not finish (its deadline, or its EvalRun's previous pass hung): the EvalRun is Unknown; the
    counts of the last pass that finished stay as they were."""
    message = message[:EVENT_MESSAGE_MAX]
    conditions = (Condition(type="Ready", status="Unknown", reason="PassNotFinished", message=message,
                            observed_generation=generation),
                  Condition(type="Reconciling", status="True", reason="PassNotFinished", message=message,
                            observed_generation=generation),
                  Condition(type="Stalled", status="False", reason="PassNotFinished", message=message,
                            observed_generation=generation))
    return {"conditions": conditions_patch(conditions, previous, now),
            "lastPass": {"at": _timestamp(now), "failedActions": 0, "note": message}}


def conditions_patch(conditions: Sequence[Condition], previous: Mapping[str, Any] | None,
                     now: datetime) -> list[dict[str, Any]]:
    before = {c.get("type"): c for c in (previous or {}).get("conditions") or () if isinstance(c, Mapping)}
    rendered = []
    for condition in conditions:
        old = before.get(condition.type)
        unchanged = old is not None and old.get("status") == condition.status
        rendered.append({
            "type": condition.type, "status": condition.status, "reason": condition.reason,
            "message": condition.message, "observedGeneration": condition.observed_generation,
            "lastTransitionTime": _kept_transition(old, now) if unchanged and old else _timestamp(now),
        })
    return rendered


def aggregate_events(outcomes: Sequence[Outcome]) -> list[EventNote]:
    """One Event per action kind and result per pass, not one per cell: a 1,000-cell fleet must not flood."""
    groups: dict[tuple[Step, bool], list[Outcome]] = defaultdict(list)
    for outcome in outcomes:
        groups[(outcome.action, outcome.ok)].append(outcome)
    notes = []
    for (action, ok), group in groups.items():
        sample = "; ".join(f"{o.cell}: {o.message}" for o in group[:EVENT_SAMPLES])
        more = f" (+{len(group) - EVENT_SAMPLES} more)" if len(group) > EVENT_SAMPLES else ""
        message = f"{len(group)} cell(s): {sample}{more}"
        reason = action.event_reason + ("" if ok else "Failed")
        notes.append(EventNote(type="Normal" if ok else "Warning", reason=reason,
                               message=clip(message)))
    return notes


def clip(text: str, limit: int = EVENT_MESSAGE_MAX) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _kept_transition(old: Mapping[str, Any], now: datetime) -> str:
    """The previous transition time, when it is one of ours (anyone who may patch status may write anything)."""
    kept = old.get("lastTransitionTime")
    try:
        if isinstance(kept, str) and datetime.strptime(kept, "%Y-%m-%dT%H:%M:%SZ") <= now.replace(tzinfo=None):
            return kept
    except ValueError:
        pass
    return _timestamp(now)


def _timestamp(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")
