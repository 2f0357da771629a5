"""`EvalCluster` (namespaced, a tenant's) and `ClusterEvalCluster` (cluster-scoped, the admin's, granted to
namespaces): where and how jobs run (apiVersion evalrun.io/v1alpha1)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, Field, field_validator, model_validator

from controller.api.fields import (
    ENV_ENTRIES_MAX,
    ENV_NAME,
    ENV_NAME_MAX,
    ENV_TOTAL_MAX,
    POOL_MAX,
    RESERVED_ENV,
    SECRET_LOOKING_ENV,
    TIME_LIMIT_MAX_DAYS,
    EnvValue,
    Name,
    NamespaceName,
    ObjectMeta,
    PathText,
    PositiveInt,
    SecretEnv,
    SecretRef,
    Short,
    SpecModel,
    entry_error,
    first_duplicate,
    ssh_host,
    visible,
    walltime_text,
)
from controller.core import patterns
from controller.core.job_env import is_reserved
from controller.core.remedies import FailureMode, FailureStage, RemedyKind
from controller.core.types import walltime_seconds

SHORTEST_SIZED = "00:30:00"  # minTimeLimit's default: a model server started and a first trial done


class SchedulerSpec(SpecModel):
    """Which scheduler runs the jobs, and where its commands run."""

    type: Literal["local", "slurm"] = Field(description="local: detached subprocesses on this host; slurm: sbatch.")
    ssh: Annotated[str, Field(max_length=255), AfterValidator(visible), AfterValidator(ssh_host)] | None = Field(
        None, description="Run scheduler commands on this login host over ssh (slurm only): host, user@host[:port]."
    )
    ssh_config: PathText | None = Field(None, description="ssh_config file for the ssh host alias (default: "
                                                          "~/.ssh/config). Refused on a namespaced EvalCluster under "
                                                          "the operator, which writes its own.")
    ssh_key_secret_ref: SecretRef | None = Field(
        None, description="The private key ssh uses, from a Secret (in the EvalCluster's namespace): what a namespaced "
                          "EvalCluster under the operator must use, never the operator's own key.")
    known_hosts_secret_ref: SecretRef | None = Field(
        None, description="known_hosts lines for the ssh host, from a Secret: host keys are always checked.")
    submissions_per_minute: PositiveInt = Field(6, le=600, description="Launches per minute on this cluster, "
                                                                       "counted from the queue's own submit times.")
    python: PathText = Field("python3", description="The login node's Python (3.9 or later) that runs the run-dir "
                                                    "probe (ssh only): a name on its PATH or an absolute path.")
    slurm_conf: PathText | None = Field(None, description="The slurm.conf its SLURM commands read (SLURM_CONF), where "
                                                          "one host reaches several clusters; default: the host's "
                                                          "own. Relative to the spec file; over ssh, a path on the "
                                                          "login node.")

    @model_validator(mode="after")
    def _ssh_needs_slurm(self) -> SchedulerSpec:
        if self.ssh and self.type != "slurm":
            raise entry_error(("ssh", "[key]"), "ssh_needs_slurm", "ssh is only supported with type: slurm")
        if self.slurm_conf and self.type != "slurm":
            raise entry_error(("slurmConf", "[key]"), "slurm_conf_needs_slurm", "slurmConf is only valid with "
                                                                               "type: slurm")
        if self.ssh_config and not self.ssh:
            raise entry_error(("sshConfig", "[key]"), "ssh_config_needs_ssh", "sshConfig is only valid with ssh")
        for field, ref in (("sshKeySecretRef", self.ssh_key_secret_ref), ("knownHostsSecretRef",
                                                                          self.known_hosts_secret_ref)):
            if ref is not None and not self.ssh:
                raise entry_error((field, "[key]"), "needs_ssh", "{field} is only valid with ssh", field=field)
        return self


MlflowTrackingUri = Annotated[str, Field(max_length=2048,
                                         pattern=r"^(https?|sqlite|databricks|postgresql|mysql)://[^@\s]*$")]
MLFLOW_CREDENTIALS = ("Secret with the MLflow server's credentials: keys `username` and `password`, or `token` "
                      "(CLI: EVALCTL_SECRET_<NAME>_<KEY>).")


FAILURE_MODES_MAX = 64
FAILURE_PATTERNS_MAX = 16
PATTERN_MAX = 300
REMEDY_ENV = frozenset({"EVAL_CLEAR_COMPILE_CACHE"})  # contract names a remedy may set on its refire


class FailureModeSpec(SpecModel):
    """A failure a job's log shows, and what to do about it (the failure catalog, RULES §9)."""

    name: Name = Field(description="Shown in reasons, `explain` and Events, e.g. nccl-timeout.")
    patterns: list[Annotated[str, Field(min_length=1, max_length=PATTERN_MAX)]] = Field(
        min_length=1, max_length=FAILURE_PATTERNS_MAX,
        description="Regular expressions in RE2 syntax (Python's, without backreferences or lookaround; matched in "
                    "time linear in the log); any one matching a line of the log is this failure.")
    when: FailureStage = Field(description="start: the log of a job that FAILED before doing any work; running: "
                                           "what a running job prints.")
    remedy: RemedyKind = Field(description="refire (a new attempt), refire-elsewhere (the same, the node excluded "
                                           "for health.badNodeHours), back-off (the cluster launches nothing for "
                                           "backoffMinutes), or hold (a human decides).")
    advice: Annotated[str, Field(min_length=1, max_length=500)] = Field(description="What it means and what to do.")
    job_env: dict[str, str] = Field(default_factory=dict, max_length=8,
                                    description="Environment the refire gets, e.g. EVAL_CLEAR_COMPILE_CACHE: '1'.")
    backoff_minutes: int = Field(15, ge=1, le=24 * 60, description="back-off: how long the cluster launches nothing.")

    @field_validator("patterns")
    @classmethod
    def _compiles(cls, value: list[str]) -> list[str]:
        for index, pattern in enumerate(value):
            if (why := patterns.refusal(pattern)) is not None:
                raise entry_error((index,), "pattern", "not a regular expression RE2 accepts: {error}", error=why)
        return value

    @field_validator("job_env")
    @classmethod
    def _remedy_env(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            if (is_reserved(name) and name not in REMEDY_ENV) or not ENV_NAME.fullmatch(name):
                raise entry_error((name, "[key]"), "remedy_env", "a refire may set {allowed} or names of your "
                                  "own, not {name}", allowed=", ".join(sorted(REMEDY_ENV)), name=name)
        return value

    def mode(self) -> FailureMode:
        return FailureMode(name=self.name, patterns=tuple(self.patterns), when=self.when, remedy=self.remedy,
                           advice=self.advice, job_env=dict(self.job_env), backoff_minutes=self.backoff_minutes)


class EvalClusterSpec(SpecModel):
    """Cluster particulars, written once per cluster and shared by every EvalRun on it."""

    scheduler: SchedulerSpec = Field(description="Which scheduler runs the jobs.")
    jobs_dir: PathText = Field(description="EVAL_JOBS_DIR: where Harbor writes run dirs (path or fsspec URL).")
    logs_dir: PathText = Field(description="Where job stdout/stderr go (%x_%j.out).")
    job_script: PathText = Field(description="sbatch script (slurm) or program (local); relative to the spec file.")
    username: Short | None = Field(None, description="Rows are written and owned as this user; default: login user. "
                                                     "Under the operator a namespaced EvalCluster may give only its "
                                                     "namespace's name.")
    partition: Short | None = Field(None, description="SLURM partition.")
    account: Short | None = Field(None, description="SLURM account.")
    reservation: Short | None = Field(None, description="SLURM reservation.")
    qos: Short | None = Field(None, description="SLURM QOS.")
    time_limit: str = Field("24:00:00", max_length=32,
                            description=f"Walltime per job ([D-]HH:MM:SS, or minutes), at most {TIME_LIMIT_MAX_DAYS} "
                                        "days.")
    max_time_limit: str | None = Field(None, max_length=32,
                                       description="The longest walltime the partition allows (its MaxTime): a "
                                                   "preset that needs more than timeLimit (swebench_full: 48 h) "
                                                   "gets its own walltime up to this. Default: timeLimit.")
    min_time_limit: str | None = Field(None, max_length=32,
                                       description="The shortest walltime a sized job asks for (EvalRun walltime: "
                                                   "auto): room for the model server to start and a first trial to "
                                                   f"finish. Default: {SHORTEST_SIZED}, or the longest walltime the "
                                                   "cluster allows when that is shorter.")
    gpus_per_job: int = Field(0, ge=0, le=1024, description="--gres gpu:N; 0 omits --gres. Local scheduler: the GPUs "
                                                             "a job is counted in GPU-hours (wall time × N).")
    hardware_profile: Short | None = Field(None, description="Selects per-model registry variants (e.g. a100-64).")
    gpu_memory_util: float = Field(0.85, gt=0, le=1, description="EVAL_GPU_MEMORY_UTIL ceiling.")
    max_concurrent_trials: PositiveInt = Field(48, le=4096,
                                               description="Ceiling for a cell's n_concurrent on this cluster.")
    max_submissions_per_pass: PositiveInt = Field(6, le=1000,
                                                  description="At most this many submit/resume actions per pass.")
    max_live_jobs: PositiveInt = Field(50, le=100_000,
                                       description="A ceiling on our queued + running jobs on this cluster, counted "
                                                   "from the queue every pass (across EvalRuns, processes and the "
                                                   "operator): cells over it wait.")
    env: dict[str, EnvValue] = Field(default_factory=dict, max_length=ENV_ENTRIES_MAX,
                                     description="Extra non-secret environment for every job.")
    secret_env: list[SecretEnv] = Field(default_factory=list, max_length=POOL_MAX,
                                        description="Secret environment, by reference only.")
    mlflow_tracking_uri: MlflowTrackingUri | None = Field(
        None, description="MLflow tracking server of this cluster's EvalRuns that do not name one "
                          "(default $MLFLOW_TRACKING_URI).")
    mlflow_credentials_secret: Name | None = Field(None, description=MLFLOW_CREDENTIALS)
    failure_catalog: list[FailureModeSpec] = Field(
        default_factory=list, max_length=FAILURE_MODES_MAX,
        description="Failures this cluster's logs show, in addition to the shipped catalog (which they precede).")

    @field_validator("time_limit")
    @classmethod
    def _walltime(cls, value: str) -> str:
        return walltime_text(value, "timeLimit")

    @field_validator("max_time_limit")
    @classmethod
    def _max_walltime(cls, value: str | None) -> str | None:
        return value if value is None else walltime_text(value, "maxTimeLimit")

    @field_validator("min_time_limit")
    @classmethod
    def _min_walltime(cls, value: str | None) -> str | None:
        return value if value is None else walltime_text(value, "minTimeLimit")

    @model_validator(mode="after")
    def _min_is_not_longer(self) -> EvalClusterSpec:
        if self.min_time_limit is not None and walltime_seconds(self.min_time_limit) > walltime_seconds(
                self.longest_walltime):
            raise entry_error(("minTimeLimit",), "min_above_max", "minTimeLimit is longer than the longest walltime "
                              "the cluster allows ({longest}); lower it, or raise maxTimeLimit",
                              longest=self.longest_walltime)
        return self

    @model_validator(mode="after")
    def _max_is_not_shorter(self) -> EvalClusterSpec:
        if self.max_time_limit is not None and walltime_seconds(self.max_time_limit) < walltime_seconds(
                self.time_limit):
            raise entry_error(("maxTimeLimit",), "max_below_default", "maxTimeLimit is shorter than timeLimit "
                              "({time_limit}); raise it, or lower timeLimit", time_limit=self.time_limit)
        return self

    @property
    def longest_walltime(self) -> str:
        """The longest time limit a preset may ask for here."""
        return self.max_time_limit or self.time_limit

    @property
    def shortest_sized_walltime(self) -> str:
        """The shortest time limit a sized job asks for here."""
        if self.min_time_limit is not None:
            return self.min_time_limit
        return min(SHORTEST_SIZED, self.longest_walltime, key=walltime_seconds)

    @model_validator(mode="after")
    def _login_node_paths_are_absolute(self) -> EvalClusterSpec:
        """Over ssh these are paths on the login node: relative to this file they would mean nothing there."""
        if not self.scheduler.ssh:
            return self
        for alias, value in (("jobsDir", self.jobs_dir), ("logsDir", self.logs_dir), ("jobScript", self.job_script)):
            if "://" not in value and not value.startswith("/"):
                raise entry_error((alias,), "relative_remote_path",
                                  "{field} '{value}' is a path on the login node (scheduler.ssh): write it absolute, "
                                  "e.g. /home/<user>/evals/{value}", field=alias, value=value)
        return self

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        """Names a job's environment can carry, and none that looks like a secret written inline."""
        for name in value:
            if not ENV_NAME.fullmatch(name) or len(name) > ENV_NAME_MAX:
                raise entry_error((name, "[key]"), "env_name", "this env name is not an environment variable "
                                  f"name: letters, digits and '_' (at most {ENV_NAME_MAX}), not starting with a digit")
            if is_reserved(name):
                raise entry_error((name, "[key]"), "reserved_env", RESERVED_ENV, what="env", name=name)
            if SECRET_LOOKING_ENV.search(name):
                raise entry_error(
                    (name, "[key]"),
                    "inline_secret",
                    "env {name} looks like a secret; remove it from env and add it to secretEnv as "
                    "{name} with a secretRef (name: <secret>, key: <key>)",
                    name=name,
                )
        return value

    @field_validator("env")
    @classmethod
    def _env_fits(cls, value: dict[str, str]) -> dict[str, str]:
        size = sum(len(name.encode()) + len(text.encode()) + 2 for name, text in value.items())
        if size > ENV_TOTAL_MAX:
            raise ValueError(f"env adds {size // 1024} KiB to every job's environment, more than "
                             f"{ENV_TOTAL_MAX // 1024} KiB; pass big values as files instead")
        return value

    @field_validator("secret_env")
    @classmethod
    def _unique_secret_env(cls, value: list[SecretEnv]) -> list[SecretEnv]:
        index = first_duplicate([entry.name for entry in value])
        if index is not None:
            raise entry_error((index, "name"), "duplicate", "secretEnv {name} is listed twice", name=value[index].name)
        index = next((i for i, entry in enumerate(value) if is_reserved(entry.name)), None)
        if index is not None:
            raise entry_error((index, "name"), "reserved_env", RESERVED_ENV, what="secretEnv", name=value[index].name)
        return value


class EvalCluster(SpecModel):
    """A cluster evaluations run on: scheduler, paths, limits and secret references (a namespace's own)."""

    api_version: Literal["evalrun.io/v1alpha1"] = Field(description="evalrun.io/v1alpha1")
    kind: Literal["EvalCluster"] = Field(description="EvalCluster")
    metadata: ObjectMeta
    spec: EvalClusterSpec


class LabelRequirement(SpecModel):
    """One `matchExpressions` entry of a Kubernetes label selector."""

    key: Name = Field(description="The label's key.")
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"] = Field(description="How the key's value is tested.")
    values: list[Name] = Field(default_factory=list, max_length=POOL_MAX,
                               description="In/NotIn: the values (at least one); Exists/DoesNotExist: none.")

    @model_validator(mode="after")
    def _values_fit_operator(self) -> LabelRequirement:
        if (self.operator in ("In", "NotIn")) != bool(self.values):
            raise entry_error(("values",), "selector_values", "{operator} takes {what}",
                              operator=self.operator,
                              what="one value or more" if self.operator in ("In", "NotIn") else "no values")
        return self


class LabelSelector(SpecModel):
    """A Kubernetes label selector: every matchLabels pair and every expression must hold; empty selects all."""

    match_labels: dict[str, str] = Field(default_factory=dict, max_length=ENV_ENTRIES_MAX,
                                         description="Labels the namespace carries with exactly these values.")
    match_expressions: list[LabelRequirement] = Field(default_factory=list, max_length=ENV_ENTRIES_MAX,
                                                      description="Requirements on the namespace's labels.")


class NamespaceGrant(SpecModel):
    """Which namespaces' EvalRuns may use a ClusterEvalCluster: those named, and those the selector matches."""

    names: list[NamespaceName] = Field(default_factory=list, max_length=POOL_MAX,
                                       description="Namespaces granted by name.")
    selector: LabelSelector | None = Field(None, description="Namespaces granted by their labels; `{}` selects "
                                                             "every namespace (the Kubernetes convention).")


class ClusterEvalClusterSpec(EvalClusterSpec):
    """An EvalCluster's spec, plus which namespaces the admin grants it to."""

    allowed_namespaces: NamespaceGrant | None = Field(
        None, description="Namespaces whose EvalRuns may use this cluster (and its Secrets); unset: none.")


class ClusterEvalCluster(SpecModel):
    """A cluster defined by the operator's admin, for EvalRuns of the namespaces it grants (cluster-scoped, like
    cert-manager's ClusterIssuer): it may use the operator's own credentials; its Secrets are the operator's."""

    api_version: Literal["evalrun.io/v1alpha1"] = Field(description="evalrun.io/v1alpha1")
    kind: Literal["ClusterEvalCluster"] = Field(description="ClusterEvalCluster")
    metadata: ObjectMeta
    spec: ClusterEvalClusterSpec

    @model_validator(mode="after")
    def _cluster_scoped(self) -> ClusterEvalCluster:
        if self.metadata.namespace:
            raise entry_error(("metadata", "namespace"), "cluster_scoped",
                              "a ClusterEvalCluster is cluster-scoped: remove metadata.namespace")
        return self


AnyCluster = EvalCluster | ClusterEvalCluster
