"""What a tenant's EvalRun makes the operator dial, as only the operator sees it (issue 27): webhook URLs from the
namespace's Secrets, and the addresses a tenant's host names resolve to. Nothing is dialled: the resolver is a
table."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from controller.api.fields import SecretRef
from controller.api.loader import load_objects
from controller.api.tenancy import OperatorPolicy
from controller.entry.egress import egress_refusals, resolve_host

TOKEN_PATH = "/services/T000/B000/s3cr3t-path-token"
DNS = {"hooks.slack.com": ["3.3.3.3"], "rebind.example": ["93.184.216.35", "127.0.0.1"],
       "mlflow.team-b": ["10.96.4.2"], "mlflow.example.com": ["93.184.216.34"]}


DEFAULT = OperatorPolicy()


class Secrets:
    def __init__(self, values: dict[str, str]) -> None:
        self.values = values

    def get(self, ref: SecretRef) -> str | None:
        return self.values.get(ref.name)

    def where(self, ref: SecretRef) -> str:
        return f"Secret {ref.name}"


def table(host: str) -> list[str]:
    if host not in DNS:
        raise OSError(-2, "Name or service not known")
    return DNS[host]


def refused(webhooks: dict[str, str], tracking: str | None = None, policy: OperatorPolicy = DEFAULT,
            kind: str = "EvalCluster", namespace: str | None = "team-a") -> list[str]:
    spec: dict[str, Any] = {"scheduler": {"type": "local"}, "jobsDir": "j", "logsDir": "l", "jobScript": "s"}
    meta = {"name": "c"} | ({"namespace": "team-a"} if kind == "EvalCluster" else {})
    run_spec: dict[str, Any] = {"clusterRef": {"kind": kind, "name": "c"}, "models": ["org/m"], "datasets": ["a/b"],
                                "notify": {"webhooks": [{"name": name, "secretRef": {"name": name}}
                                                        for name in webhooks]}}
    if tracking:
        run_spec["upload"] = {"mlflowTrackingUri": tracking}
    specs = load_objects([{"apiVersion": "evalrun.io/v1alpha1", "kind": kind, "metadata": meta, "spec": spec},
                          {"apiVersion": "evalrun.io/v1alpha1", "kind": "EvalRun", "spec": run_spec,
                           "metadata": {"name": "r"} | ({"namespace": namespace} if namespace else {})}], Path("/b"))
    return [error.message for error in egress_refusals(specs, Secrets(webhooks), policy, resolve=table)]


def test_a_public_webhook_and_tracking_server_are_fine():
    assert refused({"slack": "https://hooks.slack.com" + TOKEN_PATH}, "https://mlflow.example.com/") == []


@pytest.mark.parametrize(("url", "says"), [
    ("http://127.0.0.1:8080" + TOKEN_PATH, "a loopback address"),
    ("http://[::ffff:169.254.169.254]/latest", "a cloud metadata address"),
    ("https://kubernetes.default.svc/api", "a name of the cluster"),
    ("https://rebind.example" + TOKEN_PATH, "rebind.example, which reaches 127.0.0.1, a loopback address"),
    ("http://mlflow.team-b/", "which reaches 10.96.4.2, a private address"),
    ("https://nowhere.example/", "does not resolve now"),
    ("file:///etc/passwd", "not http(s)"),
])
def test_webhooks_to_internal_hosts_are_refused_without_quoting_the_url(url: str, says: str):
    [why] = refused({"alerts": url})

    assert why.startswith("operator policy: webhook alerts") and says in why and "--allowed-webhook-url" in why
    assert TOKEN_PATH not in why, "a webhook URL is a credential"


def test_an_admins_prefix_opens_a_webhook_whatever_its_host():
    relay = OperatorPolicy(allowed_webhook_urls=("http://relay.monitoring.svc:8080/hooks",))

    assert refused({"relay": "http://relay.monitoring.svc:8080/hooks/team-a"}, policy=relay) == []
    assert refused({"relay": "http://relay.monitoring.svc:8080/other"}, policy=relay) != []


def test_a_tenants_tracking_host_is_resolved_and_an_allowed_prefix_is_not():
    [why] = refused({}, "http://mlflow.team-b/")

    assert "mlflowTrackingUri names mlflow.team-b, which reaches 10.96.4.2" in why and "--allowed-mlflow-uri" in why
    assert refused({}, "http://mlflow.team-b/", OperatorPolicy(allowed_mlflow_uris=("http://mlflow.team-b",))) == []


def test_the_admins_cluster_and_the_cli_are_not_checked():
    assert refused({}, None, kind="ClusterEvalCluster") == []
    assert refused({"alerts": "http://127.0.0.1/"}, kind="ClusterEvalCluster", namespace=None) == []


def test_a_name_that_does_not_answer_in_time_is_not_waited_for(monkeypatch: pytest.MonkeyPatch):
    assert "127.0.0.1" in resolve_host("127.0.0.1")
    answer = threading.Event()  # a resolver that answers only once the test is over

    def slow_resolver(*args: object, **kwargs: object) -> list[object]:
        answer.wait(30)
        return []

    monkeypatch.setattr("socket.getaddrinfo", slow_resolver)

    with pytest.raises(OSError, match=r"no answer in 0\.1s"):
        resolve_host("slow.example", timeout_s=0.1)
    answer.set()


def test_the_tracking_server_of_every_listed_cluster_is_checked():
    def cluster(name: str, uri: str) -> dict[str, Any]:
        return {"apiVersion": "evalrun.io/v1alpha1", "kind": "EvalCluster",
                "metadata": {"name": name, "namespace": "team-a"},
                "spec": {"scheduler": {"type": "local"}, "jobsDir": "j", "logsDir": "l", "jobScript": "s",
                         "mlflowTrackingUri": uri}}
    run = {"apiVersion": "evalrun.io/v1alpha1", "kind": "EvalRun", "metadata": {"name": "r", "namespace": "team-a"},
           "spec": {"clusters": ["a", "b"], "models": ["org/m"], "datasets": ["a/b"]}}
    specs = load_objects([cluster("a", "https://mlflow.example.com/"), cluster("b", "http://mlflow.team-b/"), run],
                         Path("/b"))

    [why] = [error.message for error in egress_refusals(specs, Secrets({}), DEFAULT, resolve=table)]
    assert "mlflowTrackingUri names mlflow.team-b, which" in why, "the second cluster's private server"
