"""Bench: what a hostile namespace costs another one, on the lab API server (scripts/kube-up.sh). Printed, never
asserted (issue 18).

One operator (local jobs allowed, as on a single-user host) serves two namespaces. The innocent one applies an
EvalRun of one cell and times its first status and its Ready, alone (the baseline) and then while the hostile one
does its worst (`--hostile`):

- `silent`: `--silent` EvalClusters whose ssh host accepts connections and never answers (each pass on them waits
  for ssh's timeouts) and a FIFO in place of a local job's `job.json`;
- `foreign`: 100,000 foreign `ev_*` entries in the jobs dir of its EvalRun's cluster;
- `cells`: 40 EvalRuns × 10,000 cells (suspended: their passes observe and plan, as any pass does, but launch
  nothing — 50,000 real jobs would measure this host's two cores, not the operator); the namespace's cell quota
  serves 5 of them and refuses the rest.

The operator's resident memory is printed at the end.

Usage: python bench/operator_fairness.py [--hostile silent|foreign|cells] [--silent 12] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

from operator_passes import FAKE_HARBOR, kube_env, kubectl  # noqa: E402


def silent_host() -> int:
    """A port that accepts connections and never says a word (each held open until the bench ends)."""
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def accept_for_ever() -> None:
        while True:
            held.append(server.accept()[0])

    threading.Thread(target=accept_for_ever, daemon=True).start()
    return int(server.getsockname()[1])


def local_cluster(namespace: str) -> str:
    return f"""apiVersion: evalrun.io/v1alpha1
kind: EvalCluster
metadata: {{name: local, namespace: {namespace}}}
spec: {{scheduler: {{type: local}}, jobsDir: jobs, logsDir: logs, jobScript: {FAKE_HARBOR}, timeLimit: "01:00:00",
       env: {{FAKE_HARBOR_TASKS: "2", FAKE_HARBOR_TRIAL_SECONDS: "0.05"}}}}
"""


def silent_cluster(namespace: str, index: int, port: int) -> str:
    return f"""apiVersion: evalrun.io/v1alpha1
kind: EvalCluster
metadata: {{name: silent-{index}, namespace: {namespace}}}
spec: {{scheduler: {{type: slurm, ssh: "root@127.0.0.1:{port}", sshKeySecretRef: {{name: login, key: key}},
       knownHostsSecretRef: {{name: login, key: hosts}}}}, jobsDir: /silent/jobs, logsDir: /silent/logs,
       jobScript: /silent/eval.sbatch, timeLimit: "01:00:00"}}
"""


def run(namespace: str, name: str, cluster: str, model: str) -> str:
    return f"""apiVersion: evalrun.io/v1alpha1
kind: EvalRun
metadata: {{name: {name}, namespace: {namespace}}}
spec: {{cluster: {cluster}, models: ["{model}"], datasets: [DCAgent/bench], forceEval: true}}
"""


def big_run(namespace: str, name: str) -> str:
    """10,000 cells, the per-EvalRun maximum: 100 models × 100 datasets."""
    models = [f"org/{name}-m{index}" for index in range(100)]
    datasets = [f"DCAgent/{name}-d{index}" for index in range(100)]
    return f"""apiVersion: evalrun.io/v1alpha1
kind: EvalRun
metadata: {{name: {name}, namespace: {namespace}}}
spec: {{cluster: local, models: {json.dumps(models)}, datasets: {json.dumps(datasets)}, suspend: true}}
"""


def silent_documents(env: dict[str, str], root: Path, hostile: str, silent: int) -> list[str]:
    key = root / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    port = silent_host()
    hosts = f"[127.0.0.1]:{port} {' '.join(Path(f'{key}.pub').read_text().split()[:2])}\n"
    kubectl(env, "create", "secret", "generic", "login", "-n", hostile, f"--from-file=key={key}",
            f"--from-literal=hosts={hosts}")
    fifo_job = root / hostile / "logs" / ".local-scheduler" / "jobs" / "1"
    fifo_job.mkdir(parents=True)
    os.mkfifo(fifo_job / "job.json")
    documents = [local_cluster(hostile), run(hostile, "fifo", "local", "org/fifo-8B")]
    for index in range(silent):
        documents += [silent_cluster(hostile, index, port),
                      run(hostile, f"silent-{index}", f"silent-{index}", f"org/silent{index}-8B")]
    return documents


def foreign_documents(root: Path, hostile: str, entries: int = 100_000) -> list[str]:
    jobs = root / hostile / "jobs"
    for index in range(entries):
        (jobs / f"ev_x__y__{index:012x}__a1").mkdir(parents=True)
    return [local_cluster(hostile), run(hostile, "foreign", "local", "org/foreign-8B")]


def resident_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:"))) / 1024


def timed_evalrun(env: dict[str, str], namespace: str, name: str, model: str) -> tuple[float, float]:
    """Seconds from `kubectl apply` to the EvalRun's first status, and to Ready."""
    start = time.monotonic()
    kubectl(env, "apply", "-f", "-", stdin=run(namespace, name, "local", model))
    first = ready = None
    while ready is None:
        status = json.loads(kubectl(env, "get", "evalrun", name, "-n", namespace, "-o", "json")).get("status") or {}
        conditions = status.get("conditions") or []
        now = time.monotonic() - start
        if conditions and first is None:
            first = now
        if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions):
            ready = now
        if now > 600:
            raise SystemExit(f"{namespace}/{name}: not Ready after 600 s")
        time.sleep(0.1)
    assert first is not None
    return first, ready


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hostile", choices=("silent", "foreign", "cells"), default="silent")
    parser.add_argument("--silent", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    env = kube_env()
    root = Path(tempfile.mkdtemp(prefix="evalrun-fairness-bench-"))
    stamp = int(time.time())
    innocent, hostile = f"innocent-{stamp}", f"hostile-{stamp}"
    for namespace in (innocent, hostile):
        kubectl(env, "create", "namespace", namespace)
    kubectl(env, "apply", "-f", "-", stdin=local_cluster(innocent))
    operator = subprocess.Popen(
        [sys.executable, "-m", "controller.entry.cli", "operator", "--standalone", "-n", innocent, "-n", hostile,
         "--base-dir", str(root), "--store", f"sqlite:///{root}/store.db", "--interval", "2",
         "--allow-local-scheduler", "--allowed-path-root", str(REPO), "--allowed-ssh-host", "127.0.0.1"],
        env={**env, "PYTHONPATH": str(REPO)}, cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        baseline = [timed_evalrun(env, innocent, f"alone-{i}", f"org/alone{i}-8B") for i in range(args.rounds + 1)][1:]

        documents = {"silent": lambda: silent_documents(env, root, hostile, args.silent),
                     "foreign": lambda: foreign_documents(root, hostile),
                     "cells": lambda: [local_cluster(hostile), *(big_run(hostile, f"big-{i}") for i in range(40))],
                     }[args.hostile]()
        kubectl(env, "apply", "-f", "-", stdin="---\n".join(documents))
        time.sleep(5)  # the hostile passes under way (a bench: the figures below are what is measured)
        loaded = [timed_evalrun(env, innocent, f"loaded-{i}", f"org/loaded{i}-8B") for i in range(args.rounds)]

        hostility = {"silent": f"{args.silent} silent-host EvalClusters + a FIFO",
                     "foreign": "100,000 foreign run-dir entries", "cells": "40 EvalRuns x 10,000 cells"}[args.hostile]
        for label, figures in (("alone", baseline), (f"beside {hostility}", loaded)):
            print(f"innocent EvalRun {label}: first status median {statistics.median(f for f, _ in figures):.2f} s, "
                  f"Ready median {statistics.median(r for _, r in figures):.2f} s over {len(figures)} EvalRuns")
        ratio = statistics.median(r for _, r in loaded) / statistics.median(r for _, r in baseline)
        print(f"Ready, loaded / alone: {ratio:.2f}; operator RSS {resident_mib(operator.pid):.0f} MiB")
    finally:
        for namespace in (innocent, hostile):
            subprocess.run(["kubectl", "delete", "evalruns", "--all", "-n", namespace, "--timeout=120s"], env=env,
                           capture_output=True, check=False)
        operator.terminate()  # kopf lets the handlers under way finish: those waiting on silent passes take long
        try:
            operator.wait(timeout=180)
        except subprocess.TimeoutExpired:
            operator.kill()


if __name__ == "__main__":
    main()
