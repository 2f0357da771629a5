"""Turn loaded specs into what the core runs: targets (cells + policy) and each cluster's adapters.

The only place that knows which backend implements which port.
"""

from __future__ import annotations

import getpass
import os
import re
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta

from controller.adapters.rundirs.harbor import HarborRunDirs
from controller.adapters.rundirs.report import write_post_eval_report
from controller.adapters.scheduler.local import LocalScheduler
from controller.core.actor import Actor, JobLauncher
from controller.core.job_env import job_environment
from controller.core.planner import Policy
from controller.core.ports import Store
from controller.core.reconcile import ClusterPorts, RunTarget
from controller.core.types import Action, Cell, RunDirFacts
from controller.spec.catalog import Catalog
from controller.spec.loader import LoadedCluster, LoadedRun, SpecSet
from controller.spec.models import SecretRef
from controller.spec.resolve import resolve


class MissingSecret(RuntimeError):
    """A secretRef has no value in this environment (the message names the variable, never a value)."""


def utc_now() -> datetime:
    return datetime.now(UTC)


def username_of(cluster: LoadedCluster) -> str:
    return cluster.cluster.spec.username or getpass.getuser()


def policy_for(run: LoadedRun, cluster: LoadedCluster) -> Policy:
    spec, cspec = run.run.spec, cluster.cluster.spec
    return Policy(
        username=username_of(cluster),
        force_eval=spec.force_eval,
        suspend=spec.suspend,
        stale_started=timedelta(hours=spec.stale_started_hours),
        stale_pending=timedelta(hours=spec.stale_pending_hours),
        max_total_fires=spec.resume.max_total_fires,
        infra_error_threshold=spec.resume.infra_error_threshold,
        near_complete_fraction=spec.monitor.near_complete_fraction,
        stale_near=timedelta(minutes=spec.monitor.stale_near_minutes),
        stale_general=timedelta(minutes=spec.monitor.stale_general_minutes),
        pre_walltime=timedelta(minutes=spec.monitor.pre_walltime_minutes),
        settle=timedelta(minutes=spec.monitor.settle_minutes),
        upload_db=spec.upload.db,
        min_completed_fraction=spec.upload.min_completed_fraction,
        max_submissions_per_pass=cspec.max_submissions_per_pass,
    )


def targets_for(specs: SpecSet, catalog: Catalog) -> list[RunTarget]:
    targets = []
    for run in specs.evalruns:
        cluster = specs.cluster_of(run)
        cells = resolve(run.run, cluster.cluster, catalog)
        targets.append(RunTarget(evalrun=run.run.metadata.name, cluster=cluster.cluster.metadata.name,
                                 cells=tuple(cells), policy=policy_for(run, cluster)))
    return targets


def cluster_ports(specs: SpecSet, store: Store, catalog: Catalog) -> dict[str, ClusterPorts]:
    errors = catalog.error_classes
    runs_by_name = {r.run.metadata.name: r for r in specs.evalruns}
    ports = {}
    for name, cluster in specs.clusters.items():
        cspec = cluster.cluster.spec
        jobs_dir = cluster.path(cspec.jobs_dir)
        logs_dir = cluster.path(cspec.logs_dir)
        if cspec.scheduler.type != "local":
            raise NotImplementedError("scheduler type 'slurm' is not available in this release")
        scheduler = LocalScheduler(os.path.join(logs_dir, ".local-scheduler"))
        run_dirs = HarborRunDirs(jobs_dir, errors)

        def actor_for(target: RunTarget, cluster: LoadedCluster = cluster, scheduler: LocalScheduler = scheduler,
                      jobs_dir: str = jobs_dir, logs_dir: str = logs_dir) -> Actor:
            run = runs_by_name[target.evalrun]
            cspec = cluster.cluster.spec
            launcher = JobLauncher(script=cluster.job_script, logs_dir=logs_dir, time_limit=cspec.time_limit,
                                   username=username_of(cluster),
                                   env={**cspec.env, **resolve_secret_env(cluster)})

            def cell_env(cell: Cell, action: Action) -> Mapping[str, str]:
                return job_environment(cell, jobs_dir=jobs_dir, username=username_of(cluster),
                                       gpu_memory_util=cspec.gpu_memory_util,
                                       infra_error_threshold=run.run.spec.resume.infra_error_threshold)

            def analyze(facts: RunDirFacts) -> None:
                write_post_eval_report(facts.path, facts, errors)

            return Actor(store, scheduler, launcher, cell_env, analyze, errors, utc_now)

        ports[name] = ClusterPorts(scheduler=scheduler, run_dirs=run_dirs, actor_for=actor_for)
    return ports


def secret_variable(ref: SecretRef) -> str:
    """CLI secrets come from the environment: EVALCTL_SECRET_<NAME>_<KEY>."""
    return "EVALCTL_SECRET_" + re.sub(r"[^A-Za-z0-9]", "_", f"{ref.name}_{ref.key}").upper()


def resolve_secret_env(cluster: LoadedCluster) -> dict[str, str]:
    values = {}
    for item in cluster.cluster.spec.secret_env:
        variable = secret_variable(item.secret_ref)
        if variable not in os.environ:
            raise MissingSecret(f"secretEnv {item.name}: set {variable} (secret {item.secret_ref.name!r}, "
                                f"key {item.secret_ref.key!r})")
        values[item.name] = os.environ[variable]
    return values
