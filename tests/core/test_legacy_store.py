"""The planner over a real legacy OT-Agent store: families through duplicate_of, other users' rows, config match.

Read-only: planning never creates the reconciler's own tables nor touches the file.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

from controller.adapters.store import open_store
from controller.core.match import join_cells
from controller.core.planner import plan
from controller.core.vocabulary import Phase
from tests.core.builders import NOW, POLICY, RUN, ago, cell
from tests.fixtures.legacy_db import build_families, terminus_config

V2 = cell(model="laion/Qwen3-8B-sft-v3", benchmark_name="dev_set_v2", dataset="DCAgent/dev_set_v2", benchmark="v2")
TB2 = cell(model="laion/Qwen3-8B-sft-v3", benchmark_name="terminal_bench_2")
BIG = cell(model="Qwen/Qwen3-32B", benchmark_name="dev_set_v2", dataset="DCAgent/dev_set_v2", benchmark="v2",
           timeout_multiplier=16.0)


def plan_against(path: Path, cells):
    store = open_store(f"sqlite:///{path}", readonly=True)
    snapshot = store.observe("run1", sorted({c.model for c in cells}), sorted({c.benchmark_name for c in cells}))
    store.close()
    return {(c.cell.model, c.cell.benchmark_name): c
            for c in plan(RUN, cells, join_cells(cells, snapshot, (), ()), POLICY, NOW).cells}


def test_families_other_users_and_config_match(tmp_path):
    db, ids = build_families(tmp_path / "legacy.db")
    # bob's finished row, filed under a DUPLICATE model and a DUPLICATE benchmark name
    db.add_row(ids.qwen_dup, ids.v2_dcagent, username="bob", job_status="Finished",
               metrics=[{"name": "accuracy", "value": 0.41}], config=terminus_config())
    # bob's young Started row for tb2: respected, we cannot see his job
    db.add_row(ids.qwen, ids.tb2, username="bob", job_status="Started", started_at=ago(hours=2),
               config=terminus_config())
    # a finished row with another timeout multiplier does not match the 32B cell (×16)
    db.add_row(ids.other_model, ids.v2_2x, username="bob", job_status="Finished",
               metrics=[{"name": "accuracy", "value": 0.3}], config=terminus_config(timeout_multiplier=2.0))
    db.close()
    decided = plan_against(tmp_path / "legacy.db", [V2, TB2, BIG])
    v2 = decided[("laion/Qwen3-8B-sft-v3", "dev_set_v2")]
    assert v2.phase == Phase.COMPLETED and v2.score == 0.41
    tb2 = decided[("laion/Qwen3-8B-sft-v3", "terminal_bench_2")]
    assert [a.kind.value for a in tb2.actions] == ["skip"] and "job in progress" in tb2.reason
    big = decided[("Qwen/Qwen3-32B", "dev_set_v2")]
    assert [a.kind.value for a in big.actions] == ["submit"] and big.reason == "no existing job"


def test_plan_cli_leaves_a_legacy_store_untouched(tmp_path):
    db, ids = build_families(tmp_path / "legacy.db")
    db.add_row(ids.qwen, ids.v2, username="bob", job_status="Finished",
               metrics=[{"name": "accuracy", "value": 0.5}], config=terminus_config())
    db.close()
    before = hashlib.sha256((tmp_path / "legacy.db").read_bytes()).hexdigest()
    spec = tmp_path / "run.yaml"
    (tmp_path / "run.sh").write_text("#!/bin/sh\n")  # plan looks for the job script it would submit
    spec.write_text(f"""
apiVersion: evalrun.io/v1alpha1
kind: EvalCluster
metadata: {{name: local}}
spec: {{scheduler: {{type: local}}, jobsDir: {tmp_path}/jobs, logsDir: {tmp_path}/logs, jobScript: run.sh}}
---
apiVersion: evalrun.io/v1alpha1
kind: EvalRun
metadata: {{name: legacy-check}}
spec: {{cluster: local, models: [laion/Qwen3-8B-sft-v3], presets: [v2]}}
""")
    result = subprocess.run([sys.executable, "-m", "controller.entry.cli", "plan", "-f", str(spec), "--store",
                             f"sqlite:///{tmp_path}/legacy.db", "-o", "json"], check=False, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    [cell_out] = json.loads(result.stdout)["evalruns"][0]["cells"]
    assert cell_out["phase"] == "Completed" and cell_out["actions"] == [{"kind": "skip", "reason": "job finished"}]
    assert hashlib.sha256((tmp_path / "legacy.db").read_bytes()).hexdigest() == before
    assert not (tmp_path / "legacy.db-wal").exists()
