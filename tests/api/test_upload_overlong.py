"""`upload.overlong` and `upload.overlongHours` as the planner gets them: by default a run that outlasted one job of
its cell (the wall cut it) is uploaded flagged; `hold` holds it; `overlongHours` sets the threshold in hours."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from controller.api.catalog import load_catalog
from controller.api.loader import load_specs
from controller.core.types import ClusterRef
from controller.entry.wiring import policy_for, targets_for


@pytest.mark.parametrize(("upload", "overlong", "hold"), [
    ("{}", "walltime", False),
    ("{overlong: hold}", "walltime", True),
    ("{overlongHours: 30, overlong: upload}", timedelta(hours=30), False),
    ("{overlongHours: null, overlong: hold}", "walltime", True),
])
def test_the_spec_becomes_the_policy(tmp_path: Path, upload: str, overlong: object, hold: bool) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"""
apiVersion: evalrun.io/v1alpha1
kind: EvalCluster
metadata: {{name: local}}
spec: {{scheduler: {{type: local}}, jobsDir: {tmp_path}/jobs, logsDir: {tmp_path}/logs, jobScript: /bin/true}}
---
apiVersion: evalrun.io/v1alpha1
kind: EvalRun
metadata: {{name: nightly}}
spec: {{cluster: local, models: [org/m1-8B], datasets: [DCAgent/tiny], upload: {upload}}}
""")
    specs = load_specs([spec])

    policy = policy_for(specs.evalruns[0], specs.clusters[ClusterRef(name="local")], load_catalog())

    assert (policy.overlong, policy.hold_overlong) == (overlong, hold)
    [target] = targets_for(specs, load_catalog())
    assert [c.time_limit for c in target.cells] == ["24:00:00"], "the cluster's timeLimit, default 24:00:00, on the cell"
