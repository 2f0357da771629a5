"""How the results DB's checks look: `db check` findings, `db audit` verdicts, `models` candidates (rich, JSON)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

from controller.core.admission import GATE_VERSION
from controller.core.audit import AuditReport, RowAudit
from controller.core.db_check import Finding
from controller.core.intake import Candidate


def db_findings(findings: Sequence[Finding], rows_read: int, console: Console) -> None:
    if not findings:
        console.print(f"ok: {rows_read} sandbox_jobs row(s), nothing the reconciler would read as ambiguous")
        return
    table = Table("finding", "rows", "what and why", title=f"{len(findings)} finding(s) in {rows_read} row(s)")
    for finding in findings:
        table.add_row(finding.kind.value, "\n".join(finding.rows), finding.message)
    console.print(table)


def db_findings_json(findings: Sequence[Finding], rows_read: int) -> str:
    return json.dumps({"rows": rows_read, "findings": [f.model_dump(mode="json") for f in findings]}, indent=2)


def audit_table(report: AuditReport, console: Console, *, marked: int | None = None) -> None:
    """The new findings (refused, partial, provisional) as a table, then one summary line. `marked`: rows --apply
    marked."""
    new = sorted(report.new, key=_audit_order)
    if new:
        table = Table("row", "model", "benchmark", "user", "accuracy", "verdict", "why",
                      title=f"{len(new)} row(s) the admission gate (gate {GATE_VERSION}) would not publish as they are")
        for entry in new:
            table.add_row(entry.row_id, entry.model, entry.benchmark, entry.username or "?",
                          "—" if entry.accuracy is None else f"{entry.accuracy:.3f}", _verdict_text(entry),
                          entry.reason)
        console.print(table)
    console.print(_audit_summary(report, marked))


def audit_json(report: AuditReport, *, marked: int | None = None) -> str:
    """Every row judged (verdict "ok" included), the rows that could not be, and what --apply marked."""
    rows = [{"row": a.row_id, "model": a.model, "benchmark": a.benchmark, "username": a.username,
             "accuracy": a.accuracy, "run_tag": a.run_tag, "evalrun": a.evalrun, "verdict": a.verdict.value,
             "refusal": a.refusal, "reason": a.reason, "n_scored": a.n_scored, "evidence": a.evidence,
             "already_marked": a.already_marked,
             "mark": None if a.marked is None else a.marked.model_dump(mode="json", exclude={"row_id"})}
            for a in sorted(report.audited, key=_audit_order)]
    return json.dumps({"gate": GATE_VERSION, "audited": len(report.audited), "findings": len(report.findings),
                       "new": len(report.new), "already_marked": len(report.already_marked),
                       "not_auditable": len(report.not_auditable), "applied": marked is not None,
                       "marked": marked or 0, "rows": rows,
                       "not_auditable_rows": [u.model_dump(mode="json") for u in report.not_auditable]}, indent=2)


def _audit_order(entry: RowAudit) -> tuple[str, str, str]:
    return entry.model, entry.benchmark, entry.row_id


def _verdict_text(entry: RowAudit) -> str:
    if entry.refusal is not None:
        return f"[red]refused[/]: {entry.refusal}"
    return f"[yellow]{entry.verdict.value}[/], n={entry.n_scored}"


def _audit_summary(report: AuditReport, marked: int | None) -> str:
    counts = Counter(a.verdict.value for a in report.audited)
    line = (f"audited {len(report.audited)} row(s) (gate {GATE_VERSION}): {counts['refused']} refused, "
            f"{counts['partial']} partial, {counts['provisional']} provisional, {counts['ok']} ok")
    if report.already_marked:
        line += f"; {len(report.already_marked)} already marked"
    line += f"; {len(report.not_auditable)} not auditable (run dir gone or unreadable)"
    if marked is not None:
        line += f"; marked {marked} row(s) in evalrun_row_audit (sandbox_jobs untouched)"
    elif report.new:
        line += "; --apply marks them"
    return line


def candidates_table(evalrun: str | None, chosen: Sequence[Candidate], console: Console) -> None:
    title = f"unevaluated models for EvalRun {evalrun}" if evalrun else "unevaluated models"
    table = Table(title=f"{title}: {len(chosen)}, newest first", expand=False)
    for column in ("model", "size", "registered"):
        table.add_column(column, overflow="fold")
    for candidate in chosen:
        table.add_row(candidate.name, "—" if candidate.size_b is None else f"{candidate.size_b:g}B",
                      "—" if candidate.created_at is None else f"{candidate.created_at:%Y-%m-%d %H:%M} UTC")
    console.print(table)


def candidates_json(found: Sequence[tuple[str | None, Sequence[Candidate]]]) -> str:
    return json.dumps({"models": [{"evalrun": evalrun, "model": c.name, "size_b": c.size_b,
                                   "created_at": None if c.created_at is None else c.created_at.isoformat()}
                                  for evalrun, chosen in found for c in chosen]}, indent=2)
