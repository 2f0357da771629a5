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
  serves 5 of them and refuses the rest;
- `egress` (issue 27): 4 EvalRuns whose jobs print a 20 MB line of `x` under a failure-catalog pattern `(x+x+)+y`,
  whose tracking server and webhook answer a byte a second (allowed by the admin's --allowed-mlflow-uri /
  --allowed-webhook-url, as an in-cluster relay would be). The innocent EvalRuns then upload to a real MLflow
  server and post to a webhook of their own, alone and beside it.

The operator's resident memory is printed at the end.

Usage: python bench/operator_fairness.py [--hostile silent|foreign|cells|egress] [--silent 12] [--rounds 3]
"""

from __future__ import annotations

import argparse
import contextlib
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
sys.path.insert(0, str(REPO))

from operator_passes import FAKE_HARBOR, kube_env, kubectl  # noqa: E402

from tests.fixtures.mlflow_server import MlflowServer  # noqa: E402
from tests.fixtures.trickle import http_server  # noqa: E402
from tests.fixtures.webhook import webhook_server  # noqa: E402


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


def run(namespace: str, name: str, cluster: str, model: str, extra: str = "") -> str:
    return f"""apiVersion: evalrun.io/v1alpha1
kind: EvalRun
metadata: {{name: {name}, namespace: {namespace}}}
spec: {{cluster: {cluster}, models: ["{model}"], datasets: [DCAgent/bench], forceEval: true{extra}}}
"""


def webhook_secret(namespace: str, url: str) -> str:
    return f"apiVersion: v1\nkind: Secret\nmetadata: {{name: alerts, namespace: {namespace}}}\nstringData: {{url: '{url}'}}\n"


def egress(tracking: str) -> str:
    """An EvalRun's upload to `tracking` and its webhook (Secret alerts)."""
    return (f", upload: {{mlflow: true, mlflowTrackingUri: '{tracking}'}}, notify: {{webhooks: [{{name: alerts, "
            "secretRef: {name: alerts, key: url}, events: [Stalled, Failed, Ready, Completed]}]}")


def egress_documents(root: Path, hostile: str, tracking: str, webhook: str) -> list[str]:
    script = root / "hostile-job.sh"
    script.write_text(f"#!/bin/sh\nhead -c 20000000 /dev/zero | tr '\\0' x\necho\nexec {FAKE_HARBOR} \"$@\"\n")
    script.chmod(0o755)
    cluster = local_cluster(hostile).replace(str(FAKE_HARBOR), str(script)).replace(
        'FAKE_HARBOR_TRIAL_SECONDS: "0.05"', 'FAKE_HARBOR_TRIAL_SECONDS: "10"').replace(
        "}}\n", '}, failureCatalog: [{name: backtrack, patterns: ["(x+x+)+y"], when: running, remedy: hold, '
                "advice: backtracks}]}\n")
    return [cluster, webhook_secret(hostile, webhook),
            *(run(hostile, f"egress-{i}", "local", f"org/egress{i}-8B", egress(tracking)) for i in range(4))]



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


def timed_evalrun(env: dict[str, str], namespace: str, name: str, model: str, extra: str = "") -> tuple[float, float]:
    """Seconds from `kubectl apply` to the EvalRun's first status, and to Ready."""
    start = time.monotonic()
    kubectl(env, "apply", "-f", "-", stdin=run(namespace, name, "local", model, extra))
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
    parser.add_argument("--hostile", choices=("silent", "foreign", "cells", "egress"), default="silent")
    parser.add_argument("--silent", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    env = kube_env()
    root = Path(tempfile.mkdtemp(prefix="evalrun-fairness-bench-"))
    with contextlib.ExitStack() as servers:
        innocent_extra, allowed = "", []
        if args.hostile == "egress":
            tracking = MlflowServer(root / "mlflow")
            tracking.start()
            servers.callback(tracking.stop)
            slow_tracking = servers.enter_context(http_server(trickle_every_s=1))
            slow_hook = servers.enter_context(http_server(trickle_every_s=1))
            hook = servers.enter_context(webhook_server())
            innocent_extra = egress(tracking.url)
            allowed = ["--allowed-mlflow-uri", tracking.url, "--allowed-mlflow-uri", slow_tracking.url,
                       "--allowed-webhook-url", slow_hook.url, "--allowed-webhook-url", f"http://127.0.0.1:{hook.port}"]
        bench(args, env, root, innocent_extra, allowed,
              (lambda hostile: egress_documents(root, hostile, slow_tracking.url, slow_hook.url + "/hook"),
               lambda innocent: [webhook_secret(innocent, hook.url)]) if args.hostile == "egress" else None)


def bench(args: argparse.Namespace, env: dict[str, str], root: Path, innocent_extra: str, allowed: list[str],
          egress_setup: tuple | None) -> None:
    stamp = int(time.time())
    innocent, hostile = f"innocent-{stamp}", f"hostile-{stamp}"
    for namespace in (innocent, hostile):
        kubectl(env, "create", "namespace", namespace)
        kubectl(env, "apply", "-n", namespace, "-k", str(REPO / "manifests" / "tenant"))  # Secret reads opt-in
    kubectl(env, "apply", "-f", "-", stdin="---\n".join(
        [local_cluster(innocent), *(egress_setup[1](innocent) if egress_setup else [])]))
    operator = subprocess.Popen(
        [sys.executable, "-m", "controller.entry.cli", "operator", "--standalone", "-n", innocent, "-n", hostile,
         "--base-dir", str(root), "--store", f"sqlite:///{root}/store.db", "--interval", "2",
         "--allow-local-scheduler", "--allowed-path-root", str(REPO), "--allowed-path-root", str(root),
         "--allowed-ssh-host", "127.0.0.1", *allowed],
        env={**env, "PYTHONPATH": str(REPO)}, cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        baseline = [timed_evalrun(env, innocent, f"alone-{i}", f"org/alone{i}-8B", innocent_extra)
                    for i in range(args.rounds + 1)][1:]

        documents = {"silent": lambda: silent_documents(env, root, hostile, args.silent),
                     "foreign": lambda: foreign_documents(root, hostile),
                     "cells": lambda: [local_cluster(hostile), *(big_run(hostile, f"big-{i}") for i in range(40))],
                     "egress": lambda: egress_setup[0](hostile) if egress_setup else [],
                     }[args.hostile]()
        kubectl(env, "apply", "-f", "-", stdin="---\n".join(documents))
        time.sleep(15)  # the hostile passes under way, its jobs printing (a bench: the figures below are measured)
        loaded = [timed_evalrun(env, innocent, f"loaded-{i}", f"org/loaded{i}-8B", innocent_extra)
                  for i in range(args.rounds)]

        hostility = {"silent": f"{args.silent} silent-host EvalClusters + a FIFO",
                     "foreign": "100,000 foreign run-dir entries", "cells": "40 EvalRuns x 10,000 cells",
                     "egress": "4 EvalRuns: 20 MB lines under (x+x+)+y, a trickling tracking server and webhook",
                     }[args.hostile]
        for label, figures in (("alone", baseline), (f"beside {hostility}", loaded)):
            print(f"innocent EvalRun {label}: first status median {statistics.median(f for f, _ in figures):.2f} s, "
                  f"Ready median {statistics.median(r for _, r in figures):.2f} s over {len(figures)} EvalRuns")
        first = statistics.median(f for f, _ in loaded) / statistics.median(f for f, _ in baseline)
        ratio = statistics.median(r for _, r in loaded) / statistics.median(r for _, r in baseline)
        print(f"first status, loaded / alone: {first:.2f}; Ready, loaded / alone: {ratio:.2f}; "
              f"operator RSS {resident_mib(operator.pid):.0f} MiB")
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
