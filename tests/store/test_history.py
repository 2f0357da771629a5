"""The lab's history as the reconciler reads it: `status` shows legacy scores, `db check` names what is ambiguous.

Both run the real `evalctl` over a legacy OT-Agent store (only its three tables) and leave the file untouched.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

from tests.fixtures.legacy_db import build_families, terminus_config

ROOT = Path(__file__).parents[2]


def evalctl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "controller.entry.cli", *args], check=False, capture_output=True,
                          text=True, cwd=ROOT)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def spec(tmp_path: Path, models: list[str]) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(f"""
apiVersion: evalrun.io/v1alpha1
kind: EvalCluster
metadata: {{name: local}}
spec: {{scheduler: {{type: local}}, jobsDir: {tmp_path}/jobs, logsDir: {tmp_path}/logs, jobScript: run.sh}}
---
apiVersion: evalrun.io/v1alpha1
kind: EvalRun
metadata: {{name: history}}
spec: {{cluster: local, models: {json.dumps(models)}, presets: [v2, tb2]}}
""")
    return path


def test_status_over_legacy_rows_shows_their_scores_through_families_both_ways(tmp_path: Path) -> None:
    db, fam = build_families(tmp_path / "legacy.db")
    # filed under the canonical model and a DUPLICATE benchmark; asked for by the duplicate model's name
    db.add_row(fam.qwen, fam.v2_dcagent, username="bob", metrics=[{"name": "accuracy", "value": 0.41}],
               config=terminus_config())
    # filed under the DUPLICATE model; asked for by the canonical benchmark name
    db.add_row(fam.qwen_dup, fam.tb2, username="carol", metrics={"accuracy": 0.37}, config=terminus_config())
    db.add_row(fam.other_model, fam.v2_2x, metrics=[{"name": "accuracy", "value": 0.55}],
               config=terminus_config(timeout_multiplier=16.0))  # the size policy's multiplier for a 32B model
    db.close()
    before = digest(tmp_path / "legacy.db")

    result = evalctl("status", "-f", str(spec(tmp_path, ["laion/Qwen3-8B-sft-v3-copy", "Qwen/Qwen3-32B"])),
                     "--store", f"sqlite:///{tmp_path}/legacy.db", "-o", "json")

    assert result.returncode == 0, result.stderr
    cells = {(c["model"], c["benchmark"]): (c["phase"], c["score"])
             for c in json.loads(result.stdout)["evalruns"][0]["cells"]}
    assert cells == {
        ("laion/Qwen3-8B-sft-v3-copy", "v2"): ("Completed", 0.41),
        ("laion/Qwen3-8B-sft-v3-copy", "tb2"): ("Completed", 0.37),
        ("Qwen/Qwen3-32B", "v2"): ("Completed", 0.55),
        ("Qwen/Qwen3-32B", "tb2"): ("Pending", None),
    }
    assert digest(tmp_path / "legacy.db") == before


def test_db_check_names_every_ambiguous_row_and_touches_nothing(tmp_path: Path) -> None:
    db, fam = build_families(tmp_path / "legacy.db")
    older = db.add_row(fam.qwen, fam.v2, metrics=[{"name": "accuracy", "value": 0.40}], config=terminus_config(),
                       created_at="2025-03-01 10:00:00+00")
    newer = db.add_row(fam.qwen_dup, fam.v2_dcagent, username="bob", config=terminus_config(),
                       metrics=[{"name": "accuracy", "value": 0.45}], created_at="2025-04-01 10:00:00+00")
    db.add_row(fam.qwen, fam.v2, metrics=[{"name": "accuracy", "value": 0.2}],
               config=terminus_config(timeout_multiplier=16.0))  # another config: another cell, not ambiguous
    failed = db.add_row(fam.qwen, fam.tb2, job_status="Failed")
    garbled = db.add_row(fam.other_model, fam.tb2, metrics="{not json")
    chained = db.add_model("laion/Qwen3-8B-sft-v3-copy-of-copy", duplicate_of=fam.qwen_dup)
    db.close()
    before = digest(tmp_path / "legacy.db")

    result = evalctl("db", "check", "--store", f"sqlite:///{tmp_path}/legacy.db", "-o", "json")

    assert result.returncode == 1, result.stderr
    report = json.loads(result.stdout)
    found = {(f["kind"], tuple(f["rows"])) for f in report["findings"]}
    assert ("several Finished rows", (newer, older)) in found
    assert ("unknown job_status", (failed,)) in found
    assert ("broken duplicate_of", (chained,)) in found
    assert any(kind == "unreadable row" and garbled in message
               for kind, message in ((f["kind"], f["message"]) for f in report["findings"]))
    assert len(report["findings"]) == 4 and report["rows"] == 5
    assert digest(tmp_path / "legacy.db") == before


def test_db_check_of_a_clean_store_exits_0(tmp_path: Path) -> None:
    db, fam = build_families(tmp_path / "legacy.db")
    db.add_row(fam.qwen, fam.v2, metrics=[{"name": "accuracy", "value": 0.4}], config=terminus_config())
    db.close()

    result = evalctl("db", "check", "--store", f"sqlite:///{tmp_path}/legacy.db")

    assert result.returncode == 0, result.stderr
    assert "nothing the reconciler would read as ambiguous" in result.stdout
