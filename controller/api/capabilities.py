"""Every field a tenant writes that names a path, URL, host, command, regex, env var, Secret or another object is
a capability the operator grants by policy (issue 27): this table classifies each one, `tenancy` enforces the
`check` it names, and docs/MULTI_TENANT.md shows it (regenerate: `python -m controller.api.capabilities`).

tests/api/test_capabilities.py walks the CRD schema: a string field of an EvalCluster or EvalRun that is neither
here nor in PLAIN fails it, so no field is added unclassified. ClusterEvalClusters are the admin's and unchecked.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

Kind = Literal["path", "URL", "host", "command", "regex", "env var", "Secret", "object", "identity"]
# What tenancy.py does with a field of this check (none: the schema, the loader or the adapter's own rule).
Check = Literal["local-path", "env-name", "tracking-uri", "webhook-url", "ssh", "shared-table", "own-name", "never",
                "none"]


class Capability(BaseModel):
    """What a namespaced object may write in one field, and what is refused (with the flag that opens it)."""

    model_config = ConfigDict(frozen=True)

    kind: Kind
    check: Check
    allowed: str
    refused: str


_LOGIN_PATH = Capability(kind="path", check="local-path", allowed="over `scheduler.ssh`: any absolute path on the "
                         "login node (read as the tenant's own login); on the operator's host (with "
                         "`--allow-local-scheduler`): relative under `--base-dir/<namespace>/`, absolute under an "
                         "`--allowed-path-root`", refused="a URL (`file://`, `ssh://`, `sftp://`, `http://`, `s3://`…: "
                         "fsspec would use the operator's own disk and credentials); `..` or a symlink out of the "
                         "namespace's directory")
_ENV = Capability(kind="env var", check="env-name", allowed="names of the job's own variables",
                  refused="loader and shell hooks (`LD_*`, `BASH_ENV`, `ENV`, `PATH`, `PYTHON*`, `SHELLOPTS`, `PS4`, "
                          "`BASH_FUNC_*`, … `tenancy.HOOK_NAMES`); the contract's `EVAL_*` and `SLURM_*` names")
_TRACKING = Capability(kind="URL", check="tracking-uri", allowed="an http(s) server on a public address, or under "
                       "an `--allowed-mlflow-uri` prefix", refused="other schemes (`sqlite:`, `postgresql:` open a "
                       "database as the operator); loopback, link-local, metadata, private and API-server hosts, in "
                       "any spelling, and names resolving to them; a login in the URL")
_SECRET = Capability(kind="Secret", check="none", allowed="a Secret of the object's own namespace",
                     refused="another namespace's (the operator reads only the object's namespace)")


def _secret(of: str) -> dict[str, Capability]:
    return {f"{of}.name": _SECRET, f"{of}.key": _SECRET}


CAPABILITIES: dict[str, Capability] = {
    "EvalCluster.spec.scheduler.ssh": Capability(
        kind="host", check="ssh", allowed="a login host matching an `--allowed-ssh-host` pattern, with the "
        "namespace's own `sshKeySecretRef` and `knownHostsSecretRef`", refused="any other host; the operator's "
        "own ssh key; unchecked host keys"),
    "EvalCluster.spec.scheduler.sshConfig": Capability(
        kind="path", check="ssh", allowed="nothing", refused="always: an ssh config runs commands (`Match exec`, "
        "`ProxyCommand`) and reads any file as the operator"),
    **_secret("EvalCluster.spec.scheduler.sshKeySecretRef"),
    **_secret("EvalCluster.spec.scheduler.knownHostsSecretRef"),
    "EvalCluster.spec.scheduler.python": Capability(
        kind="command", check="none", allowed="any, run over `scheduler.ssh` as the tenant's own login",
        refused="without ssh it is not run"),
    "EvalCluster.spec.scheduler.slurmConf": Capability(
        kind="path", check="ssh", allowed="over `scheduler.ssh`: a path on the login node, read as the tenant's own "
        "login", refused="on the operator's host: a slurm.conf names plugins the SLURM commands load, run as the "
        "operator"),
    "EvalCluster.spec.jobsDir": _LOGIN_PATH,
    "EvalCluster.spec.logsDir": _LOGIN_PATH,
    "EvalCluster.spec.jobScript": _LOGIN_PATH.model_copy(update={"kind": "command"}),
    "EvalCluster.spec.env": _ENV,
    "EvalCluster.spec.secretEnv[].name": _ENV,
    **_secret("EvalCluster.spec.secretEnv[].secretRef"),
    "EvalCluster.spec.mlflowTrackingUri": _TRACKING,
    "EvalCluster.spec.mlflowCredentialsSecret": _SECRET,
    "EvalCluster.spec.failureCatalog[].patterns[]": Capability(
        kind="regex", check="none", allowed="a regular expression RE2 accepts, of at most 300 characters: matched "
        "in linear time on the job's output", refused="one RE2 refuses (backreferences, lookaround)"),
    "EvalCluster.spec.failureCatalog[].jobEnv": _ENV.model_copy(update={
        "allowed": "names of the job's own variables, and `EVAL_CLEAR_COMPILE_CACHE` (what a refire gets)"}),
    "EvalRun.spec.cluster": Capability(
        kind="object", check="none", allowed="an EvalCluster of the EvalRun's namespace", refused="another "
        "namespace's (the name is looked up in the EvalRun's own)"),
    "EvalRun.spec.clusterRef.name": Capability(
        kind="object", check="none", allowed="an EvalCluster of its namespace, or a ClusterEvalCluster",
        refused="another namespace's EvalCluster"),
    "EvalRun.spec.clusters[]": Capability(
        kind="object", check="none", allowed="each an EvalCluster of the EvalRun's namespace, or a ClusterEvalCluster "
        "(`{kind: ClusterEvalCluster, name: N}`)", refused="another namespace's EvalCluster (a name is looked up "
        "in the EvalRun's own)"),
    "EvalRun.spec.placement.pin[].cluster": Capability(
        kind="object", check="none", allowed="the name of one of `clusters`", refused="any other"),
    "EvalRun.spec.harborConfig": Capability(
        kind="path", check="none", allowed="any: it is read by the job, with the cluster's identity",
        refused="nothing the operator opens"),
    "EvalRun.spec.modelSelector.namePatterns[]": Capability(
        kind="object", check="shared-table", allowed="with `--allow-model-selector`: globs over the results DB's "
        "`models` table, in which every namespace's models are", refused="without it, `modelSelector` at all: it "
        "would show a tenant the model names of every namespace (in `.status.modelSelector`) and run them"),
    "EvalRun.spec.upload.mlflowTrackingUri": _TRACKING,
    "EvalRun.spec.upload.mlflowCredentialsSecret": _SECRET,
    "EvalRun.spec.pinggy.pairs[].url": Capability(
        kind="URL", check="none", allowed="any: the job dials it, never the operator", refused="nothing"),
    **_secret("EvalRun.spec.pinggy.pairs[].secretRef"),
    "EvalRun.spec.notify.webhooks[].secretRef.name": Capability(
        kind="URL", check="webhook-url", allowed="a Secret of the namespace whose value is an http(s) URL of a "
        "public host, or under an `--allowed-webhook-url` prefix", refused="loopback, link-local, metadata, "
        "private and API-server hosts, in any spelling, and names resolving to them; a login in the URL"),
    "EvalRun.spec.notify.webhooks[].secretRef.key": _SECRET,
    "EvalCluster.spec.username": Capability(
        kind="identity", check="own-name", allowed="unset (the operator's user, as on the admin's "
        "ClusterEvalClusters), or the namespace's own name", refused="another name: rows in the shared results DB, "
        "and MLflow runs, would be published as another user's"),
}

# String fields that name none of the above: labels, scheduler options, arguments the schema keeps inert.
PLAIN = frozenset({
    "EvalCluster.spec.partition", "EvalCluster.spec.account",
    "EvalCluster.spec.reservation", "EvalCluster.spec.qos", "EvalCluster.spec.timeLimit",
    "EvalCluster.spec.maxTimeLimit", "EvalCluster.spec.minTimeLimit", "EvalCluster.spec.hardwareProfile",
    "EvalCluster.spec.failureCatalog[].name",
    "EvalCluster.spec.failureCatalog[].advice", "EvalRun.spec.models[]", "EvalRun.spec.modelSelector.createdWithin",
    "EvalRun.spec.modelSelector.exclude[]", "EvalRun.spec.presets[]", "EvalRun.spec.placement.pin[].models[]",
    "EvalRun.spec.datasets[]", "EvalRun.spec.agent", "EvalRun.spec.agentKwargs[]",
    "EvalRun.spec.upload.mlflowExperiment", "EvalRun.spec.pinggy.pairs[].name", "EvalRun.spec.notify.webhooks[].name",
})

BEGIN, END = "<!-- capabilities: generated by python -m controller.api.capabilities -->", "<!-- /capabilities -->"


def checked(kind: str, check: Check) -> list[str]:
    """The field paths (below the object, e.g. `spec.env`) of `kind` that tenancy checks with `check`."""
    return [path.partition(".")[2] for path, cap in CAPABILITIES.items()
            if path.startswith(kind + ".") and cap.check == check]


Loc = tuple[str | int, ...]


def values_at(data: Any, path: str) -> Iterator[tuple[Loc, Any]]:
    """(location, value) of each value at `path` in a dumped object: `a.b[].c` goes through every item of b."""
    found: list[tuple[Loc, Any]] = [((), data)]
    for part in path.split("."):
        name, many = part.removesuffix("[]"), part.endswith("[]")
        found = [((*loc, name), value[name]) for loc, value in found
                 if isinstance(value, Mapping) and value.get(name) is not None]
        if many:
            found = [((*loc, index), item) for loc, items in found for index, item in enumerate(items)]
    return iter(found)


def render_table() -> str:
    """The capability table of docs/MULTI_TENANT.md."""
    rows = ["| field | names a | a namespaced object may write | refused (`InvalidSpec`, naming the policy) |",
            "| --- | --- | --- | --- |"]
    rows += [f"| `{path}` | {cap.kind} | {cap.allowed} | {cap.refused} |" for path, cap in CAPABILITIES.items()]
    return "\n".join([BEGIN, *rows, END])


def _write(doc: Path) -> None:
    text = doc.read_text()
    start, end = text.index(BEGIN), text.index(END) + len(END)
    doc.write_text(text[:start] + render_table() + text[end:])


if __name__ == "__main__":
    _write(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/MULTI_TENANT.md"))
