"""Which MLflow server and credentials an EvalRun's uploads use: the EvalRun's, else its EvalCluster's, else the
environment's; a named Secret that is not there says how to set it, never a value."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.api.fields import SecretRef
from controller.api.loader import load_specs
from controller.core.types import ClusterRef
from controller.entry.wiring import NoTracker, mlflow_credentials, tracker_for

PASSWORD = "pw-not-for-messages"


def loaded(tmp_path: Path, cluster_extra: str = "", upload: str = "mlflow: true"):
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"""
apiVersion: evalrun.io/v1alpha1
kind: EvalCluster
metadata: {{name: local}}
spec: {{scheduler: {{type: local}}, jobsDir: {tmp_path}/jobs, logsDir: {tmp_path}/logs, jobScript: /bin/true
        {cluster_extra}}}
---
apiVersion: evalrun.io/v1alpha1
kind: EvalRun
metadata: {{name: nightly}}
spec: {{cluster: local, models: [org/m1-8B], datasets: [DCAgent/tiny], upload: {{{upload}}}}}
""")
    specs = load_specs([spec])
    return specs.evalruns[0], specs.clusters[ClusterRef(name="local")]


class Secrets:
    def __init__(self, values: dict[tuple[str, str], str]) -> None:
        self.values = values

    def get(self, ref: SecretRef) -> str | None:
        return self.values.get((ref.name, ref.key))

    def where(self, ref: SecretRef) -> str:
        return f"add key {ref.key!r} to Secret {ref.name!r}"


@pytest.mark.parametrize(("cluster_extra", "upload", "env", "expected"), [
    ("", "mlflow: true, mlflowTrackingUri: 'http://run:5000'", "http://env:5000", "http://run:5000"),
    (", mlflowTrackingUri: 'http://cluster:5000'", "mlflow: true, mlflowTrackingUri: 'http://run:5000'", None,
     "http://run:5000"),
    (", mlflowTrackingUri: 'http://cluster:5000'", "mlflow: true", "http://env:5000", "http://cluster:5000"),
    ("", "mlflow: true", "http://env:5000", "http://env:5000"),
])
def test_the_tracking_uri_comes_from_the_run_then_the_cluster_then_the_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cluster_extra: str, upload: str, env: str | None,
        expected: str) -> None:
    if env is None:
        monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    else:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", env)
    run, cluster = loaded(tmp_path, cluster_extra, upload)

    tracker = tracker_for(run, cluster, Secrets({}))

    assert tracker is not None and tracker[1] == "nightly"
    assert getattr(tracker[0], "_where", None) == expected


def test_no_uri_anywhere_fails_every_upload_saying_where_to_set_one(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    run, cluster = loaded(tmp_path)

    tracker = tracker_for(run, cluster, Secrets({}))

    assert tracker is not None and isinstance(tracker[0], NoTracker)
    assert "spec.mlflowTrackingUri (EvalCluster)" in tracker[0].reason


def test_the_runs_secret_wins_over_the_clusters(tmp_path: Path) -> None:
    run, cluster = loaded(tmp_path, ", mlflowTrackingUri: 'http://c:5000', mlflowCredentialsSecret: cluster-ml",
                          "mlflow: true, mlflowCredentialsSecret: run-ml")
    secrets = Secrets({("run-ml", "token"): "tok-" + PASSWORD, ("cluster-ml", "username"): "bob",
                       ("cluster-ml", "password"): PASSWORD})

    tracker = tracker_for(run, cluster, secrets)

    assert tracker is not None
    assert getattr(tracker[0], "_credentials", None) == {"MLFLOW_TRACKING_TOKEN": "tok-" + PASSWORD}
    assert mlflow_credentials("cluster-ml", secrets) == {"MLFLOW_TRACKING_USERNAME": "bob",
                                                         "MLFLOW_TRACKING_PASSWORD": PASSWORD}


def test_a_missing_or_half_secret_says_where_to_add_it_and_shows_no_value(tmp_path: Path) -> None:
    run, cluster = loaded(tmp_path, ", mlflowTrackingUri: 'http://c:5000'", "mlflow: true, mlflowCredentialsSecret: ml")

    tracker = tracker_for(run, cluster, Secrets({("ml", "username"): "bob-user-name"}))  # no password, no token

    assert tracker is not None and isinstance(tracker[0], NoTracker)
    reason = tracker[0].reason
    assert "add key 'password' to Secret 'ml'" in reason and "add key 'token' to Secret 'ml'" in reason
    assert "bob-user-name" not in reason


ADMIN_URI, TENANT_URI, ALLOWED_URI = "http://admin-mlflow:5000", "http://tenant.example:5000", "http://shared:5000"
ADMIN_LOGIN = {"MLFLOW_TRACKING_USERNAME": "admin", "MLFLOW_TRACKING_PASSWORD": PASSWORD}
TENANT_LOGIN = {"MLFLOW_TRACKING_TOKEN": "tok-tenant"}
AMBIENT, NONE = "ambient", {}  # _credentials None: the process's own login; {}: no login at all


def shared_cluster(tmp_path: Path, kind: str, cluster_extra: str, upload: str):
    """An EvalRun on `kind` (ClusterEvalCluster: the admin's; EvalCluster: the tenant's own)."""
    spec = tmp_path / "spec.yaml"
    ref = "clusterRef: {kind: ClusterEvalCluster, name: hpc}" if kind == "ClusterEvalCluster" else "cluster: hpc"
    spec.write_text(f"""
apiVersion: evalrun.io/v1alpha1
kind: {kind}
metadata: {{name: hpc}}
spec: {{scheduler: {{type: local}}, jobsDir: {tmp_path}/jobs, logsDir: {tmp_path}/logs, jobScript: /bin/true
        {cluster_extra}}}
---
apiVersion: evalrun.io/v1alpha1
kind: EvalRun
metadata: {{name: nightly}}
spec: {{{ref}, models: [org/m1-8B], datasets: [DCAgent/tiny], upload: {{mlflow: true{upload}}}}}
""")
    specs = load_specs([spec])
    return specs.evalruns[0], next(iter(specs.clusters.values()))


@pytest.mark.parametrize(("kind", "cluster_extra", "upload", "expected"), [
    # the admin configured the URI: the admin's Secret goes there
    ("ClusterEvalCluster", f", mlflowTrackingUri: '{ADMIN_URI}', mlflowCredentialsSecret: admin-ml", "",
     (ADMIN_URI, ADMIN_LOGIN)),
    ("ClusterEvalCluster", f", mlflowTrackingUri: '{ADMIN_URI}', mlflowCredentialsSecret: admin-ml",
     f", mlflowTrackingUri: '{ADMIN_URI}'", (ADMIN_URI, ADMIN_LOGIN)),  # the same URI, written again
    # a tenant redirects it: not the admin's Secret; its own, or none
    ("ClusterEvalCluster", f", mlflowTrackingUri: '{ADMIN_URI}', mlflowCredentialsSecret: admin-ml",
     f", mlflowTrackingUri: '{TENANT_URI}'", (TENANT_URI, NONE)),
    ("ClusterEvalCluster", ", mlflowCredentialsSecret: admin-ml", f", mlflowTrackingUri: '{TENANT_URI}'",
     (TENANT_URI, NONE)),
    ("ClusterEvalCluster", f", mlflowTrackingUri: '{ADMIN_URI}', mlflowCredentialsSecret: admin-ml",
     f", mlflowTrackingUri: '{TENANT_URI}', mlflowCredentialsSecret: tenant-ml", (TENANT_URI, TENANT_LOGIN)),
    # ... unless the admin allows that URI (--allowed-mlflow-uri)
    ("ClusterEvalCluster", f", mlflowTrackingUri: '{ADMIN_URI}', mlflowCredentialsSecret: admin-ml",
     f", mlflowTrackingUri: '{ALLOWED_URI}'", (ALLOWED_URI, ADMIN_LOGIN)),
    # no Secret anywhere: the process's own login only where allowed
    ("ClusterEvalCluster", f", mlflowTrackingUri: '{ADMIN_URI}'", f", mlflowTrackingUri: '{TENANT_URI}'",
     (TENANT_URI, NONE)),
    ("ClusterEvalCluster", f", mlflowTrackingUri: '{ADMIN_URI}'", f", mlflowTrackingUri: '{ALLOWED_URI}'",
     (ALLOWED_URI, AMBIENT)),
    # a tenant's own EvalCluster: its Secret is the tenant's, and follows the tenant's URI
    ("EvalCluster", f", mlflowTrackingUri: '{ADMIN_URI}', mlflowCredentialsSecret: admin-ml",
     f", mlflowTrackingUri: '{TENANT_URI}'", (TENANT_URI, ADMIN_LOGIN)),
])
def test_the_admins_credentials_go_only_where_the_admin_configured(
        tmp_path: Path, kind: str, cluster_extra: str, upload: str, expected: tuple[str, object]) -> None:
    run, cluster = shared_cluster(tmp_path, kind, cluster_extra, upload)
    admin = {("admin-ml", "username"): "admin", ("admin-ml", "password"): PASSWORD}
    tenant = {("tenant-ml", "token"): "tok-tenant"}
    own = Secrets(admin) if kind == "ClusterEvalCluster" else Secrets({**tenant, **admin})  # a tenant's: its own

    tracker = tracker_for(run, cluster, Secrets(tenant), cluster_secrets=own,
                          ambient_login=lambda uri: uri.startswith(ALLOWED_URI))

    assert tracker is not None
    uri, login = expected
    assert getattr(tracker[0], "_where", None) == uri
    credentials = getattr(tracker[0], "_credentials", "?")
    assert credentials == (None if login == AMBIENT else login)
