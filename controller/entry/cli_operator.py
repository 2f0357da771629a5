"""`evalctl operator`: the Kubernetes operator's command line (the operator itself is entry/operator.py)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from controller.adapters.process import process_identity
from controller.entry.logs import configure_logging
from controller.entry.shell import (
    DEFAULT_STORE,
    RECONCILE_INTERVAL_S,
    StateURL,
    StoreURL,
    StoreURLs,
    Verbose,
    connect,
    exits,
)

# The options of `evalctl operator` (StoreURL, StateURL and Verbose are every command's: shell.py).
Namespaces = Annotated[list[str], typer.Option("-n", "--namespace", help="Watch only these namespaces "
                                                                      "(repeat; default: all).")]
BaseDir = Annotated[Path, typer.Option("--base-dir", help="Where relative paths of EvalClusters resolve "
                                                          "(jobsDir, jobScript, ...).")]
Interval = Annotated[float, typer.Option("--interval", min=1.0, help="Seconds between passes of an EvalRun "
                                                                    "when nothing changes.")]
Standalone = Annotated[bool, typer.Option("--standalone", help="No kopf peering (one replica, e.g. a laptop).")]
Peering = Annotated[str, typer.Option("--peering", help="ClusterKopfPeering (all namespaces) or KopfPeering "
                                                        "(with -n) name.")]
Priority = Annotated[int | None, typer.Option("--priority", help="Among peered replicas, the highest acts; the "
                                                                 "others stand by (default: a random one, so "
                                                                 "replicas started together never tie).")]
Liveness = Annotated[str | None, typer.Option("--liveness", help="Serve a liveness probe, e.g. "
                                                                 "http://0.0.0.0:8080/healthz.")]
MetricsPort = Annotated[int | None, typer.Option("--metrics-port", help="Serve Prometheus metrics on this port.")]
PassTimeout = Annotated[float | None, typer.Option(
    "--pass-timeout", min=1.0, help="Seconds a pass may take; then its EvalRun is Unknown and a hung pass keeps "
                                    "only its own worker (default: 4 intervals, at least 60).")]
OperatorNamespace = Annotated[str, typer.Option(
    "--operator-namespace", envvar="POD_NAMESPACE", help="The operator's namespace: where the Secrets of "
                                                         "ClusterEvalClusters are.")]

# Deny by default: what the admin opens to namespaces' authors, and how much each namespace may ask.
AllowLocalScheduler = Annotated[bool, typer.Option(
    "--allow-local-scheduler", help="Let namespaced EvalClusters run jobs or scheduler commands on this host, as "
                                    "the operator (a single-user laptop; never in a shared cluster).")]
AllowedSshHosts = Annotated[list[str], typer.Option(
    "--allowed-ssh-host", help="A login host (shell pattern) namespaced EvalClusters may reach with their own "
                               "key Secret (repeat).")]
AllowedPathRoots = Annotated[list[str], typer.Option(
    "--allowed-path-root", help="A directory absolute local paths of namespaced EvalClusters may point into "
                                "(repeat).")]
AllowedMlflowUris = Annotated[list[str], typer.Option(
    "--allowed-mlflow-uri", help="A tracking URI (prefix) the operator's own MLflow login may be sent to "
                                 "(repeat); tenants may name a URI under it whatever its host.")]
AllowedWebhookUrls = Annotated[list[str], typer.Option(
    "--allowed-webhook-url", help="A webhook URL (prefix) tenants may name whatever its host, e.g. an in-cluster "
                                  "relay (repeat); others must be http(s) on public addresses.")]
AllowModelSelector = Annotated[bool, typer.Option(
    "--allow-model-selector", help="Let namespaced EvalRuns use modelSelector: it reads the results DB's models "
                                   "table, with every namespace's model names.")]
MaxEvalRunsPerNamespace = Annotated[int, typer.Option(
    "--max-evalruns-per-namespace", min=1, help="EvalRuns served per namespace, oldest first; the others are "
                                                "Stalled (QuotaExceeded).")]
MaxCellsPerNamespace = Annotated[int, typer.Option(
    "--max-cells-per-namespace", min=1, help="Cells (models × benchmarks) served per namespace, oldest "
                                             "EvalRuns first.")]


def operator(
    store: StoreURL = None,
    state: StateURL = None,
    namespace: Namespaces = [],  # noqa: B006
    base_dir: BaseDir = Path(),
    interval: Interval = RECONCILE_INTERVAL_S,
    standalone: Standalone = False,
    peering: Peering = "evalrun-operator",
    priority: Priority = None,
    liveness: Liveness = None,
    metrics_port: MetricsPort = None,
    allow_local_scheduler: AllowLocalScheduler = False,
    allowed_ssh_host: AllowedSshHosts = [],  # noqa: B006
    allowed_path_root: AllowedPathRoots = [],  # noqa: B006
    allowed_mlflow_uri: AllowedMlflowUris = [],  # noqa: B006
    allowed_webhook_url: AllowedWebhookUrls = [],  # noqa: B006
    allow_model_selector: AllowModelSelector = False,
    max_evalruns_per_namespace: MaxEvalRunsPerNamespace = 50,
    max_cells_per_namespace: MaxCellsPerNamespace = 50_000,
    pass_timeout: PassTimeout = None,
    operator_namespace: OperatorNamespace = "evalrun-system",
    verbose: Verbose = 0,
) -> None:
    """Run the Kubernetes operator: reconcile EvalRun resources with the same passes as `reconcile`.

    Deny by default: what a namespace's author writes never runs as the operator (see docs/KUBERNETES.md "Multi-tenant
    clusters"); the --allow* flags open what the admin decides."""
    configure_logging(verbose, json_lines=True)  # beside kopf's JSON lines
    with exits():
        from controller.api.tenancy import NamespaceQuota, OperatorPolicy
        from controller.entry import operator as kube_operator  # kopf and the client load only for this command
        from controller.entry.operator_pass import OperatorConfig

        url = store or os.environ.get("EVALCTL_STORE") or DEFAULT_STORE
        state = state or os.environ.get("EVALCTL_STATE") or None
        connect(StoreURLs(url, state), readonly=False).close()  # a store that cannot be opened stops here, in one line
        policy = OperatorPolicy(allow_local_scheduler=allow_local_scheduler,
                                allowed_ssh_hosts=tuple(allowed_ssh_host), allowed_path_roots=tuple(allowed_path_root),
                                allowed_mlflow_uris=tuple(allowed_mlflow_uri),
                                allowed_webhook_urls=tuple(allowed_webhook_url),
                                allow_model_selector=allow_model_selector)
        config = OperatorConfig(store_url=url, state_url=state, base_dir=base_dir.resolve(), interval_s=interval,
                                holder=process_identity(), policy=policy, namespace=operator_namespace,
                                pass_timeout_s=pass_timeout or max(4 * interval, 60.0),
                                quota=NamespaceQuota(max_evalruns=max_evalruns_per_namespace,
                                                     max_cells=max_cells_per_namespace))
        kube_operator.run(config, namespaces=namespace, standalone=standalone, liveness=liveness,
                          metrics_port=metrics_port, peering=peering,
                          priority=priority if priority is not None else kube_operator.random_priority())
