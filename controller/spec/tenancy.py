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

from controller.spec.models import ClusterEvalCluster, EvalCluster, EvalRun

# Names a namespaced object's env/secretEnv may not set: they make a loader, shell or interpreter run other code.
HOOK_NAMES = frozenset({"BASH_ENV", "ENV", "PATH", "SHELLOPTS", "BASHOPTS", "PS4", "PROMPT_COMMAND", "IFS",
                        "CDPATH", "GCONV_PATH", "HOSTALIASES", "LOCALDOMAIN", "RES_OPTIONS", "GLIBC_TUNABLES",
                        "JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS", "HOME", "ZDOTDIR", "GIT_SSH", "GIT_SSH_COMMAND"})
HOOK_PREFIXES = ("LD_", "DYLD_", "PYTHON", "PERL5", "PERLLIB", "PERLIO", "RUBY", "NODE_", "MALLOC_", "BASH_FUNC_")
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
                                                                 "login may be sent to")

    def ambient_mlflow_login(self, uri: str) -> bool:
        """May the operator's own MLflow credentials go to `uri`?"""
        return any(uri == allowed or uri.startswith(allowed.rstrip("/") + "/") for allowed in self.allowed_mlflow_uris)


Refusal = tuple[tuple[str | int, ...], str]  # where in the object, and why


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
    for name in spec.env:
        if is_hook(name):
            found.append((("spec", "env", name), f"operator policy: env {name} would run other code in the job's "
                          "loader or shell; namespaced EvalClusters may not set it"))
    for index, entry in enumerate(spec.secret_env):
        if is_hook(entry.name):
            found.append((("spec", "secretEnv", index, "name"), f"operator policy: secretEnv {entry.name} would run "
                          "other code in the job's loader or shell; namespaced EvalClusters may not set it"))
    if on_this_host:
        for field, alias in (("jobs_dir", "jobsDir"), ("logs_dir", "logsDir"), ("job_script", "jobScript")):
            problem = path_problem(getattr(spec, field), directory, policy.allowed_path_roots)
            if problem:
                found.append((("spec", alias), f"operator policy: {alias} {problem}"))
    if spec.mlflow_tracking_uri is not None and (why := tracking_problem(spec.mlflow_tracking_uri)):
        found.append((("spec", "mlflowTrackingUri"), why))
    return found


def run_refusals(run: EvalRun) -> list[Refusal]:
    """What a (namespaced) EvalRun may not ask, whatever its cluster."""
    uri = run.spec.upload.mlflow_tracking_uri
    why = tracking_problem(uri) if uri is not None else ""
    return [(("spec", "upload", "mlflowTrackingUri"), why)] if why else []


def is_hook(name: str) -> bool:
    return name in HOOK_NAMES or name.startswith(HOOK_PREFIXES)


def tracking_problem(uri: str) -> str:
    scheme = urlsplit(uri).scheme
    if scheme in TRACKING_SCHEMES:
        return ""
    return (f"operator policy: mlflowTrackingUri {scheme}:// would open a file or database as the operator; "
            "namespaced objects may name only an http(s) tracking server")


def path_problem(value: str, directory: Path, roots: Sequence[str]) -> str:
    """Why a local path of a namespaced EvalCluster may not be used: outside its namespace's dir (relative) or
    outside every allowed root (absolute), after symlinks are resolved."""
    if "://" in value:
        return f"{value} is a URL; namespaced EvalClusters read and write local paths only"
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
    """Models × benchmarks, from the object as written (what the index can know before a pass resolves it)."""
    benchmarks = [*(spec.get("datasets") or ()), *(spec.get("presets") or ())]  # lists: the CRD's schema says
    return len(spec.get("models") or ()) * max(len(benchmarks), 1)
