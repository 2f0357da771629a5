"""Where a tenant's EvalRun makes the operator connect, checked before its pass (issue 27).

The loader judges the URLs written in the objects; two things only the operator can see: a webhook's URL, which
lives in a Secret of the namespace, and the addresses a tenant's host name resolves to (`mlflow.team-b` is a
Service through the resolver's search list; any name may point at 127.0.0.1). Each is refused as `InvalidSpec`
naming the policy. Names are resolved as the sender and the tracker will resolve them, with a deadline; one that
does not resolve is refused too (fail closed, checked again next pass). A name may resolve differently when it
is dialled (DNS rebinding): the sender and the tracker check the address again there (adapters/dialing.py).
"""

from __future__ import annotations

import ipaddress
import socket
import threading
from collections.abc import Callable, Iterator
from urllib.parse import urlsplit

from controller.api.errors import SpecError
from controller.api.loader import LoadedRun, SpecSet
from controller.api.tenancy import OperatorPolicy, webhook_problem
from controller.api.urls import address_problem, host_of, ip_of, under_prefix
from controller.entry.secrets import SecretSource

RESOLVE_TIMEOUT_S = 2.0  # getaddrinfo has no timeout of its own
Resolver = Callable[[str], list[str]]  # a host's addresses; raises OSError when it has none


def egress_refusals(specs: SpecSet, secrets: SecretSource, policy: OperatorPolicy,
                    resolve: Resolver | None = None) -> list[SpecError]:
    """One error per URL of a namespaced EvalRun (and its namespaced clusters) the operator must not dial."""
    resolve = resolve or resolve_host
    errors = []
    for run in specs.evalruns:
        if run.run.metadata.namespace is None:
            continue
        label = f"EvalRun {run.ref}"
        for what, url, allowed, flag in _tenant_urls(specs, run, secrets, policy):
            why = webhook_problem(what.removeprefix("webhook "), url, policy) if what.startswith("webhook") else ""
            if not why and not under_prefix(url, allowed) and (problem := resolved_problem(url, resolve)):
                why = (f"operator policy: {what} {problem}; namespaced objects may name only http(s) servers on "
                       f"public addresses, or under the admin's {flag}")
            if why:
                errors.append(SpecError(label, 1, 1, why))
    return errors


def _tenant_urls(specs: SpecSet, run: LoadedRun, secrets: SecretSource,
                 policy: OperatorPolicy) -> Iterator[tuple[str, str, tuple[str, ...], str]]:
    """(what, URL, the admin's prefixes, their flag) for each URL a tenant chose; a missing webhook Secret is
    said elsewhere (its messages wait)."""
    for hook in run.run.spec.notify.webhooks:
        if url := secrets.get(hook.secret_ref):
            yield f"webhook {hook.name}", url, policy.allowed_webhook_urls, "--allowed-webhook-url"
    tracking = [run.run.spec.upload.mlflow_tracking_uri]
    tracking += [cluster.cluster.spec.mlflow_tracking_uri for cluster in specs.clusters_of(run)
                 if not cluster.cluster_scoped]  # each cluster its run may upload from
    for uri in dict.fromkeys(filter(None, tracking)):
        yield "mlflowTrackingUri", uri, policy.allowed_mlflow_uris, "--allowed-mlflow-uri"


def resolved_problem(url: str, resolve: Resolver) -> str:
    """Why the addresses `url`'s host resolves to may not be dialled ("" when every one is public)."""
    host = host_of(urlsplit(url))
    if ip_of(host) is not None:
        return ""  # judged as written
    try:
        addresses = resolve(host)
    except OSError as exc:
        return f"names {host}, which does not resolve now ({exc.strerror or exc}; checked again next pass)"
    for text in addresses:
        if problem := address_problem(ipaddress.ip_address(text.partition("%")[0])):
            return f"names {host}, which {problem}"
    return ""


def resolve_host(host: str, timeout_s: float = RESOLVE_TIMEOUT_S) -> list[str]:
    """Every address `host` resolves to, or OSError (also after `timeout_s`: the lookup is left to finish)."""
    found: list[list[str] | OSError] = []

    def lookup() -> None:
        try:
            found.append([str(info[4][0]) for info in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)])
        except OSError as exc:
            found.append(exc)

    thread = threading.Thread(target=lookup, name="evalctl-resolve", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if not found:
        raise OSError(f"no answer in {timeout_s:g}s")
    if isinstance(found[0], OSError):
        raise found[0]
    if not found[0]:
        raise OSError("no address")
    return found[0]
