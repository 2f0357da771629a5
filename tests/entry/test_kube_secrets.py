"""Why the operator has no value for a secretRef, in words that name the cause and the fix: a Secret it may not read
(403: the namespace has not opted in), no such Secret (404), no such key. At the API boundary (the client's own
exceptions and Secret objects); tests/kube/test_rbac.py proves the 403 on the real API server."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
from kubernetes.client import V1ObjectMeta, V1Secret
from kubernetes.client.exceptions import ApiException

from controller.adapters.kube import KubernetesSecrets
from controller.api.fields import SecretRef
from controller.entry.wiring import MissingSecret, secret_value

REPO = Path(__file__).resolve().parents[2]
REF = SecretRef(name="daytona", key="api-key")


class Core:
    """`read_namespaced_secret` as the API server answers it: a Secret, or the status it refuses with."""

    def __init__(self, answer: V1Secret | int) -> None:
        self.answer, self.reads = answer, 0

    def read_namespaced_secret(self, name: str, namespace: str) -> V1Secret:
        self.reads += 1
        if isinstance(self.answer, int):
            raise ApiException(status=self.answer, reason={403: "Forbidden", 404: "Not Found"}.get(self.answer, ""))
        return self.answer


class Api:
    def __init__(self, core: Core) -> None:
        self.core = core


def secret(**data: str) -> V1Secret:
    return V1Secret(metadata=V1ObjectMeta(name="daytona", namespace="team-a"),
                    data={key: base64.b64encode(value.encode()).decode() for key, value in data.items()})


def missing(answer: V1Secret | int) -> str:
    source = KubernetesSecrets(Api(Core(answer)), "team-a")  # type: ignore[arg-type]
    with pytest.raises(MissingSecret) as raised:
        secret_value(source, REF, "secretEnv DAYTONA_API_KEY")
    return str(raised.value)


def test_a_403_says_the_namespace_has_not_opted_in_and_the_line_that_opts_it_in() -> None:
    said = missing(403)

    assert said == ("secretEnv DAYTONA_API_KEY: the operator may not read Secret team-a/daytona (403 Forbidden): "
                    "namespace team-a has not opted in to Secret reads; its admin runs: "
                    "kubectl apply -n team-a -k manifests/tenant/ (secret 'daytona', key 'api-key')")
    assert "add key" not in said, "the key may well be there: the cause is the refusal"
    assert (REPO / "manifests" / "tenant" / "kustomization.yaml").is_file(), "the line names what the repo ships"


def test_a_404_says_to_create_the_secret_and_a_missing_key_to_add_it() -> None:
    assert "create Secret team-a/daytona with key 'api-key' (no such Secret)" in missing(404)
    assert "add key 'api-key' to Secret team-a/daytona (it has no such key)" in missing(secret(other="x"))


def test_a_readable_key_is_given_and_the_secret_read_once() -> None:
    core = Core(secret(**{"api-key": "dtn-123456"}))
    source = KubernetesSecrets(Api(core), "team-a")  # type: ignore[arg-type]

    assert source.get(REF) == "dtn-123456" and source.where(REF) == "key 'api-key' of Secret team-a/daytona"
    assert source.get(SecretRef(name="daytona", key="other")) is None and core.reads == 1


def test_any_other_failure_raises_never_missing() -> None:
    source = KubernetesSecrets(Api(Core(500)), "team-a")  # type: ignore[arg-type]
    with pytest.raises(ApiException):
        source.get(REF)
