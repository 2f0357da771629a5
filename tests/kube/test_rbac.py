"""Least privilege on the real API server (issue 17): who may read which Secrets, per install mode.

Default install (manifests/): the operator's ClusterRole reads no Secret; a Role of manifests/tenant/ lets it
`get` Secrets in evalrun-system and in each namespace that opts in, nowhere else. Per-namespace install
(manifests/namespaced/): a Role in one namespace, nothing cluster-wide, installable by that namespace's admin
once a cluster admin applied manifests/namespaced/prerequisites/. Asked of the server with `kubectl auth can-i`
(impersonating the service accounts), and shown by operators running under those tokens.
"""

from __future__ import annotations

import random
import re
import string

import pytest

from tests.kube.conftest import (
    OPERATOR_NAMESPACE,
    OPERATOR_SA,
    REPO,
    TENANT_MANIFESTS,
    Kube,
    Lab,
    eventually,
    service_account_kubeconfig,
)

pytestmark = pytest.mark.kube

OPERATOR = f"system:serviceaccount:{OPERATOR_NAMESPACE}:{OPERATOR_SA}"
NAMESPACED_MANIFESTS = REPO / "manifests" / "namespaced"
PREREQUISITES = NAMESPACED_MANIFESTS / "prerequisites"
# what every authenticated user may do (self reviews, public trust bundles): not the manifests' doing
EVERYONE = ("selfsubjectreviews.", "selfsubjectaccessreviews.", "selfsubjectrulesreviews.", "clustertrustbundles.")

CLUSTER_ROLE = {  # manifests/rbac.yaml, as `auth can-i --list` shows it in a namespace that did not opt in
    "evalruns.evalrun.io": {"get", "list", "watch", "patch"},
    "evalruns.evalrun.io/status": {"patch"},
    "evalclusters.evalrun.io": {"get", "list", "watch", "patch"},
    "clusterevalclusters.evalrun.io": {"get", "list", "watch"},
    "evalclusters.evalrun.io/status": {"patch"},
    "clusterevalclusters.evalrun.io/status": {"patch"},
    "events": {"create"},
    "customresourcedefinitions.apiextensions.k8s.io": {"list", "watch"},
    "namespaces": {"list", "watch"},
    "clusterkopfpeerings.zalando.org": {"list", "watch", "patch"},
}
NAMESPACED_ROLE = {  # manifests/namespaced/rbac.yaml, in its namespace
    "evalruns.evalrun.io": {"get", "list", "watch", "patch"},
    "evalruns.evalrun.io/status": {"patch"},
    "evalclusters.evalrun.io": {"get", "list", "watch", "patch"},
    "evalclusters.evalrun.io/status": {"patch"},
    "secrets": {"get"},
    "events": {"create"},
    "kopfpeerings.zalando.org": {"list", "watch", "patch"},
}
SECRET_VERBS = ("get", "list", "watch", "create", "update", "patch", "delete")


def can_i_list(kube: Kube, user: str, namespace: str) -> dict[str, set[str]]:
    """`kubectl auth can-i --list` as `user` in `namespace`: resource → verbs (non-resource URLs left out)."""
    listed = kube.kubectl("auth", "can-i", "--list", "-n", namespace, f"--as={user}").stdout
    granted: dict[str, set[str]] = {}
    for line in listed.splitlines()[1:]:
        if not line.strip() or line[0].isspace():  # a non-resource URL (/healthz, /apis, ...)
            continue
        _, names, verbs = re.findall(r"\[([^\]]*)\]", line)
        assert names == "", f"no rule here is limited to resource names: {line}"
        resource = line.split()[0]
        if not resource.startswith(EVERYONE):
            granted.setdefault(resource, set()).update(verbs.split())
    return granted


def can_i(kube: Kube, user: str, verb: str, resource: str, namespace: str | None) -> bool:
    """One `kubectl auth can-i` (namespace None: in every namespace at once, i.e. cluster-wide)."""
    where = ["--all-namespaces"] if namespace is None else ["-n", namespace]
    done = kube.kubectl("auth", "can-i", verb, resource, *where, f"--as={user}", check=False)
    assert done.stdout.strip() in ("yes", "no"), done.stdout + done.stderr
    return done.stdout.strip() == "yes"


def new_namespace(kube: Kube, prefix: str) -> str:
    name = prefix + "".join(random.choices(string.ascii_lowercase, k=8))
    kube.kubectl("create", "namespace", name)
    return name


def bindings_of(kube: Kube, kind: str, account: str, namespace: str) -> list[dict]:
    """The (Cluster)RoleBindings whose subjects include that ServiceAccount (a RoleBinding's subject without a
    namespace is one of its own namespace)."""
    found = []
    for binding in kube.json("get", kind, "--all-namespaces")["items"]:
        own = binding["metadata"].get("namespace")
        if any(s["kind"] == "ServiceAccount" and s["name"] == account and s.get("namespace", own) == namespace
               for s in binding.get("subjects") or []):
            found.append(binding)
    return found


# ---------------------------------------------------------------------- the default install


def test_the_default_operator_reads_secrets_in_its_namespace_and_opted_in_tenants_only(kube: Kube):
    tenant, other = new_namespace(kube, "tenant-"), new_namespace(kube, "other-")
    kube.kubectl("apply", "-n", tenant, "-k", str(TENANT_MANIFESTS))
    assert can_i(kube, OPERATOR, "get", "secrets", OPERATOR_NAMESPACE)
    assert can_i(kube, OPERATOR, "get", "secrets", tenant)
    assert not can_i(kube, OPERATOR, "get", "secrets", other)
    assert not can_i(kube, OPERATOR, "get", "secrets", "default")
    assert not can_i(kube, OPERATOR, "get", "secrets", None), "no Secret cluster-wide"
    for namespace in (OPERATOR_NAMESPACE, tenant):
        assert [v for v in SECRET_VERBS if can_i(kube, OPERATOR, v, "secrets", namespace)] == ["get"], namespace
    assert "secrets" not in can_i_list(kube, OPERATOR, other)
    assert can_i_list(kube, OPERATOR, other) == CLUSTER_ROLE
    assert can_i_list(kube, OPERATOR, tenant) == {**CLUSTER_ROLE, "secrets": {"get"}}, "the opt-in adds that only"
    assert can_i_list(kube, OPERATOR, OPERATOR_NAMESPACE) == {**CLUSTER_ROLE, "secrets": {"get"}}


def test_the_tenant_manifest_is_one_role_with_get_on_secrets_bound_to_the_operator(kube: Kube):
    tenant = new_namespace(kube, "tenant-")
    kube.kubectl("apply", "-n", tenant, "-k", str(TENANT_MANIFESTS))
    [role] = kube.json("get", "roles", "-n", tenant)["items"]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]
    [binding] = kube.json("get", "rolebindings", "-n", tenant)["items"]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": OPERATOR_SA, "namespace": OPERATOR_NAMESPACE}]
    kube.kubectl("delete", "-n", tenant, "-k", str(TENANT_MANIFESTS))  # opting out is the same manifest
    assert not can_i(kube, OPERATOR, "get", "secrets", tenant)


def test_the_cluster_role_names_no_secret_and_is_the_operators_only_cluster_binding(kube: Kube):
    role = kube.json("get", "clusterrole", "evalrun-operator")
    assert all("secrets" not in rule["resources"] for rule in role["rules"]), role["rules"]
    assert [b["metadata"]["name"] for b in bindings_of(kube, "clusterrolebindings", OPERATOR_SA,
                                                       OPERATOR_NAMESPACE)] == ["evalrun-operator"]
    for binding in bindings_of(kube, "rolebindings", OPERATOR_SA, OPERATOR_NAMESPACE):
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                      "name": "evalrun-operator-secrets"}, binding


def test_a_namespace_that_did_not_opt_in_stalls_on_its_secret_until_it_opts_in(lab: Lab):
    """The operator of the default install, under its own token: a Secret it may not read is never read (the
    pass stalls, nothing is submitted); the namespace's admin applies manifests/tenant/ and the next pass works."""
    lab.kube.kubectl("delete", "-n", lab.namespace, "-k", str(TENANT_MANIFESTS))  # the fixture opted it in
    lab.kube.kubectl("create", "secret", "generic", "daytona", "-n", lab.namespace, "--from-literal=api-key=sk-1")
    lab.start_operator()
    attention = lab.stall_on_secret("daytona")
    opt_in = f"namespace {lab.namespace} has not opted in to Secret reads; its admin runs: kubectl apply -n " \
             f"{lab.namespace} -k manifests/tenant/"
    assert any(f"Secret {lab.namespace}/daytona (403 Forbidden)" in item["reason"] and opt_in in item["reason"]
               for item in attention), attention
    assert not any("add key" in item["reason"] for item in attention), "the key is there: the cause is the 403"
    lab.kube.kubectl("apply", "-n", lab.namespace, "-k", str(TENANT_MANIFESTS))
    lab.wait_condition("Ready")
    assert len(lab.jobs()) == 1


# ---------------------------------------------------------------------- the per-namespace install


def _install_namespaced(kube: Kube, namespace: str) -> str:
    """manifests/namespaced/ applied by the namespace's admin (not a cluster admin); returns that user.

    No controller-manager aggregates ClusterRoles here: the admin is bound, in the namespace only, to what the
    built-in `admin` role aggregates (Kubernetes' own parts and those of the prerequisites)."""
    kube.kubectl("apply", "-k", str(PREREQUISITES))
    admin = f"admin-of-{namespace}"
    parts = ["system:aggregate-to-admin", "system:aggregate-to-edit", "system:aggregate-to-view"]
    for part in parts:
        kube.kubectl("create", "rolebinding", f"admin-{part.split(':')[-1]}", "-n", namespace,
                     f"--clusterrole={part}", f"--user={admin}")
    refused = kube.kubectl("apply", "-n", namespace, "-k", str(NAMESPACED_MANIFESTS), f"--as={admin}", check=False)
    assert refused.returncode != 0, "without the prerequisites' roles, a namespace admin cannot grant the Role"
    for part in ("evalrun-edit", "evalrun-view"):
        kube.kubectl("create", "rolebinding", f"admin-{part}", "-n", namespace, f"--clusterrole={part}",
                     f"--user={admin}")
    kube.kubectl("apply", "-n", namespace, "-k", str(NAMESPACED_MANIFESTS), f"--as={admin}")
    return admin


def test_the_namespaced_install_can_read_its_namespace_only(kube: Kube):
    team, other = new_namespace(kube, "team-"), new_namespace(kube, "other-")
    kube.kubectl("apply", "-n", other, "-k", str(TENANT_MANIFESTS))  # opted in for the default install only
    _install_namespaced(kube, team)
    account = f"system:serviceaccount:{team}:{OPERATOR_SA}"
    assert can_i_list(kube, account, team) == NAMESPACED_ROLE
    for namespace in (other, OPERATOR_NAMESPACE, "default"):
        assert can_i_list(kube, account, namespace) == {}, namespace
    assert can_i(kube, account, "get", "secrets", team)
    assert [v for v in SECRET_VERBS if can_i(kube, account, v, "secrets", team)] == ["get"]
    for namespace in (other, OPERATOR_NAMESPACE, None):
        assert not can_i(kube, account, "get", "secrets", namespace), namespace
    for verb, resource in (("list", "evalruns.evalrun.io"), ("get", "clusterevalclusters.evalrun.io"),
                           ("list", "namespaces"), ("patch", "clusterkopfpeerings.zalando.org")):
        assert not can_i(kube, account, verb, resource, None), (verb, resource)
    assert bindings_of(kube, "clusterrolebindings", OPERATOR_SA, team) == []
    assert [b["metadata"]["name"] for b in bindings_of(kube, "rolebindings", OPERATOR_SA, team)] == \
        ["evalrun-operator"]
    [deployment] = kube.json("get", "deployments", "-n", team)["items"]
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[:2] == ["operator", "--namespace=$(POD_NAMESPACE)"], args
    kube.kubectl("get", "kopfpeering", "evalrun-operator", "-n", team)


def test_a_namespaced_operator_under_its_role_alone_drives_an_evalrun_with_a_secret_to_ready(lab: Lab):
    """`evalctl operator -n NS` (namespaced KopfPeering) under the per-namespace install's token: kopf's
    cluster-wide observers are refused and fall back; the EvalRun, its EvalCluster and its Secret are served."""
    lab.kube.kubectl("delete", "-n", lab.namespace, "-k", str(TENANT_MANIFESTS))  # not the default install's
    _install_namespaced(lab.kube, lab.namespace)
    lab.kubeconfig = service_account_kubeconfig(lab.kube, lab.namespace, OPERATOR_SA, lab.root / "team-kubeconfig")
    lab.kube.kubectl("create", "secret", "generic", "daytona", "-n", lab.namespace, "--from-literal=api-key=sk-1")
    lab.start_operator("-n", lab.namespace, "--priority", "100", peered=True)
    eventually(lambda: len(lab.kube.json("get", "kopfpeering", "evalrun-operator", "-n", lab.namespace)
                           .get("status") or {}) >= 1, "the replica in the namespace's KopfPeering")
    cluster = lab.cluster_yaml(secret_env="  secretEnv: [{name: DAYTONA_API_KEY, secretRef: {name: daytona, "
                                          "key: api-key}}]")
    lab.apply(cluster, lab.run_yaml(["org/a-8B"]))
    lab.wait_condition("Ready")
    assert len(lab.jobs()) == 1
    reasons = {e["reason"] for e in lab.events() if e["involvedObject"]["name"] == "demo"}
    assert "Submit" in reasons, reasons
    log = lab.operator_log()
    assert "Not enough permissions" in log, "kopf's fallback for the namespaces and CRDs, as rbac.yaml says"
    assert "Traceback" not in log, log[-3000:]

