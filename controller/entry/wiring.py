"""Turn loaded specs into what the core runs: targets (cells + policy) and each cluster's adapters.

The only place that knows which backend implements which port.
"""

from __future__ import annotations

import functools
import getpass
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Literal, NoReturn, TypedDict
from urllib.parse import urlsplit

from fsspec import AbstractFileSystem

from controller.adapters.rundirs.harbor import HarborRunDirs
from controller.adapters.rundirs.post_eval import post_eval_analysis, write_post_eval_report
from controller.adapters.rundirs.remote import RunDirProbe
from controller.adapters.scheduler.commands import CommandFailed, CommandResult, CommandRunner, EnvCommands, LocalCommands
from controller.adapters.scheduler.local import LocalScheduler
from controller.adapters.scheduler.slurm import SlurmOptions, SlurmScheduler
from controller.adapters.secrets import SecretMask
from controller.api.catalog import Catalog
from controller.api.evalrun import CANCEL_ON_DELETE, PlacementSpec
from controller.api.fields import SecretRef
from controller.api.loader import LoadedCluster, LoadedRun, SpecSet
from controller.api.resolve import resolution_notes, resolve, walltime_warnings
from controller.core.actions import Launch
from controller.core.actor import Actor, JobLauncher
from controller.core.admission import GatePolicy
from controller.core.cluster_view import ClusterPorts
from controller.core.health import HealthLimits
from controller.core.job_env import JobSecrets, JobSettings
from controller.core.metrics import RunMetrics
from controller.core.notify import NotifyEvent
from controller.core.observed import RunDirFacts
from controller.core.placement import PlacementPolicy
from controller.core.planner import Policy
from controller.core.ports import ObservationError, Scheduler, StoreUnavailable, TrackedRun, Tracker, TrackerRecord
from controller.core.run_target import RunTarget
from controller.core.store import Store
from controller.core.tracking import Analysis
from controller.core.types import ClusterRef, EvalRunRef, walltime_seconds
from controller.core.walltime import WalltimePolicy
from controller.entry.lane_resolution import lanes_for
from controller.entry.preflight import remembered_preflight
from controller.entry.secrets import EnvironmentSecrets, SecretSource
from controller.entry.selection import Intake

if TYPE_CHECKING:
    from controller.adapters.remote.ssh import SshIdentity

log = logging.getLogger("evalctl.wiring")


class MissingSecret(RuntimeError):
    """A secretRef has no value in this environment (the message names the variable, never a value)."""


def utc_now() -> datetime:
    return datetime.now(UTC)


def username_of(cluster: LoadedCluster) -> str:
    return cluster.cluster.spec.username or getpass.getuser()


def policy_for(run: LoadedRun, cluster: LoadedCluster, catalog: Catalog) -> Policy:
    spec, cspec, health = run.run.spec, cluster.cluster.spec, run.run.spec.health
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
        zombie_grace=timedelta(minutes=spec.monitor.zombie_grace_minutes),
        may_upload=spec.upload.db,
        track=spec.upload.mlflow,
        admission=GatePolicy(max_infra_fraction=spec.upload.max_infra_error_fraction,
                             partial_upload=spec.upload.partial == "upload" or spec.upload.force_upload,
                             min_completed_fraction=spec.upload.min_completed_fraction,
                             trust_threshold=spec.report.trust_threshold),
        overlong="walltime" if spec.upload.overlong_hours is None else timedelta(hours=spec.upload.overlong_hours),
        hold_overlong=spec.upload.overlong == "hold",
        force_upload=spec.upload.force_upload,
        max_submissions_per_pass=cspec.max_submissions_per_pass,
        max_live_jobs=cspec.max_live_jobs,
        tunnel_pairs=tuple(pair.name for pair in spec.pinggy.pairs),
        tunnel_urls={pair.name: pair.url for pair in spec.pinggy.pairs if pair.url},
        cancels_on_delete=spec.deletion_policy == CANCEL_ON_DELETE,
        health=HealthLimits(
            instant_fail=timedelta(seconds=health.instant_fail_seconds),
            dead_launch_trials=health.dead_launch_trials,
            launch_grace=timedelta(minutes=health.launch_grace_minutes),
            no_traffic=timedelta(minutes=health.no_traffic_minutes),
            bad_request_fraction=health.bad_request_fraction,
            max_refires=health.max_refires,
            refire_backoff=timedelta(minutes=health.refire_backoff_minutes),
            bad_node=timedelta(hours=health.bad_node_hours),
            max_quarantined_nodes=health.max_quarantined_nodes,
            failure_modes=catalog.failures.modes_for(cspec.failure_catalog),
        ),
        cluster=str(cluster.ref),
        max_gpu_hours=spec.budget.max_gpu_hours,
        gpus_per_job=cspec.gpus_per_job,
        size_bands=catalog.size_policy.bands_data(),
        walltime=WalltimePolicy(auto=spec.walltime == "auto", cancel_margin=timedelta(minutes=spec.monitor.pre_walltime_minutes),
                                minimum=timedelta(seconds=walltime_seconds(cspec.shortest_sized_walltime)),
                                maximum=timedelta(seconds=walltime_seconds(cspec.longest_walltime))),
    )


def targets_for(specs: SpecSet, catalog: Catalog, intakes: Mapping[EvalRunRef, Intake] | None = None) -> list[RunTarget]:
    """Each EvalRun's target, its cells resolved once: the listed models, and those its modelSelector's `intakes`
    took (entry/passes.py reads them first). An EvalRun with several clusters gets one lane per cluster."""
    targets = []
    for run in specs.evalruns:
        clusters = specs.clusters_of(run)
        cluster = clusters[0]
        intake = (intakes or {}).get(run.ref) or Intake(models=None)
        for each in clusters:
            for note in resolution_notes(run.run, each.cluster, catalog):  # RULES §6: a size-rule fallback is said
                log.info("resolved with a fallback", extra={"evalrun": str(run.ref), "note": note})
        if len(clusters) > 1:
            lanes, cells = lanes_for(run, clusters, catalog, intake.models,
                                     functools.partial(policy_for, run, catalog=catalog))
        else:
            lanes, cells = (), resolve(run.run, cluster.cluster, catalog, intake.models)
            for warning in walltime_warnings(run.run, cluster.cluster, catalog):
                log.warning("walltime clamped", extra={"evalrun": str(run.ref), "note": warning})
        targets.append(RunTarget(evalrun=run.ref, cluster=cluster.ref, cells=cells,
                                 policy=lanes[0].policy if lanes else policy_for(run, cluster, catalog),
                                 generation=run.run.metadata.generation, notify=notify_routes(run),
                                 selections=intake.selections, intake=intake.note, unknown=intake.unknown,
                                 lanes=lanes, placement=placement_of(run) if lanes else None))
    return targets


def placement_of(run: LoadedRun) -> PlacementPolicy:
    """spec.placement in the units the pass uses (RULES §15)."""
    spec = run.run.spec.placement or PlacementSpec()
    spill = spec.spill_after_minutes
    return PlacementPolicy(strategy=spec.strategy, spill_after=None if spill is None else timedelta(minutes=spill))


def notify_routes(run: LoadedRun) -> dict[NotifyEvent, tuple[str, ...]]:
    """Which of the EvalRun's webhooks are told of each event (none: it records no transitions)."""
    hooks = run.run.spec.notify.webhooks
    return {event: names for event in NotifyEvent
            if (names := tuple(hook.name for hook in hooks if event.value in hook.events))}


def cluster_ports(specs: SpecSet, store: Store, catalog: Catalog, secrets: SecretSource | None = None, *,
                  public_errors: bool = False, admin_secrets: SecretSource | None = None,
                  allowed_mlflow_uri: Callable[[str], bool] | None = None) -> dict[ClusterRef, ClusterPorts]:
    """Each cluster's adapters; `secrets` (default: the environment) gives secretRefs their values.

    The operator: `public_errors`: ssh/sftp failures say only which host and what failed, the detail is logged;
    `admin_secrets`: where a ClusterEvalCluster's secretRefs are (the operator's namespace; an EvalRun's own refs
    stay in `secrets`, its namespace); `allowed_mlflow_uri`: the tracking URIs that may get this process's own
    MLflow login (MLFLOW_TRACKING_*, when neither the EvalRun nor its cluster names a credentials Secret) and that
    a tenant may name whatever their address (others are dialled only at public addresses); None: any (the CLI)."""
    secrets = secrets or EnvironmentSecrets()
    errors = catalog.error_classes
    runs: dict[EvalRunRef, LoadedRun] = {r.ref: r for r in specs.evalruns}
    ports = {}
    for ref, cluster in specs.clusters.items():
        cspec = cluster.cluster.spec
        jobs_dir = cluster.path(cspec.jobs_dir)
        logs_dir = cluster.path(cspec.logs_dir)
        own = admin_secrets if cluster.cluster_scoped and admin_secrets is not None else secrets  # the cluster's refs
        mask = secret_mask(cluster, specs, own, secrets)  # what its jobs print and write is masked as it is read
        scheduler = scheduler_for(cluster, logs_dir, mask, own, public_errors=public_errors)
        probe = run_dir_probe(cluster, jobs_dir, own, public_errors=public_errors)
        run_dirs = HarborRunDirs(jobs_dir, errors, probe=probe, mask=mask,
                                 fs=None if probe else run_dirs_fs(cluster, jobs_dir, own, public_errors=public_errors))

        def actor_for(target: RunTarget, cluster: LoadedCluster = cluster, scheduler: Scheduler = scheduler,
                      jobs_dir: str = jobs_dir, logs_dir: str = logs_dir, own: SecretSource = own) -> Actor:
            run = runs[target.evalrun]
            cspec = cluster.cluster.spec
            settings = JobSettings(jobs_dir=jobs_dir, username=username_of(cluster),
                                   gpu_memory_util=cspec.gpu_memory_util,
                                   infra_error_threshold=run.run.spec.resume.infra_error_threshold, env=dict(cspec.env))
            launcher = JobLauncher(cluster=str(cluster.ref), script=cluster.job_script, logs_dir=logs_dir,
                                   settings=settings)

            def job_secrets(launch: Launch) -> JobSecrets:
                """Read at submit time: a missing secret fails that submission, not the whole pass."""
                found = JobSecrets(env=resolve_secret_env(cluster, own))
                return found if launch.tunnel is None else pinggy_secrets(run, launch.tunnel, secrets, found)

            def analyze(facts: RunDirFacts, metrics: RunMetrics) -> Analysis:
                remote = run_dirs_fs(cluster, jobs_dir, own, public_errors=public_errors)
                _, summary = write_post_eval_report(facts.path, facts, errors, metrics, fs=remote() if remote else None)
                return post_eval_analysis(summary, facts, errors)

            return Actor(store, scheduler, launcher, job_secrets, analyze, errors, utc_now,
                         tracker=tracker_for(run, cluster, secrets, cluster_secrets=own,
                                             ambient_login=allowed_mlflow_uri or (lambda _: True),
                                             admin_allows=allowed_mlflow_uri))

        commands = functools.partial(cluster_commands, cluster, own, public_errors=public_errors)
        ports[ref] = ClusterPorts(scheduler=scheduler, run_dirs=run_dirs, actor_for=actor_for,
                                   submissions_per_minute=cspec.scheduler.submissions_per_minute,
                                   preflight=remembered_preflight(cluster, commands, mask))
    return ports


def tracker_for(run: LoadedRun, cluster: LoadedCluster | None = None, secrets: SecretSource | None = None, *,
                cluster_secrets: SecretSource | None = None, ambient_login: Callable[[str], bool] = lambda _: True,
                admin_allows: Callable[[str], bool] | None = None) -> tuple[Tracker, str] | None:
    """The EvalRun's MLflow server and experiment when `upload.mlflow` is on (mlflow loads only then).

    Server: the EvalRun's, else its EvalCluster's, else this process's environment's. Credentials: see
    `mlflow_login`. `admin_allows` (the operator): a tracking URI a tenant wrote that it does not allow is
    connected to only at a public address, checked when dialled."""
    upload = run.run.spec.upload
    if not upload.mlflow:
        return None
    experiment = upload.mlflow_experiment or run.run.metadata.name
    cspec = cluster.cluster.spec if cluster is not None else None
    uri = upload.mlflow_tracking_uri or (cspec and cspec.mlflow_tracking_uri) or os.environ.get("MLFLOW_TRACKING_URI")
    if not uri:
        return NoTracker("no MLflow tracking URI: set spec.upload.mlflowTrackingUri (EvalRun), "
                         "spec.mlflowTrackingUri (EvalCluster) or $MLFLOW_TRACKING_URI"), experiment
    secrets = secrets or EnvironmentSecrets()
    login = mlflow_login(uri, run, cluster, ambient_login)
    lane = run.ref.namespace or ""  # a tenant's slow server delays only its own namespace's uploads
    tenant_wrote = bool(upload.mlflow_tracking_uri) or (cluster is not None and not cluster.cluster_scoped
                                                        and uri == cluster.cluster.spec.mlflow_tracking_uri)
    public_only = admin_allows is not None and run.ref.namespace is not None and tenant_wrote and not admin_allows(uri)
    if login is None:  # never a login sent where a tenant said
        return _mlflow(uri, lane, public_only, ()), experiment
    secret, whose = login
    if whose == "ambient":
        return _mlflow(uri, lane, public_only), experiment
    source = secrets if whose == "run" else cluster_secrets or secrets
    try:
        credentials = mlflow_credentials(secret, source)
    except MissingSecret as exc:
        return NoTracker(str(exc)), experiment
    return _mlflow(uri, lane, public_only, tuple(sorted(credentials.items()))), experiment


def mlflow_login(uri: str, run: LoadedRun, cluster: LoadedCluster | None,
                 ambient_login: Callable[[str], bool]) -> tuple[str, Literal["run", "cluster", "ambient"]] | None:
    """Whose MLflow login goes to `uri`: (Secret name, "run" | "cluster"), ("", "ambient") for this process's
    own (MLFLOW_TRACKING_*), None for none.

    The EvalRun's own Secret goes wherever it says. The admin's credentials go only where the admin configured:
    a ClusterEvalCluster's Secret to its own mlflowTrackingUri (an EvalRun that redirects the URI elsewhere does
    not take it along, issue 27), the process's own login to URIs `ambient_login` allows; either also goes to a
    URI `ambient_login` allows. A namespaced EvalCluster's Secret is its tenant's, like the EvalRun's."""
    upload = run.run.spec.upload
    if upload.mlflow_credentials_secret:
        return upload.mlflow_credentials_secret, "run"
    if cluster is not None and (secret := cluster.cluster.spec.mlflow_credentials_secret):
        redirected = upload.mlflow_tracking_uri not in (None, cluster.cluster.spec.mlflow_tracking_uri)
        return (secret, "cluster") if not (cluster.cluster_scoped and redirected) or ambient_login(uri) else None
    return ("", "ambient") if ambient_login(uri) else None


def mlflow_credentials(secret: str, secrets: SecretSource) -> dict[str, str]:
    """MLFLOW_TRACKING_* values from the Secret's `username` + `password`, or `token`."""
    refs = {key: SecretRef(name=secret, key=key) for key in ("username", "password", "token")}
    found = {key: value for key, ref in refs.items() if (value := secrets.get(ref))}
    if not ("token" in found or {"username", "password"} <= found.keys()):
        raise MissingSecret(f"MLflow credentials: secret {secret!r} needs keys username and password, or token: "
                            f"{secrets.where(refs['username'])} and {secrets.where(refs['password'])}, "
                            f"or {secrets.where(refs['token'])}")
    return {f"MLFLOW_TRACKING_{key.upper()}": value for key, value in found.items()}


@functools.cache
def _mlflow(uri: str, namespace: str, public_only: bool,
            credentials: tuple[tuple[str, str], ...] | None = None) -> Tracker:
    from controller.adapters.tracker.mlflow import MlflowTracker, strip_credentials

    return MlflowTracker(uri, credentials=dict(credentials) if credentials is not None else None,
                         lane=f"{namespace} {strip_credentials(uri)}", public_only=public_only)


class NoTracker:
    """`upload.mlflow` without a server: every upload fails with the reason, so the cell says what to set."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def log(self, experiment: str, record: TrackerRecord) -> str:
        raise StoreUnavailable(self.reason)

    def read_back(self, experiment: str, run_tag: str, owner: str) -> TrackedRun | None:
        raise ObservationError(self.reason)


def scheduler_for(cluster: LoadedCluster, logs_dir: str, mask: SecretMask, secrets: SecretSource | None = None, *,
                  public_errors: bool = False) -> Scheduler:
    cspec = cluster.cluster.spec
    if cspec.scheduler.type == "local":
        return LocalScheduler(os.path.join(logs_dir, ".local-scheduler"), mask, gpus_per_job=cspec.gpus_per_job)
    options = SlurmOptions(partition=cspec.partition, account=cspec.account, reservation=cspec.reservation,
                           qos=cspec.qos, gpus_per_job=cspec.gpus_per_job)
    commands = cluster_commands(cluster, secrets, public_errors=public_errors)
    # over ssh, commands run on the login node as its login user (asked there: `id -un`)
    user = None if cspec.scheduler.ssh else getpass.getuser()
    return SlurmScheduler(commands, options, logs_dir=logs_dir, user=user, mask=mask)


def cluster_commands(cluster: LoadedCluster, secrets: SecretSource | None = None, *,
                     public_errors: bool = False) -> CommandRunner:
    """Where the cluster's commands run: its login node over ssh, else this host; with its slurm.conf, if named."""
    scheduler = cluster.cluster.spec.scheduler
    ssh = scheduler.ssh
    commands = ssh_commands(cluster, ssh, secrets, public_errors=public_errors) if ssh else LocalCommands()
    if scheduler.slurm_conf is None:
        return commands
    return EnvCommands(commands, {"SLURM_CONF": scheduler.slurm_conf if ssh else cluster.path(scheduler.slurm_conf)})


def ssh_commands(cluster: LoadedCluster, host: str, secrets: SecretSource | None, *,
                 public_errors: bool) -> CommandRunner:
    """Commands on the cluster's login node; when its identity cannot be had, commands that fail saying why."""
    # imported here: paramiko costs ~0.5 s of CLI start-up, paid only for clusters reached over ssh
    from controller.adapters.remote.ssh import SshCommands

    try:
        access = ssh_access(cluster, secrets or EnvironmentSecrets())
    except (MissingSecret, CommandFailed) as exc:
        return UnavailableCommands(str(exc))
    return SshCommands(host, public_errors=public_errors, **access)


def run_dir_probe(cluster: LoadedCluster, jobs_dir: str, secrets: SecretSource | None = None, *,
                  public_errors: bool = False) -> RunDirProbe | None:
    """A plain jobsDir of a cluster reached over ssh is on its login node: the probe reads it there (docs:
    issue 19). None: read it as the path or URL says (this host, or the URL's filesystem, sftp:// included)."""
    ssh = cluster.cluster.spec.scheduler.ssh
    if not ssh or "://" in jobs_dir:
        return None
    return RunDirProbe(ssh_commands(cluster, ssh, secrets, public_errors=public_errors), ssh,
                       cluster.cluster.spec.scheduler.python)


def ssh_config_of(cluster: LoadedCluster) -> str | None:
    """The cluster's sshConfig, relative to its spec file; None: ssh's default (~/.ssh/config)."""
    config = cluster.cluster.spec.scheduler.ssh_config
    return cluster.path(os.path.expanduser(config)) if config else None


class SshAccess(TypedDict, total=False):
    """What SshCommands and sftp_filesystem are given: an identity from Secrets, or the user's ssh setup."""

    identity: SshIdentity
    config_file: str | None
    known_hosts: str | None


def ssh_access(cluster: LoadedCluster, secrets: SecretSource) -> SshAccess:
    """With `scheduler.sshKeySecretRef`: that key and the knownHostsSecretRef's lines ONLY (no sshConfig, no
    ~/.ssh, no agent: what the operator gives a namespaced EvalCluster). Without: the user's own ssh setup,
    as on their shell (the CLI on a login node), with the knownHostsSecretRef's lines if given.

    Raises MissingSecret naming the Secret, or CommandFailed when the files cannot be written."""
    from controller.adapters.remote.ssh import materialize_identity, materialize_known_hosts

    spec = cluster.cluster.spec.scheduler
    key = None if spec.ssh_key_secret_ref is None else secret_value(secrets, spec.ssh_key_secret_ref,
                                                                    "scheduler.sshKeySecretRef")
    known = (None if spec.known_hosts_secret_ref is None
             else secret_value(secrets, spec.known_hosts_secret_ref, "scheduler.knownHostsSecretRef"))
    if key is not None:
        return {"identity": materialize_identity(key, known or "")}  # no known_hosts: every host key is refused
    return {"config_file": ssh_config_of(cluster),
            "known_hosts": None if known is None else materialize_known_hosts(known)}


class UnavailableCommands:
    """A login node that cannot be reached as configured (its key Secret is missing): every command fails with
    the reason, so that cluster's observation is unknown and says what to fix; the pass goes on."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def run(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, timeout: float,
            stdin: str | None = None) -> CommandResult:
        raise CommandFailed(self.reason)


def run_dirs_fs(cluster: LoadedCluster, jobs_dir: str, secrets: SecretSource | None = None, *,
                public_errors: bool = False) -> Callable[[], AbstractFileSystem] | None:
    """How a cluster reached over ssh reaches its run dirs as files (the post-eval report is written there; they
    are observed by the probe): a plain jobsDir path is on the login node, so sftp there (host key checked, with
    the same identity as its commands), connected lazily (an unreachable host makes a pass unknown, not the CLI
    fail). None: as the path or URL says (this host, or the URL's filesystem)."""
    ssh = cluster.cluster.spec.scheduler.ssh
    if jobs_dir.startswith("sftp://"):  # fsspec's own sftp accepts any host key: use the checked one
        ssh = urlsplit(jobs_dir).netloc
    elif not ssh or "://" in jobs_dir:
        return None
    from controller.adapters.remote.sftp import sftp_filesystem

    try:
        access = ssh_access(cluster, secrets or EnvironmentSecrets())
    except (MissingSecret, CommandFailed) as exc:
        return functools.partial(_unreachable, str(exc))
    return functools.partial(sftp_filesystem, ssh, public_errors=public_errors, **access)


def _unreachable(reason: str) -> NoReturn:
    raise ObservationError(reason)


def pinggy_secrets(run: LoadedRun, pair_name: str, secrets: SecretSource, found: JobSecrets) -> JobSecrets:
    """The leased pair's URL and token (EVAL_PINGGY_URL / EVAL_PINGGY_TOKEN); the token is read only now, at submit."""
    pair = next((p for p in run.run.spec.pinggy.pairs if p.name == pair_name), None)
    if pair is None:  # the planner hands out pool pairs only; this would be a bug, said plainly
        raise MissingSecret(f"pinggy pair {pair_name} is not in spec.pinggy.pairs of {run.ref}")
    token = secret_value(secrets, pair.secret_ref, f"pinggy pair {pair.name}")
    return found.model_copy(update={"pinggy_url": pair.url, "pinggy_token": token})


def secret_value(secrets: SecretSource, ref: SecretRef, what: str) -> str:
    value = secrets.get(ref)
    if value is None:
        raise MissingSecret(f"{what}: {secrets.where(ref)} (secret {ref.name!r}, key {ref.key!r})")
    return value


def secret_mask(cluster: LoadedCluster, specs: SpecSet, secrets: SecretSource,
                run_secrets: SecretSource | None = None) -> SecretMask:
    """Every secret the cluster's jobs can see (its secretEnv from `secrets`, the pinggy tokens of its EvalRuns from
    `run_secrets`): what a job prints is masked with all of them, or withheld when one is not available here; and,
    as everywhere, with this process's own secrets and every token shape (adapters/secrets.py)."""
    run_secrets = run_secrets or secrets
    found = [(secrets, item.secret_ref) for item in cluster.cluster.spec.secret_env]
    found += [(run_secrets, pair.secret_ref) for run in specs.evalruns if cluster.ref in run.cluster_refs
              for pair in run.run.spec.pinggy.pairs]
    values = {source.where(ref): source.get(ref) for source, ref in found}
    return SecretMask(values=[v for v in values.values() if v is not None],
                      unavailable=[where for where, v in values.items() if v is None])


def resolve_secret_env(cluster: LoadedCluster, secrets: SecretSource) -> dict[str, str]:
    return {item.name: secret_value(secrets, item.secret_ref, f"secretEnv {item.name}")
            for item in cluster.cluster.spec.secret_env}
