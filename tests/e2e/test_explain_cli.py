"""`evalctl explain MODEL BENCHMARK`: it reads only the cluster of the EvalRuns that may hold the cell, and a name
that matches no cell gets the nearest ones."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

SPECS = """\
apiVersion: evalrun.io/v1alpha1
kind: EvalCluster
metadata: {{name: here}}
spec: {{scheduler: {{type: local}}, jobsDir: {tmp}/jobs, logsDir: {tmp}/logs, jobScript: {repo}/specs/demo/fake_harbor.py}}
---
apiVersion: evalrun.io/v1alpha1
kind: EvalCluster
metadata: {{name: far}}
spec: {{scheduler: {{type: slurm, ssh: alice@login.far}}, jobsDir: /far/jobs, logsDir: /far/logs,
        jobScript: /far/eval.sbatch}}
---
apiVersion: evalrun.io/v1alpha1
kind: EvalRun
metadata: {{name: local-run}}
spec: {{cluster: here, models: [org/alpha-8B, org/beta-8B], datasets: [org/bench]}}
---
apiVersion: evalrun.io/v1alpha1
kind: EvalRun
metadata: {{name: far-run}}
spec: {{cluster: far, models: [org/gamma-8B], datasets: [org/bench]}}
"""


def evalctl(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """With an `ssh` first on PATH that leaves a canary: whoever dials the far cluster is seen."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "ssh").write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path}/dialled\nexit 255\n")
    (bin_dir / "ssh").chmod(0o755)
    spec = tmp_path / "specs.yaml"
    spec.write_text(SPECS.format(tmp=tmp_path, repo=REPO))
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    return subprocess.run([sys.executable, "-m", "controller.entry.cli", *args, "-f", str(spec), "--store",
                           f"sqlite:///{tmp_path}/store.db"], capture_output=True, text=True, env=env, cwd=tmp_path,
                          stdin=subprocess.DEVNULL, timeout=120, check=False)


def test_explain_dials_only_the_cluster_of_the_cell(tmp_path: Path) -> None:
    planned = evalctl(tmp_path, "plan")
    assert planned.returncode == 3 and "cluster far: queue not observed" in planned.stderr, planned.stderr
    assert "login.far" in (tmp_path / "dialled").read_text(), "the canary sees a pass that reads the far cluster"
    (tmp_path / "dialled").unlink()

    explained = evalctl(tmp_path, "explain", "org/alpha-8B", "org/bench")
    assert explained.returncode == 0, explained.stderr
    assert "org/alpha-8B × org/bench (EvalRun local-run)" in explained.stdout
    assert not (tmp_path / "dialled").exists(), "explaining a local cell dialled the far cluster"


def test_a_name_of_no_cell_gets_the_nearest_cells(tmp_path: Path) -> None:
    explained = evalctl(tmp_path, "explain", "org/alpha-8b", "org/bnch")
    assert explained.returncode == 2
    message, _, nearest = explained.stderr.strip().partition("; nearest: ")
    assert message == "evalctl: no cell org/alpha-8b × org/bnch in these specs"
    assert nearest.split(", ")[0] == "org/alpha-8B × org/bench", nearest  # the closest first
    assert not (tmp_path / "dialled").exists()
