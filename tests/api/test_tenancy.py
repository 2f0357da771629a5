"""The operator policy (issue 17): what a namespace's author writes never runs with the operator's identity.

Each attack of the issue as the object a tenant would apply, checked the way the operator loads it
(`load_objects` with the policy); a ClusterEvalCluster of the admin is trusted, and the CLI has no policy.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from controller.api.errors import SpecErrors
from controller.api.loader import load_objects
from controller.api.tenancy import OperatorPolicy
from controller.core.types import EvalRunRef
from tests.core.builders import cell

NS = "team-a"
SSH_OK = {"type": "slurm", "ssh": "alice@login.hpc.example", "sshKeySecretRef": {"name": "ssh", "key": "id"},
          "knownHostsSecretRef": {"name": "ssh", "key": "known_hosts"}}
POLICY = OperatorPolicy(allowed_ssh_hosts=("login.hpc.example", "*.lab.example"))


def cluster(kind: str = "EvalCluster", **spec: Any) -> dict[str, Any]:
    base = {"scheduler": SSH_OK, "jobsDir": "/scratch/jobs", "logsDir": "/scratch/logs", "jobScript": "/s/eval.sbatch"}
    meta = {"name": "hpc"} | ({"namespace": NS} if kind == "EvalCluster" else {})
    return {"apiVersion": "evalrun.io/v1alpha1", "kind": kind, "metadata": meta, "spec": base | spec}


def run(**spec: Any) -> dict[str, Any]:
    base = {"cluster": "hpc", "models": ["org/m-8B"], "datasets": ["DCAgent/tiny"]}
    return {"apiVersion": "evalrun.io/v1alpha1", "kind": "EvalRun", "metadata": {"name": "r", "namespace": NS},
            "spec": base | spec}


def refusals(*objects: dict[str, Any], base: Path = Path("/base"), policy: OperatorPolicy = POLICY) -> list[str]:
    try:
        load_objects(objects, base, policy=policy)
    except SpecErrors as exc:
        return [error.message for error in exc.errors]
    return []


def test_a_namespaced_cluster_on_an_allowed_host_with_its_own_key_is_fine():
    assert refusals(cluster(), run()) == []


@pytest.mark.parametrize(("scheduler", "says"), [
    ({"type": "local"}, "may not use a local scheduler"),
    ({"type": "slurm"}, "may not use SLURM commands on the operator's host"),
])
def test_nothing_of_a_tenant_runs_on_the_operators_host_unless_the_admin_allows_it(scheduler, says):
    objects = (cluster(scheduler=scheduler, jobsDir="jobs", logsDir="logs", jobScript="eval.sh"), run())

    [refused] = refusals(*objects)
    allowed = refusals(*objects, policy=POLICY.model_copy(update={"allow_local_scheduler": True}))

    assert says in refused and "--allow-local-scheduler" in refused
    assert allowed == [], "a single-user laptop may"


@pytest.mark.parametrize(("scheduler", "says"), [
    (SSH_OK | {"ssh": "root@pinned.login.node"}, "ssh host pinned.login.node is not allowed"),
    (SSH_OK | {"sshConfig": "/var/run/secrets/kubernetes.io/serviceaccount/token"}, "sshConfig is refused"),
    ({k: v for k, v in SSH_OK.items() if k != "sshKeySecretRef"}, "never the operator's: set scheduler.sshKeySecretRef"),
    ({k: v for k, v in SSH_OK.items() if k != "knownHostsSecretRef"}, "set scheduler.knownHostsSecretRef"),
])
def test_the_operators_ssh_identity_and_config_are_never_a_tenants(scheduler, says):
    assert any(says in why for why in refusals(cluster(scheduler=scheduler), run()))


def test_a_tenants_slurm_conf_is_read_on_its_login_node_never_by_the_operators_commands():
    local = POLICY.model_copy(update={"allow_local_scheduler": True})
    here = cluster(scheduler={"type": "slurm", "slurmConf": "/tmp/evil/slurm.conf"}, jobsDir="jobs", logsDir="logs",
                   jobScript="eval.sh")

    [refused] = refusals(here, run(), policy=local)

    assert "slurmConf on the operator's host is refused" in refused and "plugins" in refused
    assert refusals(cluster(scheduler=SSH_OK | {"slurmConf": "/etc/slurm-b/slurm.conf"}), run()) == []


@pytest.mark.parametrize("name", ["BASH_ENV", "ENV", "PYTHONPATH", "PYTHONSTARTUP", "LD_PRELOAD", "PATH",
                                  "NODE_OPTIONS", "PERL5OPT", "RUBYOPT"])
def test_loader_and_shell_hooks_are_refused_in_env_and_secret_env(name):
    in_env = refusals(cluster(env={name: "/tmp/payload"}), run())
    in_secret = refusals(cluster(secretEnv=[{"name": name, "secretRef": {"name": "s", "key": "k"}}]), run())

    assert any(f"env {name} would run other code" in why for why in in_env)
    assert any(f"secretEnv {name} would run other code" in why for why in in_secret)


def test_relative_paths_stay_in_the_namespaces_directory(tmp_path: Path):
    local = POLICY.model_copy(update={"allow_local_scheduler": True})
    (tmp_path / NS).mkdir()
    (tmp_path / NS / "out").symlink_to("/etc")
    escape = cluster(scheduler={"type": "local"}, jobsDir="../../etc", logsDir="logs", jobScript="eval.sh")
    through_link = cluster(scheduler={"type": "local"}, jobsDir="out/cron.d", logsDir="logs", jobScript="eval.sh")
    fine = cluster(scheduler={"type": "local"}, jobsDir="jobs", logsDir="logs", jobScript="eval.sh")

    assert any("jobsDir ../../etc leaves the namespace's directory" in why
               for why in refusals(escape, run(), base=tmp_path, policy=local))
    assert any("jobsDir out/cron.d leaves" in why for why in refusals(through_link, run(), base=tmp_path, policy=local))
    assert refusals(fine, run(), base=tmp_path, policy=local) == []


def test_absolute_local_paths_must_be_under_an_allowed_root(tmp_path: Path):
    local = POLICY.model_copy(update={"allow_local_scheduler": True, "allowed_path_roots": (str(tmp_path),)})
    inside = cluster(scheduler={"type": "local"}, jobsDir=str(tmp_path / "jobs"), logsDir=str(tmp_path / "logs"),
                     jobScript=str(tmp_path / "eval.sh"))
    outside = cluster(scheduler={"type": "local"}, jobsDir=str(tmp_path / "jobs"), logsDir=str(tmp_path / "logs"),
                      jobScript="/usr/bin/python3")

    assert refusals(inside, run(), policy=local) == []
    assert any("jobScript /usr/bin/python3 is outside the allowed path roots" in why
               for why in refusals(outside, run(), policy=local))


@pytest.mark.parametrize("uri", ["sqlite:///var/lib/evalctl/store.db", "postgresql://db/store", "mysql://y/z",
                                 "databricks://profile"])
def test_tracking_uris_of_tenants_are_http_servers_only(uri: str):
    on_run = refusals(cluster(), run(upload={"mlflow": True, "mlflowTrackingUri": uri}))
    on_cluster = refusals(cluster(mlflowTrackingUri=uri), run())

    assert any("namespaced objects may name only an http(s) tracking server" in why for why in on_run)
    assert any("may name only an http(s)" in why for why in on_cluster)


def test_the_admins_cluster_evalcluster_is_trusted():
    admins = cluster("ClusterEvalCluster", scheduler={"type": "local"}, jobsDir="jobs", logsDir="logs",
                     jobScript="eval.sh", env={"PYTHONPATH": "/opt/site"})
    tenant_run = run(cluster=None, clusterRef={"kind": "ClusterEvalCluster", "name": "hpc"})

    assert refusals(admins, tenant_run) == []


@pytest.mark.parametrize("model", ["-c", "org/m;id", "org/m $(id)", "org/`id`", "org/m'x", "a b"])
def test_names_that_could_be_options_or_code_are_refused_by_the_loader_and_the_schema(model: str):
    assert any("must not start with '-'" in why for why in refusals(cluster(), run(models=[model])))


def test_cell_keys_are_scoped_by_namespace_and_injective():
    north, south = EvalRunRef(namespace="north", name="r"), EvalRunRef(namespace="south", name="r")

    assert cell(evalrun=north).key != cell(evalrun=south).key, "tenants never share a cell, a claim or a run tag"
    assert cell(evalrun=north).tag_stem != cell(evalrun=south).tag_stem
    assert cell(model="a|b", dataset="c/d").key != cell(model="a", dataset="b|c/d").key
    assert cell().former_key is None and cell().key == "laion/Qwen3-8B-sft|DCAgent2/terminal_bench_2|0123456789abcdef"
    assert cell(evalrun=north).former_key == cell().key, "what versions before read and wrote"


def test_the_cli_has_no_policy(tmp_path: Path):
    """On a login node the user is the tenant: a local scheduler and absolute paths are theirs to use."""
    local = cluster(scheduler={"type": "local"}, jobsDir=str(tmp_path), logsDir=str(tmp_path),
                    jobScript=os.path.realpath("/bin/true"))
    load_objects([local, run()], tmp_path)  # no policy: accepted


def test_a_namespace_is_served_oldest_evalruns_first_within_its_quota() -> None:
    from controller.api.tenancy import NamespaceQuota, QuotaEntry, estimated_cells, quota_refusal

    quota = NamespaceQuota(max_evalruns=2, max_cells=100)
    entries = [QuotaEntry("2026-12-01T10:00:02Z", "c", 10), QuotaEntry("2026-12-01T10:00:00Z", "a", 10),
               QuotaEntry("2026-12-01T10:00:01Z", "b", 10)]
    assert quota_refusal(entries, "a", quota) == quota_refusal(entries, "b", quota) == ""
    assert "at most 2 are served" in quota_refusal(entries, "c", quota)
    heavy = [QuotaEntry("2026-12-01T10:00:00Z", "a", 60), QuotaEntry("2026-12-01T10:00:01Z", "b", 60)]
    assert quota_refusal(heavy, "a", quota) == ""
    assert "asks for 120 cells, at most 100" in quota_refusal(heavy, "b", quota)
    assert estimated_cells({"models": ["m1", "m2"], "datasets": ["d"], "presets": ["tb2", "v2"]}) == 6
    assert estimated_cells({"models": ["m1"]}) == 1
    selector_only = {"modelSelector": {"namePatterns": ["*"], "limit": 500}, "datasets": ["d1", "d2"]}
    assert estimated_cells(selector_only) == 1000, "a selector counts the most it may select, before any pass"
    assert "asks for 1000 cells" in quota_refusal([QuotaEntry("t", "s", estimated_cells(selector_only))], "s", quota)


@pytest.mark.parametrize("url", ["ssh://attacker.example/jobs", "file:///etc", "sftp://10.0.0.5/jobs",
                                 "http://169.254.169.254/latest", "s3://bucket/jobs"])
@pytest.mark.parametrize("field", ["jobsDir", "logsDir", "jobScript"])
def test_a_namespaced_clusters_paths_are_never_urls_even_over_ssh(url: str, field: str):
    over_ssh = refusals(cluster(**{field: url}), run())
    on_host = refusals(cluster(scheduler={"type": "local"}, **{"jobsDir": "j", "logsDir": "l", "jobScript": "s",
                                                               field: url}), run(),
                       policy=POLICY.model_copy(update={"allow_local_scheduler": True}))

    assert len(on_host) == len(over_ssh) == 1
    assert all(f"{field} {url} is a URL" in why and "ClusterEvalCluster" in why for why in over_ssh + on_host)
    assert refusals(cluster("ClusterEvalCluster", **{field: url}), run(cluster=None, clusterRef={
        "kind": "ClusterEvalCluster", "name": "hpc"})) == [], "the admin's may"


@pytest.mark.parametrize("uri", ["http://127.0.0.1:5000", "http://2130706433/", "http://[::ffff:127.0.0.1]/",
                                 "http://169.254.169.254/", "http://kubernetes.default.svc/", "http://10.0.0.7/",
                                 "http://LOCALHOST./", "http://mlflow/"])
def test_tracking_uris_of_tenants_name_public_hosts_only(uri: str):
    on_run = refusals(cluster(), run(upload={"mlflow": True, "mlflowTrackingUri": uri}))
    on_cluster = refusals(cluster(mlflowTrackingUri=uri), run())
    allowed = POLICY.model_copy(update={"allowed_mlflow_uris": (uri,)})

    assert len(on_run) == len(on_cluster) == 1
    assert all("operator policy: mlflowTrackingUri" in why and "--allowed-mlflow-uri" in why
               for why in on_run + on_cluster)
    assert refusals(cluster(mlflowTrackingUri=uri), run(upload={"mlflowTrackingUri": uri}), policy=allowed) == [], \
        "a URI the admin trusts with the operator's login may be named"
    assert refusals(cluster(), run(upload={"mlflowTrackingUri": "https://mlflow.example.com/"})) == []


def test_the_api_servers_in_cluster_address_is_refused(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "203.0.114.9")

    [why] = refusals(cluster(), run(upload={"mlflowTrackingUri": "https://203.0.114.9:443/"}))

    assert "the Kubernetes API server" in why


@pytest.mark.parametrize("name", ["BASH_ENV", "LD_PRELOAD", "PYTHONSTARTUP", "SHELLOPTS", "PS4", "BASHOPTS",
                                  "GLOBIGNORE", "IFS", "PROMPT_COMMAND", "ENV", "BASH_FUNC_id%%", "PATH"])
def test_the_refire_env_is_held_to_the_env_policy(name: str):
    mode = {"name": "oom", "patterns": ["OOM"], "when": "running", "remedy": "refire", "advice": "retry",
            "jobEnv": {"OK_VAR": "1", name: "/tmp/payload"}}
    found = refusals(cluster(failureCatalog=[mode]), run())
    admins = cluster("ClusterEvalCluster", failureCatalog=[mode])

    if name.isidentifier():
        assert [why for why in found if "failureCatalog.jobEnv" in why and name in why], found
        assert refusals(admins, run(cluster=None, clusterRef={"kind": "ClusterEvalCluster", "name": "hpc"})) == []
    else:
        assert any("a refire may set" in why for why in found), "the loader refuses a name no env can carry"


def test_a_model_selector_reads_every_namespaces_models_so_the_admin_grants_it() -> None:
    selector = {"modelSelector": {"namePatterns": ["*"], "limit": 5}}
    [why] = refusals(cluster(), run(**selector))
    assert "modelSelector" in why and "--allow-model-selector" in why, why
    assert refusals(cluster(), run(**selector), policy=POLICY.model_copy(update={"allow_model_selector": True})) == []


def test_each_of_several_clusters_is_looked_up_in_the_evalruns_own_namespace():
    elsewhere = cluster() | {"metadata": {"name": "gpu", "namespace": "team-b"}}
    ours = cluster()
    scoped = cluster("ClusterEvalCluster") | {"metadata": {"name": "shared"}}

    assert refusals(ours, scoped, run(cluster=None, clusters=["hpc", {"kind": "ClusterEvalCluster",
                                                                      "name": "shared"}])) == []
    [refused] = refusals(ours, elsewhere, run(cluster=None, clusters=["hpc", "gpu"]))
    assert refused.startswith("cluster gpu is not defined in namespace team-a by any loaded file, only team-b/gpu")



def test_a_tenant_writes_rows_as_its_namespace_or_the_operator_never_as_another_user():
    """`username` owns the rows a cluster writes to the shared results DB (and its MLflow runs): a tenant naming
    alice would publish its scores as hers. Its namespace's own name, or none, is all it may give; the admin's
    ClusterEvalCluster names anyone."""
    [refused] = refusals(cluster(username="alice"), run())
    assert "username alice is not this namespace's own name" in refused
    assert refusals(cluster(username=NS), run()) == []
    assert refusals(cluster("ClusterEvalCluster", username="alice"),
                    run(cluster=None, clusterRef={"kind": "ClusterEvalCluster", "name": "hpc"})) == []
