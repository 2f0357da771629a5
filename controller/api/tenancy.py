"""What a namespace's author may ask the operator to do: the operator policy, deny by default (issue 17).

Under the operator an EvalRun or EvalCluster is written by a tenant who may only create objects in their own
namespace; nothing they write may run with the operator's identity, reach its credentials or another tenant's
work. A ClusterEvalCluster is the admin's (cluster-scoped, like cert-manager's ClusterIssuer) and trusted. The
CLI on a login node has no policy: its user is the tenant.

Each refusal names the policy and the flag that would allow it, so a Stalled status says what to change.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field

from controller.api.capabilities import Check, Loc, checked, values_at
from controller.api.evalcluster import ClusterEvalCluster, EvalCluster
from controller.api.evalrun import EvalRun
from controller.api.urls import is_url, under_prefix, url_problem

# Names a namespaced object's env may not set: they make a loader, shell or interpreter run other code.
HOOK_NAMES = frozenset({"BASH_ENV", "ENV", "PATH", "SHELLOPTS", "BASHOPTS", "PS4", "PROMPT_COMMAND", "IFS",
                        "GLOBIGNORE", "EXECIGNORE", "BASH_XTRACEFD", "BASH_LOADABLES_PATH", "CDPATH", "FPATH",
                        "GCONV_PATH", "LOCPATH", "NLSPATH", "HOSTALIASES", "LOCALDOMAIN", "RES_OPTIONS",
                        "GLIBC_TUNABLES", "OPENSSL_CONF", "OPENSSL_ENGINES", "JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS",
                        "JDK_JAVA_OPTIONS", "CLASSPATH", "HOME", "ZDOTDIR", "TCLLIBPATH", "PAGER", "EDITOR",
                        "VISUAL", "BROWSER", "SSH_ASKPASS"})
HOOK_PREFIXES = ("LD_", "DYLD_", "PYTHON", "PERL5", "PERLLIB", "PERLIO", "RUBY", "NODE_", "MALLOC_", "BASH_FUNC_",
                 "GIT_", "LUA_", "R_PROFILE")
TRACKING_SCHEMES = ("http", "https")  # a tracking URI that is a file or database would open it as the operator


class OperatorPolicy(BaseModel):
    """The operator's flags: what namespaced EvalClusters and EvalRuns may use."""

    model_config = ConfigDict(frozen=True)

    allow_local_scheduler: bool = Field(False, description="namespaced EvalClusters may run jobs and scheduler "
                                                           "commands on the operator's host (a single-user laptop)")
    allowed_ssh_hosts: tuple[str, ...] = Field((), description="login hosts namespaced EvalClusters may reach "
                                                               "(shell patterns), each with its own key Secret")
    allowed_path_roots: tuple[str, ...] = Field((), description="where absolute local paths of namespaced "
                                                                "EvalClusters may point (after realpath)")
    allowed_mlflow_uris: tuple[str, ...] = Field((), description="tracking URIs (prefixes) the operator's own MLflow "
                                                                 "login may be sent to, and which tenants may "
                                                                 "name whatever their host")
    allowed_webhook_urls: tuple[str, ...] = Field((), description="webhook URLs (prefixes) tenants may name whatever "
                                                                  "their host (an in-cluster relay)")
    allow_model_selector: bool = Field(False, description="namespaced EvalRuns may select models from the results "
                                                          "DB's `models` table, which holds every namespace's")

    def ambient_mlflow_login(self, uri: str) -> bool:
        """May the operator's own MLflow credentials go to `uri`?"""
        return any(uri == allowed or uri.startswith(allowed.rstrip("/") + "/") for allowed in self.allowed_mlflow_uris)


Refusal = tuple[Loc, str]  # where in the object, and why


def cluster_refusals(cluster: EvalCluster | ClusterEvalCluster, directory: Path, policy: OperatorPolicy) -> list[Refusal]:
    """(where, why) for each thing a namespaced EvalCluster asks that the policy refuses; none for the admin's."""
    if isinstance(cluster, ClusterEvalCluster):
        return []
    spec = cluster.spec
    found: list[Refusal] = []
    on_this_host = spec.scheduler.type == "local" or not spec.scheduler.ssh
    if on_this_host and not policy.allow_local_scheduler:
        what = "a local scheduler" if spec.scheduler.type == "local" else "SLURM commands on the operator's host"
        found.append((("spec", "scheduler"), f"operator policy: a namespaced EvalCluster may not use {what} (it "
                      "would run as the operator); use scheduler.ssh to a login host with your own key Secret, a "
                      "ClusterEvalCluster of the admin, or start the operator with --allow-local-scheduler"))
    if spec.scheduler.ssh:
        found += _ssh_refusals(cluster, policy)
    elif spec.scheduler.slurm_conf is not None:
        found.append((("spec", "scheduler", "slurmConf"), "operator policy: slurmConf on the operator's host is "
                      "refused: a slurm.conf names plugins the SLURM commands load, run as the operator; name it "
                      "over scheduler.ssh (read on the login node) or use the admin's ClusterEvalCluster"))
    data = cluster.model_dump(by_alias=True)
    for at, value in _values(data, "EvalCluster", "env-name"):
        for name in value if isinstance(value, Mapping) else [value]:
            if is_hook(name):
                field = ".".join(str(part) for part in at[1:] if isinstance(part, str)).removesuffix(".name")
                found.append(((*at, name) if isinstance(value, Mapping) else at, f"operator policy: {field} {name} "
                              "would run other code in the job's loader or shell; namespaced EvalClusters may not "
                              "set it"))
    for at, value in _values(data, "EvalCluster", "local-path"):
        if is_url(value):
            found.append((at, f"operator policy: {at[-1]} {value} is a URL; a namespaced EvalCluster names plain "
                          "paths (of the login node over scheduler.ssh, else of its namespace's directory); a URL "
                          "needs the admin's ClusterEvalCluster"))
        elif on_this_host and (problem := path_problem(value, directory, policy.allowed_path_roots)):
            found.append((at, f"operator policy: {at[-1]} {problem}"))
    found += [(at, why) for at, value in _values(data, "EvalCluster", "tracking-uri")
              if (why := tracking_problem(value, policy))]
    found += [(at, f"operator policy: username {value} is not this namespace's own name; a namespaced EvalCluster "
                   f"writes rows as {cluster.metadata.namespace} or, unset, as the operator's user (another name "
                   "would publish its scores as another user's)")
              for at, value in _values(data, "EvalCluster", "own-name") if value != cluster.metadata.namespace]
    return found


def run_refusals(run: EvalRun, policy: OperatorPolicy) -> list[Refusal]:
    """What a (namespaced) EvalRun may not ask, whatever its cluster."""
    found: list[Refusal] = [(at, why) for at, value in _values(run.model_dump(by_alias=True), "EvalRun", "tracking-uri")
                            if (why := tracking_problem(value, policy))]
    if run.spec.model_selector is not None and not policy.allow_model_selector:
        found.append((("spec", "modelSelector"), "operator policy: modelSelector reads the results DB's models "
                      "table, which holds every namespace's model names (they would show here and be run); list your models in "
                      "spec.models, or ask the admin to start the operator with --allow-model-selector"))
    return found


def _values(data: Mapping[str, Any], kind: str, check: Check) -> list[tuple[Loc, Any]]:
    return [found for path in checked(kind, check) for found in values_at(data, path)]


def is_hook(name: str) -> bool:
    return name in HOOK_NAMES or name.startswith(HOOK_PREFIXES)


def tracking_problem(uri: str, policy: OperatorPolicy) -> str:
    """Why a tenant's tracking URI may not be dialled ("" when it may): read from it comes back in status."""
    scheme = urlsplit(uri).scheme
    if scheme not in TRACKING_SCHEMES:
        return (f"operator policy: mlflowTrackingUri {scheme}:// would open a file or database as the operator; "
                "namespaced objects may name only an http(s) tracking server")
    return "" if under_prefix(uri, policy.allowed_mlflow_uris) else _url_policy("mlflowTrackingUri", uri,
                                                                              "--allowed-mlflow-uri")


def webhook_problem(name: str, url: str, policy: OperatorPolicy) -> str:
    """Why a tenant's webhook URL (from its Secret: never quoted) may not be posted to ("" when it may)."""
    return "" if under_prefix(url, policy.allowed_webhook_urls) else _url_policy(f"webhook {name}", url,
                                                                                "--allowed-webhook-url")


def api_server_hosts() -> tuple[str, ...]:
    """The API server's in-cluster address, which a pod's environment names."""
    return tuple(filter(None, [os.environ.get("KUBERNETES_SERVICE_HOST")]))


def _url_policy(what: str, url: str, flag: str) -> str:
    problem = url_problem(url, api_server_hosts())
    return (f"operator policy: {what} {problem}; namespaced objects may name only http(s) servers on public "
            f"addresses, or under the admin's {flag}") if problem else ""


def path_problem(value: str, directory: Path, roots: Sequence[str]) -> str:
    """Why a local path of a namespaced EvalCluster may not be used: outside its namespace's dir (relative) or
    outside every allowed root (absolute), after symlinks are resolved."""
    resolved = Path(os.path.realpath(directory / value))
    allowed = [Path(os.path.realpath(directory))] if not Path(value).is_absolute() else []
    allowed += [Path(os.path.realpath(root)) for root in roots]
    if any(resolved == root or root in resolved.parents for root in allowed):
        return ""
    if not Path(value).is_absolute():
        return f"{value} leaves the namespace's directory {directory} (.. or a symlink)"
    listed = ", ".join(roots) if roots else "none (--allowed-path-root)"
    return f"{value} is outside the allowed path roots: {listed}"


def _ssh_refusals(cluster: EvalCluster, policy: OperatorPolicy) -> list[Refusal]:
    scheduler = cluster.spec.scheduler
    found: list[Refusal] = []
    host = (scheduler.ssh or "").rpartition("@")[2].rsplit(":", 1)[0].strip("[]")
    if not any(fnmatch.fnmatchcase(host, pattern) for pattern in policy.allowed_ssh_hosts):
        listed = ", ".join(policy.allowed_ssh_hosts) or "none"
        found.append((("spec", "scheduler", "ssh"), f"operator policy: ssh host {host} is not allowed (allowed: "
                      f"{listed}; --allowed-ssh-host)"))
    if scheduler.ssh_config is not None:
        found.append((("spec", "scheduler", "sshConfig"), "operator policy: sshConfig is refused on namespaced "
                      "EvalClusters; the operator writes its own ssh invocation from sshKeySecretRef and "
                      "knownHostsSecretRef"))
    for field, ref in (("sshKeySecretRef", scheduler.ssh_key_secret_ref),
                       ("knownHostsSecretRef", scheduler.known_hosts_secret_ref)):
        if ref is None:
            found.append((("spec", "scheduler", "ssh"), f"operator policy: a namespaced EvalCluster uses its own ssh "
                          f"identity, never the operator's: set scheduler.{field} (a Secret of namespace "
                          f"{cluster.metadata.namespace})"))
    return found


class NamespaceQuota(BaseModel):
    """How much one namespace may ask of the operator (issue 18): N EvalRuns of 10,000 cells each slowed every
    namespace linearly."""

    model_config = ConfigDict(frozen=True)

    max_evalruns: int = Field(50, ge=1, description="EvalRuns per namespace (--max-evalruns-per-namespace)")
    max_cells: int = Field(50_000, ge=1, description="cells per namespace, models × benchmarks of its EvalRuns "
                                                     "(--max-cells-per-namespace)")


class QuotaEntry(NamedTuple):
    """One EvalRun of a namespace, as the operator's index holds it."""

    created: str  # metadata.creationTimestamp: the oldest EvalRuns are admitted first
    uid: str
    cells: int


def quota_refusal(entries: Sequence[QuotaEntry], uid: str, quota: NamespaceQuota) -> str:
    """Why the EvalRun `uid` is over its namespace's quota ("" when it is within): EvalRuns are admitted oldest
    first, while both the count and the cells stay within."""
    count = cells = 0
    for entry in sorted(entries):
        count, cells = count + 1, cells + entry.cells
        if entry.uid == uid:
            if count > quota.max_evalruns:
                return (f"quota: this namespace has {len(entries)} EvalRuns, at most {quota.max_evalruns} are served "
                        "(oldest first; the operator's --max-evalruns-per-namespace)")
            if cells > quota.max_cells:
                return (f"quota: with this EvalRun the namespace asks for {cells} cells, at most {quota.max_cells} "
                        "are served (oldest EvalRuns first; --max-cells-per-namespace)")
            return ""
    return ""


def estimated_cells(spec: Mapping[str, Any]) -> int:
    """Models × benchmarks, from the object as written (what the index can know before a pass resolves it). A
    `modelSelector` counts as the `limit` models it may select: an EvalRun is within its quota for the most it can
    grow to, before anything is selected or planned."""
    benchmarks = [*(spec.get("datasets") or ()), *(spec.get("presets") or ())]  # lists: the CRD's schema says
    selector = spec.get("modelSelector")
    selectable = selector.get("limit", 0) if isinstance(selector, Mapping) else 0
    return (len(spec.get("models") or ()) + (selectable if isinstance(selectable, int) else 0)) * max(len(benchmarks), 1)
