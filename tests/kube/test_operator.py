"""`kubectl apply -f evalrun.yaml` end to end: a real API server, the real kubectl, a real `evalctl operator`
process under its least-privilege service account, and real local jobs (fake Harbor)."""

from __future__ import annotations

import base64
import json
import shutil
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.kube.conftest import OPERATOR_NAMESPACE, OPERATOR_SA, REPO, Kube, Lab, eventually
from tests.kube.test_rbac import CLUSTER_ROLE, can_i_list

pytestmark = pytest.mark.kube


def test_apply_drives_the_evalrun_to_ready_and_kubectl_shows_the_counts(lab: Lab):
    lab.start_operator()
    lab.apply(lab.cluster_yaml(), lab.run_yaml(["org/a-8B", "org/b-8B"]))
    waited = lab.kube.kubectl("wait", "--for=condition=Ready", "evalrun/demo", "-n", lab.namespace, "--timeout=120s")
    assert waited.returncode == 0
    table = lab.kube.kubectl("get", "evalruns", "-n", lab.namespace).stdout
    header, row = table.splitlines()[:2]
    assert header.split()[:5] == ["NAME", "READY", "DONE", "TOTAL", "RUNNING"]
    assert row.split()[:5] == ["demo", "True", "2", "2", "0"], table
    wide = lab.kube.kubectl("get", "evalruns", "-n", lab.namespace, "-o", "wide").stdout.splitlines()
    assert wide[0].split()[-6:] == ["REASON", "CLUSTER", "CLUSTER-REF", "CLUSTERS", "SUSPENDED", "LAST-PASS"], wide
    assert "AllCellsCompleted" in wide[1] and " local " in wide[1]
    explained = lab.kube.kubectl("explain", "evalrun.spec.monitor").stdout
    assert "When a running job is judged stuck" in explained and "preWalltimeMinutes" in explained
    status = lab.evalrun()["status"]
    assert status["observedGeneration"] == lab.evalrun()["metadata"]["generation"]
    assert status["summary"]["phases"]["Completed"] == 2
    reasons = {e["reason"] for e in lab.events() if e["involvedObject"]["name"] == "demo"}
    assert {"Submit", "Upload"} <= reasons, reasons


def test_adding_a_model_bumps_the_generation_and_submits_only_the_new_cell(lab: Lab):
    lab.start_operator()
    lab.apply(lab.cluster_yaml(), lab.run_yaml(["org/a-8B"]))
    lab.wait_condition("Ready")
    first = lab.evalrun()["metadata"]["generation"]
    lab.apply(lab.run_yaml(["org/a-8B", "org/c-8B"]))
    assert lab.evalrun()["metadata"]["generation"] == first + 1
    eventually(lambda: lab.evalrun()["status"].get("observedGeneration") == first + 1
               and lab.condition("Ready")["status"] == "True", "the new generation to be Ready")
    assert sorted(job.name.split("__")[1] for job in lab.jobs()) == ["a-8B", "c-8B"], "one job per cell, no repeat"


def test_suspend_stops_every_action_and_requested_at_forces_a_pass(lab: Lab):
    lab.start_operator()
    lab.apply(lab.cluster_yaml(), lab.run_yaml(["org/a-8B"], extra="  suspend: true"))
    ready = lab.wait_condition("Ready", "False")
    assert ready["reason"] == "Suspended", ready
    assert lab.jobs() == [], "suspended: nothing submitted"
    lab.kube.kubectl("annotate", "evalrun/demo", "-n", lab.namespace, "evalrun.io/requestedAt=now-1", "--overwrite")
    eventually(lambda: lab.evalrun()["status"].get("lastHandledReconcileAt") == "now-1", "the requested pass")
    assert lab.jobs() == []
    lab.apply(lab.run_yaml(["org/a-8B"], extra="  suspend: false"))
    lab.wait_condition("Ready")


@pytest.mark.parametrize(("policy", "cancelled"), [("Cancel", True), ("Orphan", False)])
def test_delete_cancels_running_jobs_only_with_deletion_policy_cancel(lab: Lab, policy: str, cancelled: bool):
    lab.start_operator()
    lab.apply(lab.cluster_yaml({"FAKE_HARBOR_HANG_AFTER": "1"}),
              lab.run_yaml(["org/a-8B"], extra=f"  deletionPolicy: {policy}"))
    eventually(lambda: any(j.state.value == "Running" for j in lab.jobs()), "the job to run")
    lab.kube.kubectl("delete", "evalrun/demo", "-n", lab.namespace, "--wait=true", "--timeout=90s")
    [job] = lab.jobs()
    if cancelled:
        eventually(lambda: lab.jobs()[0].state.value == "Cancelled", "the job to be cancelled")
    else:
        assert job.state.value == "Running", "Orphan leaves the job alone"


def test_a_schema_violation_is_refused_by_the_server_and_a_bad_reference_stalls_until_fixed(lab: Lab):
    lab.start_operator()
    refused = lab.apply(lab.run_yaml(["org/a-8B"], extra="  bogusField: 1"), check=False)
    assert refused.returncode != 0 and "bogusField" in refused.stderr, refused.stderr
    lab.apply(lab.run_yaml(["org/a-8B"]))  # names EvalCluster `local`, which does not exist yet
    stalled = lab.wait_condition("Stalled")
    assert stalled["reason"] == "InvalidSpec" and "cluster local" in stalled["message"], stalled
    lab.apply(lab.cluster_yaml())  # fixing the referenced object re-triggers the EvalRun at once
    lab.wait_condition("Ready")


def test_a_secret_ref_to_a_missing_secret_stalls_with_where_to_add_it(lab: Lab):
    lab.start_operator()
    attention = lab.stall_on_secret("nowhere")
    assert any(f"create Secret {lab.namespace}/nowhere with key 'api-key' (no such Secret)" in item["reason"]
               for item in attention), attention


def test_a_secret_value_appears_nowhere_the_api_or_the_operator_shows(lab: Lab):
    secret = "sk-live-0123456789abcdef"
    lab.kube.kubectl("create", "secret", "generic", "daytona", "-n", lab.namespace, f"--from-literal=api-key={secret}")
    script = lab.root / "leaky.sh"
    script.write_text('#!/bin/sh\nmkdir -p "$EVAL_JOBS_DIR"\necho "key $DAYTONA_API_KEY refused"\nexit 3\n')
    script.chmod(0o755)
    lab.start_operator()
    cluster = lab.cluster_yaml(secret_env="  secretEnv: [{name: DAYTONA_API_KEY, secretRef: {name: daytona, "
                                          "key: api-key}}]").replace(str(Path(REPO / "specs/demo/fake_harbor.py")),
                                                                     str(script))
    lab.apply(cluster, lab.run_yaml(["org/a-8B"]))
    stalled = lab.wait_condition("Stalled")
    assert "key *** refused" in json.dumps(lab.evalrun()["status"]), stalled
    shown = [lab.kube.kubectl("get", "evalrun/demo", "-n", lab.namespace, "-o", "yaml").stdout,
             json.dumps(lab.events()), lab.operator_log()]
    shown += [Path(f"/proc/{p.pid}/cmdline").read_bytes().decode() for p in lab.operators if p.poll() is None]
    assert all(secret not in text for text in shown)
    assert base64.b64encode(secret.encode()).decode() not in json.dumps(lab.events())


@pytest.mark.parametrize("step", ["after-intent", "after-submit"])
def test_sigkill_mid_pass_then_restart_submits_no_duplicate(lab: Lab, step: str):
    lab.apply(lab.cluster_yaml({"FAKE_HARBOR_HANG_AFTER": "1"}), lab.run_yaml(["org/a-8B", "org/b-8B", "org/c-8B"]))
    crashed = lab.start_operator(kill_at=step)  # SIGKILLs itself at that step of its first submission
    assert crashed.wait(timeout=120) == -signal.SIGKILL
    lab.start_operator()
    eventually(lambda: len(lab.jobs()) == 3 and all(j.state.value == "Running" for j in lab.jobs()), "three jobs")
    eventually(lambda: ((lab.evalrun().get("status") or {}).get("summary") or {}).get("running") == 3, "a pass that sees them")
    assert len({j.name for j in lab.jobs()}) == 3, "one job per cell"


def test_operator_and_a_cli_loop_on_the_same_store_never_both_act(lab: Lab):
    lab.apply(lab.cluster_yaml({"FAKE_HARBOR_HANG_AFTER": "1"}), lab.run_yaml(["org/a-8B", "org/b-8B"]))
    lab.start_operator()
    eventually(lambda: len(lab.jobs()) == 2, "the operator's two jobs")
    spec = lab.root / "same.yaml"  # the same cells of the same namespace, from a GitOps repo laid out like the cluster
    spec.write_text(lab.cluster_yaml({"FAKE_HARBOR_HANG_AFTER": "1"}) + "\n---\n"
                    + lab.run_yaml(["org/a-8B", "org/b-8B"], name="gitops"))
    log = lab.root / "cli-loop.log"
    with open(log, "w") as out:
        cli = subprocess.Popen([sys.executable, "-m", "controller.entry.cli", "reconcile", "--loop", "--interval",
                                "0.5", "-v", "-f", str(spec), "--store", lab.store], stdout=out, stderr=subprocess.STDOUT,
                               text=True, cwd=lab.root, stdin=subprocess.DEVNULL)
    owned = f"2 × skip: owned by EvalRun {lab.namespace}/demo"  # -v: every pass counts its decisions
    try:
        eventually(lambda: log.read_text().count(owned) >= 3, "three passes of the CLI loop")
    finally:
        cli.send_signal(signal.SIGTERM)  # never left looping after a failure
    assert cli.wait(timeout=60) == 143
    assert len(lab.jobs()) == 2, "the CLI loop started nothing"


def test_rbac_grants_the_operator_nothing_beyond_what_it_uses(kube: Kube):
    """Cluster-wide (here: in `default`, which did not opt in): the resources it handles, no Secret at all."""
    granted = can_i_list(kube, f"system:serviceaccount:{OPERATOR_NAMESPACE}:{OPERATOR_SA}", "default")
    assert granted == CLUSTER_ROLE, granted


def test_every_spec_in_the_repo_passes_server_side_dry_run(kube: Kube, tmp_path: Path):
    for spec in sorted((REPO / "specs").rglob("*.yaml")):
        done = kube.kubectl("apply", "--dry-run=server", "-n", "default", "-f", str(spec))
        assert done.returncode == 0, f"{spec}: {done.stderr}"
        validated = subprocess.run([sys.executable, "-m", "controller.entry.cli", "validate", "-f", str(spec)],
                                   capture_output=True, text=True, check=False, cwd=tmp_path)
        assert validated.returncode == 0, f"{spec}: {validated.stderr}"


def test_a_peered_operator_watching_every_namespace_works_under_the_manifests_rbac(lab: Lab):
    """The Deployment's mode: all namespaces, in `ClusterKopfPeering evalrun-operator` (kopf's standby of
    lower-priority replicas is kopf's own; its discovery timing is not something this test can observe)."""
    lab.start_operator("--priority", "100", peered=True)
    eventually(lambda: _peers(lab.kube) >= 1, "the replica in the peering object")
    lab.apply(lab.cluster_yaml(), lab.run_yaml(["org/a-8B"]))
    lab.wait_condition("Ready")
    assert len(lab.jobs()) == 1


def test_liveness_and_metrics_endpoints_answer(lab: Lab):
    liveness_port, metrics_port = _free_port(), _free_port()
    lab.start_operator("--liveness", f"http://127.0.0.1:{liveness_port}/healthz", "--metrics-port", str(metrics_port))
    lab.apply(lab.cluster_yaml(), lab.run_yaml(["org/a-8B"]))
    lab.wait_condition("Ready")
    health = eventually(lambda: _get(f"http://127.0.0.1:{liveness_port}/healthz"), "the liveness endpoint")
    assert health is not None
    metrics = _get(f"http://127.0.0.1:{metrics_port}/metrics") or ""
    assert f'evalrun_cells{{evalrun="demo",namespace="{lab.namespace}",phase="Completed"}} 1.0' in metrics, metrics
    assert 'evalrun_actions_total{kind="submit",result="ok"} ' in metrics
    assert "evalrun_pass_seconds_count" in metrics


def _peers(kube: Kube) -> int:
    status = kube.json("get", "clusterkopfpeerings", "evalrun-operator").get("status") or {}
    return len(status)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _get(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return str(answer.read().decode())
    except OSError:
        return None


@pytest.mark.slurm
def test_the_lab_slurm_cluster_with_real_harbor_converges_under_the_operator(lab: Lab, slurm_env: dict[str, str],
                                                                             eval_env: Path):
    dataset = lab.root / "datasets" / "tinyop"
    shutil.copytree(REPO / "eval" / "harbor" / "tiny-dataset", dataset)
    model = f"org/op{lab.namespace.removeprefix('t-')}"  # unique: SLURM accounting outlives the test
    _on_slurm(lab, slurm_env)
    run = lab.run_yaml([model]).replace("datasets: [DCAgent/tiny_a]", f"datasets: [{dataset}]")
    lab.apply(_slurm_cluster_yaml(lab, REPO / "eval" / "slurm" / "eval_harbor.sbatch"),
              run + "  agent: oracle\n  nAttempts: 1\n  upload: {maxInfraErrorFraction: 0.25}\n")  # noreward: infra
    lab.wait_condition("Ready", timeout_s=300)
    assert lab.evalrun()["status"]["summary"]["done"] == 1
    tag_dirs = list((lab.root / "jobs").glob("ev_*"))
    assert len(tag_dirs) == 1 and (tag_dirs[0] / "result.json").exists(), "a real Harbor run dir"


@pytest.mark.slurm
def test_delete_with_cancel_cancels_the_running_slurm_job(lab: Lab, slurm_env: dict[str, str]):
    sleeper = lab.root / "sleeper.sbatch"
    sleeper.write_text('#!/bin/bash\nmkdir -p "$EVAL_JOBS_DIR"\nexec sleep 600\n')
    sleeper.chmod(0o755)
    _on_slurm(lab, slurm_env)
    lab.apply(_slurm_cluster_yaml(lab, sleeper),
              lab.run_yaml([f"org/del{lab.namespace.removeprefix('t-')}"], extra="  deletionPolicy: Cancel"))
    eventually(lambda: ((lab.evalrun().get("status") or {}).get("summary") or {}).get("running") == 1, "the job to run")
    queued = _slurm_jobs(slurm_env, lab.namespace.removeprefix("t-"))
    assert len(queued) == 1, queued
    lab.kube.kubectl("delete", "evalrun/demo", "-n", lab.namespace, "--wait=true", "--timeout=120s")
    eventually(lambda: _slurm_jobs(slurm_env, lab.namespace.removeprefix("t-")) == [], "scancel", timeout_s=120)


def _on_slurm(lab: Lab, slurm_env: dict[str, str]) -> None:
    """The operator reaches the lab SLURM cluster (its SLURM_CONF) from here on."""
    lab.kube.env["SLURM_CONF"] = slurm_env["SLURM_CONF"]
    lab.start_operator()


def _slurm_cluster_yaml(lab: Lab, script: Path) -> str:
    return f"""
apiVersion: evalrun.io/v1alpha1
kind: EvalCluster
metadata: {{name: local, namespace: {lab.namespace}}}
spec:
  scheduler: {{type: slurm, submissionsPerMinute: 60}}
  partition: debug
  jobsDir: {lab.root}/jobs
  logsDir: {lab.root}/logs
  jobScript: {script}
  timeLimit: "30"
"""


def _slurm_jobs(env: dict[str, str], marker: str) -> list[str]:
    """Queued or running SLURM jobs whose name carries `marker`."""
    out = subprocess.run(["squeue", "-h", "-o", "%i|%j|%T"], env=env, capture_output=True, text=True,
                         check=True).stdout
    return [line for line in out.splitlines() if marker in line and line.split("|")[2] in ("PENDING", "RUNNING")]
