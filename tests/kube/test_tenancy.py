"""Tenants on the real API server (issue 17): a service account with rights in its own namespace only writes
what the issue's attacks wrote, against the operator's default policy (deny by default).

Each attack must end refused — by the API server's schema, by RBAC, or Stalled with a reason naming the policy —
with nothing of the tenant's run on the operator's host, no credential of the operator sent to an endpoint the
tenant named (loopback listeners record what arrives), and the operator still serving the other namespaces.
"""

from __future__ import annotations

import http.server
import json
import socket
import sqlite3
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.adapters.scheduler.local import LocalScheduler
from tests.fixtures.evalctl import cancel_live_jobs
from tests.kube.conftest import FAKE_HARBOR, Lab, eventually, purge_evalruns, service_account_kubeconfig
from tests.ssh.conftest import SshLab, ssh_lab

__all__ = ["ssh_lab"]
pytestmark = pytest.mark.kube

TENANT_ROLE = """
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: tenant}
rules:
  - apiGroups: [evalrun.io]
    resources: [evalruns, evalclusters]
    verbs: ["*"]
  - apiGroups: [""]
    resources: [secrets]
    verbs: ["*"]
"""
OPERATOR_LOGIN = {"MLFLOW_TRACKING_USERNAME": "operator", "MLFLOW_TRACKING_PASSWORD": "op-pw-5f0c1e"}
FAKE_TOKEN = "eyJhbGciOiJSUzI1NiJ9.operator-token-7d3a"  # what an sshConfig pointed at the operator's token shows


class Tenant:
    """`kubectl` as a ServiceAccount with every right on EvalRuns, EvalClusters and Secrets of one namespace."""

    def __init__(self, lab: Lab) -> None:
        self.lab = lab
        kube, ns = lab.kube, lab.namespace
        kube.kubectl("create", "serviceaccount", "tenant", "-n", ns)
        kube.kubectl("apply", "-n", ns, "-f", "-", stdin=TENANT_ROLE)
        kube.kubectl("create", "rolebinding", "tenant", "-n", ns, "--role=tenant", f"--serviceaccount={ns}:tenant")
        config = service_account_kubeconfig(kube, ns, "tenant", lab.root / "tenant-kubeconfig")
        self.env = {**kube.env, "KUBECONFIG": str(config)}

    def apply(self, *documents: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.lab.kube.kubectl("apply", "-f", "-", stdin="\n---\n".join(documents), env=self.env, check=check)


class Listener:
    """A loopback port that records what reaches it: HTTP requests (their headers) or bare TCP connections."""

    def __init__(self, speaks_http: bool) -> None:
        self.seen: list[dict[str, str]] = []
        if speaks_http:
            seen = self.seen

            class Record(http.server.BaseHTTPRequestHandler):
                def _any(self) -> None:
                    seen.append({"path": self.path, **{k.lower(): v for k, v in self.headers.items()}})
                    self.send_response(404)
                    self.end_headers()

                do_GET = do_POST = do_PUT = do_PATCH = _any

                def log_message(self, *args: object) -> None:
                    pass

            self.server: socket.socket | http.server.HTTPServer = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                                                                                   Record)
            self.port = self.server.server_address[1]
            threading.Thread(target=self.server.serve_forever, daemon=True).start()
        else:
            self.server = socket.create_server(("127.0.0.1", 0))
            self.port = self.server.getsockname()[1]
            threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        assert isinstance(self.server, socket.socket)
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            self.seen.append({"connection": "accepted"})
            conn.close()

    def close(self) -> None:
        if isinstance(self.server, socket.socket):
            self.server.close()
        else:
            self.server.shutdown()


@pytest.fixture
def http_listener() -> Iterator[Listener]:
    listener = Listener(speaks_http=True)
    yield listener
    listener.close()


@pytest.fixture
def tcp_listener() -> Iterator[Listener]:
    listener = Listener(speaks_http=False)
    yield listener
    listener.close()


class SharedCluster:
    """A ClusterEvalCluster of the admin (cluster-scoped: a unique name, deleted afterwards), local jobs; granted
    to the lab's namespace and the other one of other_namespace(), unless `allowed` says otherwise."""

    def __init__(self, lab: Lab, env: dict[str, str] | None = None, allowed: str | None = None,
                 secret_env: str = "") -> None:
        self.lab, self.name = lab, f"shared-{lab.namespace.removeprefix('t-')}"
        allowed = allowed or f"{{names: [{lab.namespace}, {lab.namespace}-b]}}"
        self.dir = lab.root / "shared"
        self.scheduler = LocalScheduler(self.dir / "logs" / ".local-scheduler")
        env = {"FAKE_HARBOR_TASKS": "4", "FAKE_HARBOR_TRIAL_SECONDS": "0.05", **(env or {})}
        lab.apply(f"""
apiVersion: evalrun.io/v1alpha1
kind: ClusterEvalCluster
metadata: {{name: {self.name}}}
spec:
  scheduler: {{type: local}}
  jobsDir: {self.dir}/jobs
  logsDir: {self.dir}/logs
  jobScript: {FAKE_HARBOR}
  timeLimit: "01:00:00"
  env: {json.dumps(env)}
  allowedNamespaces: {allowed}
{secret_env}""")

    @property
    def ref(self) -> str:
        return f"clusterRef: {{kind: ClusterEvalCluster, name: {self.name}}}"

    def delete(self) -> None:
        cancel_live_jobs(self.scheduler)
        self.lab.kube.kubectl("delete", "clusterevalcluster", self.name, "--wait=false", check=False)


def local_cluster(lab: Lab, name: str, spec: str) -> str:
    return f"""
apiVersion: evalrun.io/v1alpha1
kind: EvalCluster
metadata: {{name: {name}, namespace: {lab.namespace}}}
spec:
  timeLimit: "01:00:00"
  logsDir: {"/logs" if "ssh:" in spec else "logs"}
{spec}"""


def stalled_message(lab: Lab, name: str) -> str:
    return str(lab.wait_condition("Stalled", name=name)["message"])


def release(lab: Lab, *namespaces: str) -> None:
    """EvalRuns deleted while the operator runs and their clusters still exist (else purged)."""
    for namespace in namespaces:
        lab.kube.kubectl("delete", "evalruns", "--all", "-n", namespace, "--wait=true", "--timeout=60s", check=False)
        purge_evalruns(lab.kube, "-n", namespace)


def other_namespace(lab: Lab) -> str:
    namespace = lab.namespace + "-b"
    lab.kube.kubectl("create", "namespace", namespace)
    return namespace


def test_a_tenants_attacks_are_refused_and_the_operator_keeps_serving_other_namespaces(
        lab: Lab, http_listener: Listener, tcp_listener: Listener) -> None:
    other = other_namespace(lab)
    shared = SharedCluster(lab)
    tenant = Tenant(lab)
    marker = lab.root / "ran-as-the-operator"
    token_file = lab.root / "token"
    token_file.write_text(FAKE_TOKEN + "\n")
    lab.start_operator("-n", other, trusted_host=False, env=OPERATOR_LOGIN)
    try:
        # options and code through names: refused by the API server's schema, before any operator sees them
        refused = tenant.apply(lab.run_yaml(["-c"], name="opt").replace("DCAgent/tiny_a", "import os;os.system('x')"),
                               check=False)
        assert refused.returncode != 0 and "spec.models[0]" in refused.stderr, refused.stderr
        assert "spec.datasets[0]" in refused.stderr, refused.stderr
        # infrastructure is the admin's: a tenant cannot make a ClusterEvalCluster
        admin_only = tenant.apply(f"apiVersion: evalrun.io/v1alpha1\nkind: ClusterEvalCluster\nmetadata: {{name: "
                                  f"{shared.name}-t}}\nspec: {{scheduler: {{type: local}}, jobsDir: /, "
                                  f"jobScript: /usr/bin/python3, timeLimit: '1'}}", check=False)
        assert admin_only.returncode != 0 and "forbidden" in admin_only.stderr.lower(), admin_only.stderr

        payload = {"P": f"open({str(marker)!r}, 'w')", "BASH_ENV": str(token_file)}
        tenant.apply(
            local_cluster(lab, "exec", f"  scheduler: {{type: local}}\n  jobsDir: jobs\n  jobScript: /usr/bin/python3"
                                       f"\n  env: {json.dumps(payload)}"),
            lab.run_yaml(["org/a-8B"], name="exec", cluster="cluster: exec"),
            local_cluster(lab, "escape", "  scheduler: {type: local}\n  jobsDir: ../../etc\n  jobScript: run.sh"),
            lab.run_yaml(["org/a-8B"], name="escape", cluster="cluster: escape"),
            local_cluster(lab, "login", f"  scheduler: {{type: slurm, ssh: 'root@127.0.0.1:{tcp_listener.port}', "
                                        f"sshConfig: {token_file}}}\n  jobsDir: /jobs\n  jobScript: /eval.sbatch"),
            lab.run_yaml(["org/a-8B"], name="login", cluster="cluster: login"),
            lab.run_yaml(["org/a-8B"], name="db", cluster=shared.ref,
                         extra=f"  upload: {{mlflow: true, mlflowTrackingUri: 'sqlite:///{lab.root}/store.db'}}"),
            lab.run_yaml(["org/b-8B"], name="steal", cluster=shared.ref,
                         extra=f"  upload: {{mlflow: true, mlflowTrackingUri: 'http://127.0.0.1:{http_listener.port}'}}"),
        )
        lab.apply(lab.run_yaml(["org/c-8B"], namespace=other, cluster=shared.ref))

        exec_why = stalled_message(lab, "exec")
        assert "operator policy" in exec_why and "--allow-local-scheduler" in exec_why, exec_why
        assert "env BASH_ENV" in exec_why, exec_why
        escape_why = stalled_message(lab, "escape")
        assert "jobsDir ../../etc leaves the namespace's directory" in escape_why, escape_why
        login_why = stalled_message(lab, "login")
        assert "ssh host 127.0.0.1 is not allowed" in login_why and "sshConfig is refused" in login_why, login_why
        assert "sshKeySecretRef" in login_why, login_why
        db_why = stalled_message(lab, "db")
        assert "mlflowTrackingUri sqlite://" in db_why and "http(s)" in db_why, db_why

        # a tracking server on loopback is an SSRF (issue 27): refused before anything dials it
        steal_why = stalled_message(lab, "steal")
        assert "mlflowTrackingUri reaches 127.0.0.1, a loopback address" in steal_why, steal_why

        # meanwhile, another namespace's EvalRun on the admin's cluster is served to Ready
        ready = lambda: any(c["type"] == "Ready" and c["status"] == "True" for c in  # noqa: E731
                            (lab.kube.json("get", "evalrun", "demo", "-n", other).get("status") or {})
                            .get("conditions") or [])
        eventually(ready, "the other namespace's EvalRun Ready")

        assert not marker.exists(), "the tenant's code ran as the operator"
        assert tcp_listener.seen == [], "the operator connected to the host the tenant named"
        assert http_listener.seen == [], "the operator called the tracking server the tenant named"
        assert [j.name for j in LocalScheduler(lab.root / lab.namespace / "logs" / ".local-scheduler").observe()] == []
        shown = [json.dumps(lab.kube.json("get", "evalruns", "-n", lab.namespace)), json.dumps(lab.events()),
                 lab.operator_log()]
        assert all(FAKE_TOKEN not in text and OPERATOR_LOGIN["MLFLOW_TRACKING_PASSWORD"] not in text
                   for text in shown)
        with sqlite3.connect(lab.root / "store.db") as store:
            tables = {name for (name,) in store.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert "experiments" not in tables and "alembic_version" not in tables, sorted(tables)
        # a refused EvalRun never acted: its deletion is not held (it was retried for minutes)
        lab.kube.kubectl("delete", "evalrun", "exec", "escape", "login", "db", "steal", "-n", lab.namespace, "--wait=true",
                         "--timeout=60s")
    finally:
        release(lab, lab.namespace, other)
        shared.delete()


def test_a_tenants_webhook_to_loopback_and_file_url_jobs_dir_are_refused_and_nothing_is_dialled(
        lab: Lab, http_listener: Listener) -> None:
    """Issue 27: URLs a tenant writes (a webhook's, in its Secret; a jobsDir) are capabilities the policy grants."""
    shared = SharedCluster(lab)
    tenant = Tenant(lab)
    hook = f"http://127.0.0.1:{http_listener.port}/services/T0/B0/hook-token-9c1f"
    lab.start_operator(trusted_host=False)
    try:
        tenant.apply(
            f"apiVersion: v1\nkind: Secret\nmetadata: {{name: alerts, namespace: {lab.namespace}}}\n"
            f"stringData: {{url: '{hook}'}}",
            lab.run_yaml(["org/a-8B"], name="hook", cluster=shared.ref, extra="  notify: {webhooks: [{name: alerts, "
                         "secretRef: {name: alerts, key: url}, events: [Stalled, Failed, Ready, Completed]}]}"),
            local_cluster(lab, "files", "  scheduler: {type: slurm, ssh: 'tenant@login.example', sshKeySecretRef: "
                                        "{name: ssh, key: id}, knownHostsSecretRef: {name: ssh, key: hosts}}\n"
                                        "  jobsDir: file:///\n  jobScript: /eval.sbatch"),
            lab.run_yaml(["org/a-8B"], name="files", cluster="cluster: files"),
        )

        hook_why = stalled_message(lab, "hook")
        assert "operator policy: webhook alerts reaches 127.0.0.1, a loopback address" in hook_why, hook_why
        assert "--allowed-webhook-url" in hook_why and "hook-token-9c1f" not in hook_why, hook_why
        files_why = stalled_message(lab, "files")
        assert "jobsDir file:/// is a URL" in files_why and "ClusterEvalCluster" in files_why, files_why
        assert lab.condition("Stalled", "hook")["reason"] == "InvalidSpec"  # type: ignore[index]
        seen = lab.evalrun("hook")["status"]["lastPass"]["at"]
        after = eventually(lambda: (at := lab.evalrun("hook")["status"]["lastPass"]["at"]) > seen and at, "a pass")
        eventually(lambda: lab.evalrun("hook")["status"]["lastPass"]["at"] > after, "another: still nothing dialled")
        assert http_listener.seen == [], "the operator posted to the loopback webhook the tenant named"
        assert "hook-token-9c1f" not in lab.operator_log() + json.dumps(lab.events())
    finally:
        release(lab, lab.namespace)
        shared.delete()


def test_the_same_cells_in_two_namespaces_are_two_tenants_work_and_a_cancel_touches_its_own(lab: Lab) -> None:
    other = other_namespace(lab)
    shared = SharedCluster(lab, {"FAKE_HARBOR_HANG_AFTER": "1"})  # one absolute jobsDir for both tenants
    lab.start_operator("-n", other, trusted_host=False)
    # forceEval: the results DB is the lab's, shared evidence; without it the second tenant's cell may wait on the
    # first one's Pending row (dedup, RULES §2), which is not what this test is about
    run = lab.run_yaml(["org/a-8B"], cluster=shared.ref, extra="  deletionPolicy: Cancel\n  forceEval: true")
    try:
        lab.apply(run, run.replace(f"namespace: {lab.namespace}", f"namespace: {other}"))
        eventually(lambda: len([j for j in shared.scheduler.observe() if j.state.value == "Running"]) == 2,
                   "one running job per namespace")
        assert len({j.name for j in shared.scheduler.observe()}) == 2, "two cells, two run tags"
        eventually(lambda: len(list((shared.dir / "jobs").glob("ev_*"))) == 2, "a run dir per namespace")
        lab.kube.kubectl("delete", "evalrun/demo", "-n", lab.namespace, "--wait=true", "--timeout=120s")
        eventually(lambda: sorted(j.state.value for j in shared.scheduler.observe()) == ["Cancelled", "Running"],
                   "the deleted EvalRun's job cancelled, the other namespace's still running")
        # its status is as fresh as its last pass, which under load may still be the one that submitted
        eventually(lambda: lab.kube.json("get", "evalrun", "demo", "-n", other)["status"]["summary"]["running"] == 1,
                   "the other namespace's status shows its job running")
    finally:
        release(lab, lab.namespace, other)
        shared.delete()


def test_tenants_on_one_clusterevalcluster_share_its_username_but_never_each_others_rows(lab: Lab) -> None:
    """Without forceEval the second tenant's cell sees the first one's row of the same model and benchmark (one
    username for all) as its evidence: while it says Started, the second waits. When the first tenant deletes its
    EvalRun (Cancel), its row stays Started with no job: the second never takes it for its own (it would resume the
    first one's run dir under its run tag and row id) and submits nothing until the row is stale."""
    other = other_namespace(lab)
    shared = SharedCluster(lab, {"FAKE_HARBOR_HANG_AFTER": "1"})
    lab.start_operator("-n", other, trusted_host=False)
    first = lab.run_yaml(["org/a-8B"], cluster=shared.ref, extra="  deletionPolicy: Cancel")
    status = lambda: lab.kube.json("get", "evalrun", "demo", "-n", other).get("status") or {}  # noqa: E731
    try:
        lab.apply(first)
        eventually(lambda: [j.state.value for j in shared.scheduler.observe()] == ["Running"], "team a's job runs")
        [job] = shared.scheduler.observe()
        lab.apply(first.replace(f"namespace: {lab.namespace}", f"namespace: {other}"))
        eventually(lambda: (status().get("summary") or {}).get("running") == 1, "team b waits on team a's row")
        lab.kube.kubectl("delete", "evalrun/demo", "-n", lab.namespace, "--wait=true", "--timeout=120s")
        assert [j.state.value for j in shared.scheduler.observe()] == ["Cancelled"]
        deleted = status()["lastPass"]["at"]
        after = eventually(lambda: (at := status()["lastPass"]["at"]) > deleted and at, "team b's pass after the cancel")
        eventually(lambda: status()["lastPass"]["at"] > after, "and another")

        assert [j.job_id for j in shared.scheduler.observe()] == [job.job_id], "no job of team b, under any tag"
        with sqlite3.connect(lab.root / "store.db") as store:
            submitted = store.execute("SELECT DISTINCT evalrun FROM evalrun_submissions").fetchall()
        assert submitted == [(f"{lab.namespace}/demo",)], submitted
        assert status()["summary"]["running"] == 1, "the row is still team a's evidence (fresh Started)"
    finally:
        release(lab, lab.namespace, other)
        shared.delete()


def test_an_evalrun_waiting_for_the_admins_cluster_runs_as_soon_as_it_is_made(lab: Lab) -> None:
    """Timers are an hour apart here: only the ClusterEvalCluster's own event can start the pass that submits. The operator
    may only read the admin's objects, so it keeps no kopf state on them (no patch refused in its log)."""
    lab.start_operator("--interval", "3600", trusted_host=False)
    name = f"shared-{lab.namespace.removeprefix('t-')}"
    lab.apply(lab.run_yaml(["org/a-8B"], cluster=f"clusterRef: {{kind: ClusterEvalCluster, name: {name}}}"))
    stalled = lab.wait_condition("Stalled")
    assert f"ClusterEvalCluster {name} is not defined" in stalled["message"], stalled
    shared = SharedCluster(lab)
    try:
        eventually(lambda: len(shared.scheduler.observe()) == 1, "the cell submitted by the pass the event started")
        assert "cannot patch resource" not in lab.operator_log()
    finally:
        release(lab, lab.namespace)
        shared.delete()


def slurm_over_ssh(lab: Lab, kind: str, name: str, ssh: str, where: Path) -> str:
    namespace = f"namespace: {lab.namespace}, " if kind == "EvalCluster" else ""
    return f"""
apiVersion: evalrun.io/v1alpha1
kind: {kind}
metadata: {{{namespace}name: {name}}}
spec:
  scheduler: {{type: slurm, submissionsPerMinute: 60, {ssh}}}
  partition: debug
  jobsDir: {where}/jobs
  logsDir: {where}/logs
  jobScript: {FAKE_HARBOR}
  timeLimit: "30"
  env: {{FAKE_HARBOR_TASKS: "2", FAKE_HARBOR_TRIAL_SECONDS: "0.05"}}
{"" if namespace else f"  allowedNamespaces: {{names: [{lab.namespace}]}}"}
"""


@pytest.mark.slurm
def test_over_ssh_the_admins_cluster_and_a_tenants_own_key_run_and_a_cluster_without_one_stalls(
        lab: Lab, ssh_lab: SshLab, slurm_env: dict[str, str]) -> None:
    """The lab sshd is the login node of the lab SLURM (its sessions get SLURM_CONF; the operator has none)."""
    suffix = lab.namespace.removeprefix("t-")  # SLURM accounting outlives the test: job names stay unique
    tenant = Tenant(lab)
    tenant.lab.kube.kubectl("create", "secret", "generic", "login", "-n", lab.namespace,
                            f"--from-file=key={ssh_lab.identity_file}", f"--from-file=hosts={ssh_lab.known_hosts}",
                            env=tenant.env)
    admins = f"ssh-{suffix}"
    lab.apply(slurm_over_ssh(lab, "ClusterEvalCluster", admins,
                             f"ssh: {ssh_lab.alias}, sshConfig: {ssh_lab.config_file}", lab.root / "admins"))
    own_key = "sshKeySecretRef: {name: login, key: key}, knownHostsSecretRef: {name: login, key: hosts}"
    login = f"ssh: 'root@127.0.0.1:{ssh_lab.port}'"
    lab.start_operator("--allowed-ssh-host", "127.0.0.1", trusted_host=False)
    try:
        tenant.apply(slurm_over_ssh(lab, "EvalCluster", "own", f"{login}, {own_key}", lab.root / "own"),
                     slurm_over_ssh(lab, "EvalCluster", "keyless", login, lab.root / "keyless"),
                     lab.run_yaml([f"org/adm{suffix}"], name="admins",
                                  cluster=f"clusterRef: {{kind: ClusterEvalCluster, name: {admins}}}"),
                     lab.run_yaml([f"org/own{suffix}"], name="own", cluster="cluster: own"),
                     lab.run_yaml([f"org/none{suffix}"], name="keyless", cluster="cluster: keyless"))
        why = stalled_message(lab, "keyless")
        assert "never the operator's: set scheduler.sshKeySecretRef" in why, why
        for name in ("admins", "own"):
            lab.wait_condition("Ready", name=name, timeout_s=300)
            assert lab.evalrun(name)["status"]["summary"]["done"] == 1
        assert [p.name for p in (lab.root / "own" / "jobs").iterdir()], "the tenant's job wrote on the login node"
        assert not (lab.root / "keyless").exists(), "nothing was submitted for the cluster without a key"
    finally:
        release(lab, lab.namespace)
        lab.kube.kubectl("delete", "clusterevalcluster", admins, "--wait=false", check=False)
