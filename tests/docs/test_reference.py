"""The field reference (docs/reference.md): generated from the spec models, committed, and never stale."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from controller.api.crds import crd_documents
from controller.api.reference import Row, render_reference, rows, spec_schema

REPO = Path(__file__).resolve().parents[2]
COMMITTED = REPO / "docs" / "reference.md"


def evalctl_docs(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "controller.entry.cli", "docs", *args], capture_output=True,
                          text=True, check=False, timeout=120)


def all_rows() -> dict[str, dict[str, Row]]:
    return {doc["spec"]["names"]["kind"]: {r.path: r for r in rows(spec_schema(doc))} for doc in crd_documents()}


def test_committed_reference_is_current() -> None:
    assert COMMITTED.read_text(encoding="utf-8") == render_reference(), (
        "docs/reference.md is stale: the spec models changed; run `evalctl docs` and commit docs/reference.md")


def test_every_field_has_a_description() -> None:
    """A field added without a description would be a blank row (and blank `kubectl explain`)."""
    blank = [f"{kind} {path}" for kind, found in all_rows().items() for path, row in found.items()
             if not row.description]
    assert not blank, f"give these fields a description= in controller/api/: {blank}"


def test_rows_carry_type_default_required_and_enum() -> None:
    found = all_rows()
    run, cluster = found["EvalRun"], found["EvalCluster"]
    assert run["spec.forceEval"][1:4] == ("boolean", "`false`", False)
    assert run["spec.upload.partial"].type == "`hold` \\| `upload`"
    assert run["spec.upload.partial"].default == "`hold`"
    assert run["spec.modelSelector.limit"].required and run["spec.modelSelector.limit"].type == "integer (1–1000)"
    assert run["spec.monitor.nearCompleteFraction"].type == "number (> 0, ≤ 1)"
    assert run["spec.notify.webhooks[].secretRef.name"].required, "nested through a list's items"
    assert cluster["spec.scheduler.type"][1:4] == ("`local` \\| `slurm`", "", True)
    assert cluster["spec.timeLimit"].default == "`24:00:00`"
    assert cluster["spec.env"].type.startswith("map of string")
    assert "spec.allowedNamespaces" in found["ClusterEvalCluster"] and "spec.allowedNamespaces" not in cluster


def test_every_field_is_in_the_reference() -> None:
    text = COMMITTED.read_text(encoding="utf-8")
    shared = set(all_rows()["EvalCluster"])
    for kind, found in all_rows().items():
        for path in found:
            assert f"| `{path}` |" in text or (kind == "ClusterEvalCluster" and path in shared), (kind, path)


def test_docs_writes_and_check_says_stale(tmp_path: Path) -> None:
    out = tmp_path / "reference.md"
    missing = evalctl_docs("--check", "--out", str(out))
    assert missing.returncode == 1 and "run `evalctl docs`" in missing.stderr

    written = evalctl_docs("--out", str(out))
    assert written.returncode == 0, written.stderr
    assert out.read_text(encoding="utf-8") == render_reference()
    assert evalctl_docs("--check", "--out", str(out)).returncode == 0

    out.write_text(render_reference().replace("Harbor agent", "Harbor agnet"), encoding="utf-8")
    stale = evalctl_docs("--check", "--out", str(out))
    assert stale.returncode == 1
    assert "stale" in stale.stderr and "run `evalctl docs`" in stale.stderr and "Traceback" not in stale.stderr
    assert "Harbor agnet" in out.read_text(encoding="utf-8"), "--check writes nothing"
