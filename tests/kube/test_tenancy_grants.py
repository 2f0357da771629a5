"""ClusterEvalClusters are granted, not open (issue 27), on the real API server with the repo's manifests: an
EvalRun of a namespace the admin's cluster does not grant is refused (InvalidSpec naming allowedNamespaces) with
nothing submitted and none of the admin's Secrets sought; granting the namespace by a label selector (the operator
reads the Namespace's labels under its ClusterRole) lets the same EvalRun run, its secretEnv resolved only now."""

from __future__ import annotations

import json

import pytest

from tests.kube.conftest import OPERATOR_NAMESPACE, Lab, eventually
from tests.kube.test_tenancy import SharedCluster, Tenant, release

pytestmark = pytest.mark.kube


def test_an_ungranted_namespace_is_refused_without_a_secret_read_and_a_label_grants_it(lab: Lab) -> None:
    suffix = lab.namespace.removeprefix("t-")
    secret, label = f"admin-hf-{suffix}", f"evalrun.io/grant-{suffix}"
    shared = SharedCluster(lab, allowed=f"{{names: [somebody-else], selector: {{matchLabels: {{{label}: 'yes'}}}}}}",
                           secret_env=f"  secretEnv: [{{name: HF_TOKEN, secretRef: {{name: {secret}, key: token}}}}]")
    tenant = Tenant(lab)
    lab.start_operator(trusted_host=False)
    try:
        tenant.apply(lab.run_yaml(["org/a-8B"], cluster=shared.ref))
        stalled = lab.wait_condition("Stalled")
        assert stalled["reason"] == "InvalidSpec", stalled
        assert f"ClusterEvalCluster {shared.name} is not granted to namespace {lab.namespace}" in stalled["message"]
        assert "spec.allowedNamespaces" in stalled["message"], stalled
        status = json.dumps(lab.evalrun()["status"])
        assert secret not in status and OPERATOR_NAMESPACE not in status, "the admin's Secret was never sought"
        assert list(shared.scheduler.observe()) == [], "nothing submitted on the admin's cluster"

        # granted by the namespace's label: the next pass runs it, and only now asks for the admin's Secret
        lab.kube.kubectl("label", "namespace", lab.namespace, f"{label}=yes")
        eventually(lambda: secret in json.dumps(lab.evalrun().get("status") or {}),
                   "the granted EvalRun to seek the admin's secretEnv")
        assert list(shared.scheduler.observe()) == [], "nothing submitted without its secret"
        lab.kube.kubectl("create", "secret", "generic", secret, "-n", OPERATOR_NAMESPACE, "--from-literal=token=x")
        lab.wait_condition("Ready", timeout_s=180)
    finally:
        lab.kube.kubectl("delete", "secret", secret, "-n", OPERATOR_NAMESPACE, "--ignore-not-found")
        release(lab, lab.namespace)
        shared.delete()
