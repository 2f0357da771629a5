"""The Kubernetes API, as the operator uses it beyond what kopf does: the EvalCluster an EvalRun names (and its
status: its quarantined nodes), the Secrets its secretRefs point at, and the EvalRuns to wake when their EvalCluster
changes.

The official client, configured like kubectl (in-cluster service account, else $KUBECONFIG / ~/.kube/config).
Reads that fail raise; callers turn that into a Stalled or retried pass, never into "absent".
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any, Literal, cast

import kubernetes
from kubernetes.client.exceptions import ApiException

from controller.api.fields import API_VERSION, SecretRef

GROUP, VERSION = API_VERSION.split("/")


def load_client_config() -> None:
    """In a pod: its service account; elsewhere: the kubeconfig kubectl would use."""
    try:
        kubernetes.config.load_incluster_config()  # type: ignore[no-untyped-call]
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config()  # type: ignore[no-untyped-call]  # the client ships few hints


class KubeApi:
    def __init__(self) -> None:
        self.custom = kubernetes.client.CustomObjectsApi()
        self.core = kubernetes.client.CoreV1Api()

    def get(self, plural: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        """One EvalRun or EvalCluster, or (namespace None) a cluster-scoped ClusterEvalCluster; None when it does
        not exist."""
        try:
            if namespace is None:
                return cast(dict[str, Any], self.custom.get_cluster_custom_object(GROUP, VERSION, plural, name))
            return cast(dict[str, Any], self.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, plural,
                                                                                name))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def list(self, plural: str, namespace: str | None) -> list[dict[str, Any]]:
        """The objects of one namespace, or (None) of every namespace the operator watches."""
        if namespace is None:
            found = cast(dict[str, Any], self.custom.list_cluster_custom_object(GROUP, VERSION, plural))
        else:
            found = cast(dict[str, Any], self.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, plural))
        return cast(list[dict[str, Any]], found.get("items", []))

    def namespace_labels(self, name: str) -> dict[str, str] | None:
        """A Namespace's labels (a ClusterEvalCluster's selector grants by them); None when it does not exist.
        Listed by name, not got: the ClusterRole's `list namespaces` (kopf's) covers it, no new verb."""
        found = self.core.list_namespace(field_selector=f"metadata.name={name}").items
        meta = found[0].metadata if found else None
        return None if meta is None else dict(meta.labels or {})

    def annotate(self, plural: str, namespace: str, name: str, annotations: Mapping[str, str | None]) -> None:
        """Set annotations of a namespaced object (a merge patch: None removes one)."""
        self.custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, plural, name,
                                                   {"metadata": {"annotations": dict(annotations)}})

    def patch_status(self, plural: str, namespace: str | None, name: str, status: Mapping[str, Any]) -> None:
        """Merge `status` into an object's status (namespace None: a cluster-scoped ClusterEvalCluster)."""
        body = {"status": dict(status)}
        if namespace is None:
            self.custom.patch_cluster_custom_object_status(GROUP, VERSION, plural, name, body)
        else:
            self.custom.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, plural, name, body)


TENANT_OPT_IN = "kubectl apply -n {namespace} -k manifests/tenant/"  # what opts a namespace in (its admin runs it)
Unread = Literal[403, 404]  # why a Secret has no data here: not ours to read, or not there


class KubernetesSecrets:
    """`SecretSource` over the Secrets of one namespace, each Secret read at most once per instance (a pass).

    A value it cannot give is said with its cause: the Secret may not be read (403: the namespace has not opted in),
    there is no such Secret (404), or the Secret lacks the key. Any other failure raises: never "missing"."""

    def __init__(self, api: KubeApi, namespace: str) -> None:
        self.api, self.namespace = api, namespace
        self._read: dict[str, Mapping[str, str] | Unread] = {}

    def get(self, ref: SecretRef) -> str | None:
        data = self._data(ref.name)
        if isinstance(data, int) or ref.key not in data:
            return None
        return base64.b64decode(data[ref.key]).decode()

    def where(self, ref: SecretRef) -> str:
        """How a human provides it, from what the read found (the first read when `get` made none); where it is,
        when it is there."""
        data, secret = self._data(ref.name), f"Secret {self.namespace}/{ref.name}"
        if data == 403:
            return (f"the operator may not read {secret} (403 Forbidden): namespace {self.namespace} has not opted in "
                    f"to Secret reads; its admin runs: {TENANT_OPT_IN.format(namespace=self.namespace)}")
        if data == 404:
            return f"create {secret} with key {ref.key!r} (no such Secret)"
        if ref.key in data:
            return f"key {ref.key!r} of {secret}"
        return f"add key {ref.key!r} to {secret} (it has no such key)"

    def _data(self, name: str) -> Mapping[str, str] | Unread:
        """The Secret's data, or the status (403, 404) that says why there is none."""
        if name not in self._read:
            self._read[name] = self._fetch(name)
        return self._read[name]

    def _fetch(self, name: str) -> Mapping[str, str] | Unread:
        try:
            secret = self.api.core.read_namespaced_secret(name, self.namespace)
        except ApiException as exc:
            if exc.status == 403:
                return 403
            if exc.status == 404:
                return 404
            raise
        return cast(Mapping[str, str], secret.data or {})
