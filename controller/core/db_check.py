"""What in the lab's results DB the reconciler would read as ambiguous, found before it decides anything.

Pure: it reads one `ResultsSnapshot` of the whole DB. Each finding names the rows, so a human can fix
or mark them; nothing is ever changed here.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from enum import StrEnum

from controller.core.match import OVERRIDE_KEYS
from controller.core.observed import RowStatus
from controller.core.records import NamedRow, ResultsSnapshot, SandboxJobRow
from controller.core.types import Frozen

STATUSES = {status.value for status in RowStatus}


class FindingKind(StrEnum):
    UNREADABLE = "unreadable row"  # the reconciler fails closed on it: its cells stay Unknown
    UNKNOWN_STATUS = "unknown job_status"  # the cell is held for a human
    SEVERAL_FINISHED = "several Finished rows"  # the newest decides; the others may be what a dashboard shows
    BROKEN_FAMILY = "broken duplicate_of"  # points at a missing row or at another duplicate
    UNKNOWN_MODEL_OR_BENCHMARK = "row without a known model or benchmark"  # no cell can ever match it


class Finding(Frozen):
    kind: FindingKind
    rows: tuple[str, ...]
    message: str


def check_results(snapshot: ResultsSnapshot) -> list[Finding]:
    findings = [Finding(kind=FindingKind.UNREADABLE, rows=(), message=why) for why in snapshot.undecodable]
    findings += _families(snapshot.models, "model") + _families(snapshot.benchmarks, "benchmark")
    canonical = {row.id: row.duplicate_of or row.id for row in (*snapshot.models, *snapshot.benchmarks)}
    names = {row.id: row.name for row in (*snapshot.models, *snapshot.benchmarks)}
    groups: dict[tuple[str, str, tuple[object, ...]], list[SandboxJobRow]] = defaultdict(list)
    for row in snapshot.rows:
        if row.job_status not in STATUSES:
            findings.append(Finding(kind=FindingKind.UNKNOWN_STATUS, rows=(row.id,),
                                    message=f"row {row.id}: job_status {row.job_status!r}; its cell is held until "
                                            "it is Pending, Started or Finished"))
        if row.model_id not in canonical or row.benchmark_id not in canonical:
            findings.append(Finding(kind=FindingKind.UNKNOWN_MODEL_OR_BENCHMARK, rows=(row.id,),
                                    message=f"row {row.id}: model {row.model_id} / benchmark {row.benchmark_id} "
                                            "not in the models/benchmarks tables"))
            continue
        if row.job_status == RowStatus.FINISHED and row.has_metrics:
            groups[(canonical[row.model_id], canonical[row.benchmark_id], _config_key(row))].append(row)
    for (model, benchmark, config), rows in groups.items():
        if len(rows) > 1:
            rows.sort(key=lambda r: (r.created_at is not None, r.created_at), reverse=True)
            scores = ", ".join(f"{r.id} ({r.username}, {_accuracy(r)})" for r in rows)
            findings.append(Finding(kind=FindingKind.SEVERAL_FINISHED, rows=tuple(r.id for r in rows),
                                    message=f"{names[model]} × {names[benchmark]} {_describe(config)}: {len(rows)} "
                                            f"Finished rows, newest first: {scores}; the newest decides"))
    return findings


def _families(rows: Iterable[NamedRow], kind: str) -> list[Finding]:
    by_id = {row.id: row for row in rows}
    findings = []
    for row in by_id.values():
        if row.duplicate_of is None:
            continue
        target = by_id.get(row.duplicate_of)
        if target is None:
            why = f"duplicate_of {row.duplicate_of} does not exist"
        elif target.duplicate_of is not None:
            why = f"duplicate_of {target.name} ({target.id}), itself a duplicate of {target.duplicate_of}: point it " \
                  "at the canonical row"
        else:
            continue
        findings.append(Finding(kind=FindingKind.BROKEN_FAMILY, rows=(row.id,), message=f"{kind} {row.name}: {why}"))
    return findings


def _config_key(row: SandboxJobRow) -> tuple[object, ...]:
    config = row.config or {}
    environment = config.get("environment") or {}
    return (config.get("agent"), config.get("timeout_multiplier"), *(environment.get(k) for k in OVERRIDE_KEYS))


def _describe(config: tuple[object, ...]) -> str:
    agent, multiplier, *_ = config
    return f"(agent {agent or '?'}, timeout ×{multiplier if multiplier is not None else '?'})"


def _accuracy(row: SandboxJobRow) -> str:
    value = next((m.value for m in row.metrics or () if m.name == "accuracy"), None)
    return "no accuracy" if value is None else f"accuracy {value}"
