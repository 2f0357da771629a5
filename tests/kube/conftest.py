"""The operator against a real Kubernetes API server (scripts/kube-up.sh: etcd + kube-apiserver built from Go
modules, TLS, RBAC), driven with the real `kubectl`, running as a real `evalctl operator` process under the
service account and RBAC of manifests/ — not as admin; each test's namespace opts in with manifests/tenant/.

No controller-manager runs: namespaces are never deleted (each test gets a fresh one), and the operator's
service-account token is requested with `kubectl create token`. Synchronisation is on observable state only.
"""

from __future__ import annotations

import json
import os
import random
import signal
import string
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from controller.adapters.scheduler.local import LocalScheduler
from controller.core.observed import ObservedJob
from tests.fixtures.evalctl import cancel_live_jobs, wait_until

REPO = Path(__file__).resolve().parents[2]
FAKE_HARBOR = REPO / "specs" / "demo" / "fake_harbor.py"
OPERATOR_NAMESPACE, OPERATOR_SA = "evalrun-system", "evalrun-operator"
TENANT_MANIFESTS = REPO / "manifests" / "tenant"
DEADLINE_S = 120.0


class Kube:
    """kubectl as admin (the test's hands) and the environment that reaches the lab API server."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env

    def kubectl(self, *args: str, check: bool = True, stdin: str | None = None,
                env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(["kubectl", *args], env=env or self.env, input=stdin, capture_output=True, text=True,
                              timeout=120, check=False)
        if check and done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)}: rc={done.returncode}\n{done.stdout}\n{done.stderr}")
        return done

    def json(self, *args: str) -> Any:
        return json.loads(self.kubectl(*args, "-o", "json").stdout)


@pytest.fixture(scope="session")
def kube() -> Kube:
    if os.geteuid() != 0:
        pytest.skip("the Kubernetes lab needs root")
    up = subprocess.run(["bash", str(REPO / "scripts" / "kube-up.sh")], capture_output=True, text=True,
                        timeout=3600, stdin=subprocess.DEVNULL, check=False)
    if up.returncode != 0:
        pytest.fail(f"kube-up.sh failed:\n{up.stdout}\n{up.stderr}", pytrace=False)
    lab = os.environ.get("KUBE_LAB", "/tmp/evalrun-kube")
    sourced = subprocess.run(["bash", "-c", f"source {lab}/env.sh && env -0"], capture_output=True, text=True,
                             check=True)
    env = dict(line.split("=", 1) for line in sourced.stdout.split("\0") if "=" in line)
    the_kube = Kube(env)
    # CRDs first: on a fresh server, one apply of CRDs and the peering object that uses them can race
    # ("no matches for kind ClusterKopfPeering … ensure CRDs are installed first")
    the_kube.kubectl("apply", "-k", str(REPO / "crds"))
    the_kube.kubectl("wait", "--for=condition=Established", "crd/evalruns.evalrun.io", "crd/evalclusters.evalrun.io",
                     "crd/clusterkopfpeerings.zalando.org", "crd/kopfpeerings.zalando.org")
    the_kube.kubectl("apply", "-k", str(REPO / "manifests"))  # CRDs, namespace, service account, RBAC, peering
    purge_evalruns(the_kube, "--all-namespaces")  # an earlier session's leftovers would meet an all-namespace operator
    return the_kube


def purge_evalruns(kube: Kube, *where: str) -> None:
    """Drop EvalRuns without an operator: finalizers cleared, then deleted (the store they used is gone)."""
    for item in kube.json("get", "evalruns", *where).get("items", []):
        meta = item["metadata"]
        at = ("evalrun", meta["name"], "-n", meta["namespace"])
        kube.kubectl("patch", *at, "--type=merge", "-p", '{"metadata":{"finalizers":null}}', check=False)
        kube.kubectl("delete", *at, "--wait=false", "--ignore-not-found", check=False)


@pytest.fixture(scope="session")
def operator_kubeconfig(kube: Kube, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A kubeconfig that is the operator's service account, nothing more."""
    return service_account_kubeconfig(kube, OPERATOR_NAMESPACE, OPERATOR_SA,
                                      tmp_path_factory.mktemp("operator") / "kubeconfig")


def service_account_kubeconfig(kube: Kube, namespace: str, account: str, path: Path) -> Path:
    token = kube.kubectl("create", "token", account, "-n", namespace, "--duration=4h").stdout.strip()
    config = json.loads(kube.kubectl("config", "view", "--raw", "-o", "json").stdout)
    config["users"] = [{"name": "operator", "user": {"token": token}}]
    config["contexts"][0]["context"]["user"] = "operator"
    path.write_text(json.dumps(config))
    return path


class Lab:
    """One test's namespace, spec files, store, local cluster, and the operator process(es)."""

    def __init__(self, kube: Kube, root: Path, kubeconfig: Path) -> None:
        self.kube, self.root, self.kubeconfig = kube, root, kubeconfig
        self.namespace = "t-" + "".join(random.choices(string.ascii_lowercase, k=8))
        self.store = f"sqlite:///{root}/store.db"
        # the operator keeps a namespaced EvalCluster's relative paths under --base-dir/<namespace>/
        self.scheduler = LocalScheduler(root / self.namespace / "logs" / ".local-scheduler")
        self.operators: list[subprocess.Popen[str]] = []
        kube.kubectl("create", "namespace", self.namespace)
        # the operator reads Secrets only where a namespace opts in (docs/MULTI_TENANT.md, "RBAC")
        kube.kubectl("apply", "-n", self.namespace, "-k", str(TENANT_MANIFESTS))

    # ------------------------------------------------------------------ resources

    def cluster_yaml(self, env: dict[str, str] | None = None, secret_env: str = "", namespace: str | None = None) -> str:
        env = {"FAKE_HARBOR_TASKS": "4", "FAKE_HARBOR_TRIAL_SECONDS": "0.05", **(env or {})}
        return f"""
apiVersion: evalrun.io/v1alpha1
kind: EvalCluster
metadata: {{name: local, namespace: {namespace or self.namespace}}}
spec:
  scheduler: {{type: local}}
  jobsDir: jobs
  logsDir: logs
  jobScript: {FAKE_HARBOR}
  timeLimit: "01:00:00"
  env: {json.dumps(env)}
{secret_env}"""

    def run_yaml(self, models: list[str], *, name: str = "demo", extra: str = "", namespace: str | None = None,
                 cluster: str = "cluster: local") -> str:
        return f"""
apiVersion: evalrun.io/v1alpha1
kind: EvalRun
metadata: {{name: {name}, namespace: {namespace or self.namespace}}}
spec:
  {cluster}
  models: {json.dumps(models)}
  datasets: [DCAgent/tiny_a]
{extra}"""

    def stall_on_secret(self, secret: str) -> list[dict[str, Any]]:
        """Apply a cluster whose secretEnv needs key `api-key` of Secret `secret`, and an EvalRun on it; the pass
        must stall on it (ActionsFailed) with nothing submitted. Returns the status's attention."""
        cluster = self.cluster_yaml(secret_env="  secretEnv: [{name: DAYTONA_API_KEY, secretRef: {name: "
                                               f"{secret}, key: api-key}}}}]")
        self.apply(cluster, self.run_yaml(["org/a-8B"]))
        stalled = self.wait_condition("Stalled")
        assert stalled["reason"] == "ActionsFailed", stalled
        assert self.jobs() == [], "nothing is submitted without its secret"
        attention: list[dict[str, Any]] = self.evalrun()["status"]["attention"]
        return attention

    def apply(self, *documents: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.kube.kubectl("apply", "-f", "-", stdin="\n---\n".join(documents), check=check)

    def evalrun(self, name: str = "demo") -> dict[str, Any]:
        found: dict[str, Any] = self.kube.json("get", "evalrun", name, "-n", self.namespace)
        return found

    def condition(self, kind: str, name: str = "demo") -> dict[str, Any] | None:
        conditions = (self.evalrun(name).get("status") or {}).get("conditions") or []
        return next((c for c in conditions if c["type"] == kind), None)

    def wait_condition(self, kind: str, status: str = "True", name: str = "demo",
                       timeout_s: float = DEADLINE_S) -> dict[str, Any]:
        found = wait_until(lambda: (c := self.condition(kind, name)) is not None and c["status"] == status and c,
                           f"{kind}={status} on evalrun/{name}", timeout_s=timeout_s, step_s=0.3)
        assert isinstance(found, dict)
        return found

    def events(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.kube.json("get", "events", "-n", self.namespace)["items"]
        return items

    def jobs(self) -> list[ObservedJob]:
        return list(self.scheduler.observe())

    # ------------------------------------------------------------------ the operator

    def start_operator(self, *extra: str, kill_at: str | None = None, peered: bool = False,
                       trusted_host: bool = True, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        """Watching this test's namespace, standalone; `peered`: all namespaces, in the manifests' peering.

        `trusted_host`: the policy of a single-user host (local jobs, paths under this test's dir and the repo);
        False: the default policy of a shared operator."""
        policy = ("--allow-local-scheduler", "--allowed-path-root", str(self.root), "--allowed-path-root",
                  str(REPO)) if trusted_host else ()
        env = {**self.kube.env, "KUBECONFIG": str(self.kubeconfig), **(env or {})}
        env.pop("EVALCTL_KILL_AT", None)
        if kill_at:
            env["EVALCTL_KILL_AT"] = kill_at
        with open(self.root / f"operator-{len(self.operators)}.log", "w") as log:  # the child keeps its own copy
            proc = subprocess.Popen([sys.executable, "-m", "controller.entry.cli", "operator", "--store", self.store,
                                     "--base-dir", str(self.root), "--interval", "2",
                                     *(() if peered else ("-n", self.namespace, "--standalone")), *policy, *extra],
                                    env=env, cwd=self.root, stdout=log,
                                    stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL)
        self.operators.append(proc)
        return proc

    def operator_log(self) -> str:
        return "".join(p.read_text() for p in sorted(self.root.glob("operator-*.log")))

    def stop_operators(self, sig: int = signal.SIGTERM) -> None:
        for proc in self.operators:
            if proc.poll() is None:
                proc.send_signal(sig)
                proc.wait(timeout=60)

    def cleanup(self) -> None:
        """Delete this test's EvalRuns while an operator still runs (their finalizers), then stop everything."""
        if not any(p.poll() is None for p in self.operators):
            self.start_operator()
        self.kube.kubectl("delete", "evalruns", "--all", "-n", self.namespace, "--wait=true", "--timeout=90s",
                          check=False)
        purge_evalruns(self.kube, "-n", self.namespace)  # what a killed operator left behind
        self.stop_operators()
        cancel_live_jobs(self.scheduler)


@pytest.fixture
def lab(kube: Kube, operator_kubeconfig: Path, tmp_path: Path) -> Iterator[Lab]:
    the_lab = Lab(kube, tmp_path, operator_kubeconfig)
    try:
        yield the_lab
    finally:
        the_lab.cleanup()


def eventually(condition: Callable[[], object], what: str, timeout_s: float = DEADLINE_S) -> object:
    return wait_until(condition, what, timeout_s=timeout_s, step_s=0.3)
