"""`evalctl report` over the converged local demo, opened in headless Chromium: every cell, provisional ones
marked, no console error, nothing fetched; written again with the network disabled, the same bytes."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

from tests.fixtures.browser import render

REPO = Path(__file__).resolve().parents[2]
TRUST = 35  # the demo's cells score 34–36 scored trials: some are trusted, some provisional


def evalctl(root: Path, *args: str, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([*prefix, sys.executable, "-m", "controller.entry.cli", *args], check=False, cwd=root,
                            text=True,
                            capture_output=True, timeout=300, env={**os.environ, "COLUMNS": "200"},
                            stdin=subprocess.DEVNULL)
    assert result.returncode == 0, f"{args}: {result.stdout}\n{result.stderr}"
    return result


def test_the_demo_report_renders_every_cell_and_marks_the_provisional_ones(tmp_path: Path, chromium: str) -> None:
    shutil.copytree(REPO / "specs", tmp_path / "specs")
    spec = tmp_path / "specs" / "demo.yaml"
    evalctl(tmp_path, "reconcile", "--loop", "--interval", "0.5", "--until-done", "-f", str(spec))
    spec.write_text(spec.read_text() + f"  report: {{trustThreshold: {TRUST}}}\n")

    written = evalctl(tmp_path, "report", "-f", str(spec), "--out", "report.html")
    offline = evalctl(tmp_path, "report", "-f", str(spec), "--out", "offline.html", prefix=("unshare", "--net"))

    assert "6 cell(s)" in written.stdout and offline.returncode == 0
    page = (tmp_path / "report.html").read_bytes()
    assert page == (tmp_path / "offline.html").read_bytes(), "written with the network disabled: the same file"
    with sqlite3.connect(tmp_path / "specs" / ".evalctl" / "store.db") as db:  # next to the spec
        valid = {(model, bench): int(next(m["value"] for m in json.loads(metrics) if m["name"] == "n_valid_trials"))
                 for model, bench, metrics in db.execute(
                     "SELECT m.name, b.name, r.metrics FROM sandbox_jobs r JOIN models m ON m.id = r.model_id "
                     "JOIN benchmarks b ON b.id = r.benchmark_id WHERE r.job_status = 'Finished'")}
    expected = {f"{model}|DCAgent/{bench}" for (model, bench), n in valid.items() if n < TRUST}
    assert expected and len(expected) < len(valid), f"the demo should have both kinds of cell: {valid}"

    shown = render(chromium, tmp_path / "report.html", "report-demo.png")

    assert shown.title == "evalctl report: demo"
    assert sorted(shown.cells) == sorted(f"{m}|DCAgent/{b}" for m in ("laion/Qwen3-8B-sft-v3", "Qwen/Qwen3-32B",
                                                                      "laion/Qwen3-4B-demo")
                                         for b in ("demo_tiny_a", "demo_tiny_b"))
    assert set(shown.provisional) == expected
    assert shown.console_errors == []
    assert shown.requests == [(tmp_path / "report.html").resolve().as_uri()], "the page fetched nothing else"
