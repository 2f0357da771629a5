"""Operator figures on the lab API server (scripts/kube-up.sh), printed, never asserted.

1. apply → first submission: a warm operator, an EvalRun applied with kubectl, time until its first job
   exists (the local scheduler's job record), over several EvalRuns.
2. a fleet of N EvalRuns × M cells (suspended, so passes observe and plan but launch nothing — 2,000 real jobs
   would measure this host, not the operator): time until every EvalRun has a status, the mean pass time from
   the operator's own Prometheus histogram, and the operator's resident memory.

Usage: python bench/operator_passes.py [N_RUNS] [CELLS_PER_RUN]   (defaults 200 × 10)
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from controller.adapters.scheduler.local import LocalScheduler

REPO = Path(__file__).resolve().parents[1]
FAKE_HARBOR = REPO / "specs" / "demo" / "fake_harbor.py"


def kube_env() -> dict[str, str]:
    subprocess.run(["bash", str(REPO / "scripts" / "kube-up.sh")], check=True, capture_output=True)
    lab = os.environ.get("KUBE_LAB", "/tmp/evalrun-kube")
    out = subprocess.run(["bash", "-c", f"source {lab}/env.sh && env -0"], check=True, capture_output=True, text=True)
    return dict(line.split("=", 1) for line in out.stdout.split("\0") if "=" in line)


def kubectl(env: dict[str, str], *args: str, stdin: str | None = None) -> str:
    return subprocess.run(["kubectl", *args], env=env, input=stdin, check=True, capture_output=True, text=True).stdout


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def cluster_doc(namespace: str) -> str:
    return f"""apiVersion: evalrun.io/v1alpha1
kind: EvalCluster
metadata: {{name: local, namespace: {namespace}}}
spec: {{scheduler: {{type: local}}, jobsDir: jobs, logsDir: logs, jobScript: {FAKE_HARBOR}, timeLimit: "01:00:00",
       env: {{FAKE_HARBOR_HANG_AFTER: "0"}}}}
"""


def run_doc(namespace: str, name: str, models: list[str], suspend: bool) -> str:
    return f"""apiVersion: evalrun.io/v1alpha1
kind: EvalRun
metadata: {{name: {name}, namespace: {namespace}}}
spec: {{cluster: local, models: {json.dumps(models)}, datasets: [DCAgent/bench], suspend: {str(suspend).lower()}}}
"""


def wait(condition, timeout_s: float = 900.0, step_s: float = 0.05) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit("timed out")
        time.sleep(step_s)


def main(n_runs: int, cells: int) -> None:
    env = kube_env()
    root = Path(tempfile.mkdtemp(prefix="evalrun-operator-bench-"))
    namespace = f"bench-{int(time.time())}"
    kubectl(env, "create", "namespace", namespace)
    kubectl(env, "apply", "-f", "-", stdin=cluster_doc(namespace))
    metrics_port = free_port()
    operator = subprocess.Popen(
        [sys.executable, "-m", "controller.entry.cli", "operator", "--standalone", "-n", namespace, "--base-dir",
         str(root), "--store", f"sqlite:///{root}/store.db", "--interval", "30", "--metrics-port", str(metrics_port),
         # a single-user host: local jobs, the repo's job script, and a fleet bigger than the default quotas
         "--allow-local-scheduler", "--allowed-path-root", str(REPO), "--max-evalruns-per-namespace", "100000",
         "--max-cells-per-namespace", "100000000"],
        env=env, cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    state = root / namespace / "logs" / ".local-scheduler"  # a namespace's relative paths: under --base-dir/<ns>/
    jobs = state / "jobs"
    try:
        latencies = []
        for i in range(6):  # the first one waits for the operator to start watching: a warm-up, not counted
            before = len(list(jobs.glob("*"))) if jobs.exists() else 0
            start = time.monotonic()
            kubectl(env, "apply", "-f", "-", stdin=run_doc(namespace, f"latency-{i}", [f"org/lat{i}-8B"], False))
            wait(lambda b=before: jobs.exists() and len(list(jobs.glob("*/job.json"))) > b)
            latencies.append(time.monotonic() - start)
        latencies = latencies[1:]
        print(f"apply → first submission: median {statistics.median(latencies):.2f} s, "
              f"max {max(latencies):.2f} s over {len(latencies)} EvalRuns (warm operator, local scheduler)")

        start = time.monotonic()
        documents = [run_doc(namespace, f"fleet-{i}", [f"org/f{i}m{j}-8B" for j in range(cells)], True)
                     for i in range(n_runs)]
        kubectl(env, "apply", "-f", "-", stdin="---\n".join(documents))
        applied = time.monotonic() - start

        def all_have_status() -> bool:
            items = json.loads(kubectl(env, "get", "evalruns", "-n", namespace, "-o", "json"))["items"]
            return sum(1 for item in items if (item.get("status") or {}).get("lastPass")) >= n_runs + 6

        wait(all_have_status, step_s=1.0)
        first_round = time.monotonic() - start
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics").read().decode()
        total = float(next(line.split()[1] for line in metrics.splitlines() if line.startswith("evalrun_pass_seconds_sum")))
        count = float(next(line.split()[1] for line in metrics.splitlines()
                           if line.startswith("evalrun_pass_seconds_count")))
        rss_kib = int(next(line.split()[1] for line in Path(f"/proc/{operator.pid}/status").read_text().splitlines()
                           if line.startswith("VmRSS")))
        print(f"fleet: {n_runs} EvalRuns × {cells} cells (suspended), applied in {applied:.1f} s; every EvalRun had "
              f"a status after {first_round:.1f} s")
        print(f"operator pass: mean {total / count * 1000:.0f} ms over {count:.0f} passes; "
              f"operator RSS {rss_kib / 1024:.0f} MiB")
    finally:  # delete while the operator runs (it holds the finalizers), then stop it and the jobs
        subprocess.run(["kubectl", "delete", "evalruns", "--all", "-n", namespace, "--timeout=600s"], env=env,
                       capture_output=True, check=False)
        operator.terminate()
        operator.wait(timeout=60)
        scheduler = LocalScheduler(state)
        for job in scheduler.observe():
            if job.state.active:
                scheduler.cancel(job.job_id)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 200, int(sys.argv[2]) if len(sys.argv) > 2 else 10)
