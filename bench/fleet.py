"""What the benches share: the synthetic fleet's spec, and a cold page cache."""

from __future__ import annotations

import os
from pathlib import Path


def write_fleet_spec(root: Path, models: int, datasets: int, *, suspend: bool = False) -> Path:
    """An EvalCluster (local scheduler, user `bench`) and one EvalRun `fleet` of models × datasets."""
    spec = root / "fleet.yaml"
    spec.write_text(f"""apiVersion: evalrun.io/v1alpha1
kind: EvalCluster
metadata: {{name: bench}}
spec: {{scheduler: {{type: local}}, jobsDir: {root}/jobs, logsDir: {root}/logs, jobScript: /bin/true, username: bench,
        maxSubmissionsPerPass: 6}}
---
apiVersion: evalrun.io/v1alpha1
kind: EvalRun
metadata: {{name: fleet}}
spec:
  cluster: bench
  suspend: {str(suspend).lower()}
  models: {[f"org/model-{i:03d}-8B" for i in range(models)]}
  datasets: {[f"DCAgent/bench_set_{j:03d}" for j in range(datasets)]}
""")
    return spec


def drop_page_cache() -> bool:
    """Drop the page cache so the next read is cold; False when not allowed (not root)."""
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False
