"""Each cluster's preflight as a pass reads it (RULES §12): what its spec asks to check, and a passed preflight
remembered for the life of the process — `evalctl reconcile --loop` and the operator check a cluster once, not every
pass. A failed one, or one that could not run, is run again on the next pass, so a fix is picked up by itself. The
memory is keyed by the cluster and its whole spec: an edited EvalCluster is checked again."""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Callable

from controller.adapters.scheduler.commands import CommandRunner
from controller.adapters.scheduler.preflight import PreflightTarget, run_preflight
from controller.adapters.secrets import SecretMask
from controller.api.loader import LoadedCluster
from controller.core.preflight import Preflight

log = logging.getLogger("evalctl.preflight")
THIS_HOST = "this host"

_PASSED: set[str] = set()  # the clusters (by `_key`) whose preflight passed in this process
_GUARD = threading.Lock()


def preflight_target(cluster: LoadedCluster) -> PreflightTarget:
    """What the cluster's preflight checks. The jobs dir and the job script where its jobs see them (over ssh: the
    login node's paths; a URL is not checked); partition and account on SLURM; `scheduler.python` only where the
    run-dir probe runs it (over ssh, a plain jobsDir)."""
    spec = cluster.cluster.spec
    ssh = spec.scheduler.ssh
    jobs_dir = cluster.path(spec.jobs_dir)
    script = cluster.job_script
    slurm = spec.scheduler.type == "slurm"
    return PreflightTarget(cluster=str(cluster.ref), host=ssh or THIS_HOST, remote=bool(ssh),
                           jobs_dir=None if "://" in jobs_dir else jobs_dir,
                           job_script=None if "://" in script else script,
                           partition=spec.partition if slurm else None, account=spec.account if slurm else None,
                           python=spec.scheduler.python if ssh and "://" not in jobs_dir else None, slurm=slurm)


def remembered_preflight(cluster: LoadedCluster, commands: Callable[[], CommandRunner],
                         mask: SecretMask | None = None) -> Callable[[], Preflight]:
    """The pass's preflight of `cluster`: passed before in this process, it is not run again; else one command on
    `commands()` (made only then). Raises ObservationError when it cannot run."""
    target = preflight_target(cluster)
    key = _key(cluster, target)

    def preflight() -> Preflight:
        with _GUARD:
            if key in _PASSED:
                return Preflight(cluster=target.cluster, passed=("passed earlier in this process",))
        found = run_preflight(commands(), target, mask)
        if found.ok:
            with _GUARD:
                _PASSED.add(key)
        else:
            log.warning("preflight not passed: launches on the cluster held", extra={"cluster": target.cluster,
                                                                                     "reason": found.summary})
        return found

    return preflight


def _key(cluster: LoadedCluster, target: PreflightTarget) -> str:
    """The cluster as checked: its name, its spec (ssh settings and secret refs included) and where its relative
    paths resolve."""
    text = "\0".join((str(cluster.ref), str(cluster.directory), cluster.cluster.spec.model_dump_json(),
                      target.model_dump_json()))
    return hashlib.sha256(text.encode()).hexdigest()
