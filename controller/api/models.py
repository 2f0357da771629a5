"""The declared side: `EvalCluster` and `EvalRun` resources (apiVersion evalrun.io/v1alpha1).

camelCase in YAML (Kubernetes convention), snake_case in Python. Unknown fields are errors and
every field carries a description, which becomes `kubectl explain` text in the generated CRDs.
Defaults are the ones docs/RULES.md documents.

Validators that reject one entry of a list or one key of a map raise `PydanticCustomError` with
`ctx["at"]` = the location below the field (an index, a key, `"[key]"` for the key itself), so the
loader can point at that entry instead of at the whole field.

Every number and string is bounded, so a typo or a hostile value is refused by `validate` with its
position instead of failing later in timedelta, the kernel (argv/environment size) or the file system.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

from controller.core import patterns
from controller.core.job_env import is_reserved
from controller.core.types import FailureMode, FailureStage, RemedyKind, walltime_seconds

API_VERSION = "evalrun.io/v1alpha1"

HOURS_MAX = 8_760  # a year: any staleness threshold beyond it is a typo
MINUTES_MAX = 525_600  # a year, in minutes
TIME_LIMIT_MAX_DAYS = 365
NAME_MAX = 253  # DNS-1123 subdomain, the longest Kubernetes name
SHORT_MAX = 64  # agents, presets, SLURM partition/account/QOS names, usernames
PATH_MAX = 4_096  # Linux PATH_MAX
URL_MAX = 2_048
# Model and dataset reach argv, the environment, the results DB and (slugged, cut to 64) the run tag.
MODEL_MAX = 200  # Hugging Face repo ids have at most 96 characters; local checkpoint paths a few more
DATASET_MAX = 256
# Jobs get the cluster's env and EVAL_AGENT_KWARGS (JSON) in their environment: Linux refuses one string
# over 128 KiB (MAX_ARG_STRLEN) and argv + environment over 2 MiB, and the job inherits ours on top.
ENV_NAME_MAX = 128
ENV_VALUE_MAX = 32 * 1024
ENV_TOTAL_MAX = 256 * 1024
ENV_ENTRIES_MAX = 256
AGENT_KWARGS_MAX = 64
AGENT_KWARGS_BYTES = 32 * 1024
MODELS_MAX = 1_000
DATASETS_MAX = 1_000
PRESETS_MAX = 32
POOL_MAX = 1_000  # pinggy pairs, secretEnv entries
INVISIBLE = {"Cc", "Cf", "Cs", "Zl", "Zp"}  # control, format (zero-width, bidi), surrogate, line/paragraph breaks

DNS_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
SECRET_LOOKING_ENV = re.compile(r"(TOKEN|SECRET|PASSWORD|PASSWD|API_?KEY|PRIVATE_KEY|CREDENTIAL)", re.IGNORECASE)
WALLTIME = re.compile(r"(\d+-)?\d{1,3}:[0-5]\d:[0-5]\d|\d+")
SSH_HOST = re.compile(r"[^\s-]\S*")  # never a leading '-': the host is in ssh's argv, where it would be an option


def walltime_text(value: str, name: str) -> str:
    """SLURM walltime syntax, at most TIME_LIMIT_MAX_DAYS days."""
    if not WALLTIME.fullmatch(value):
        raise ValueError(f'{name} {value!r} must look like HH:MM:SS, D-HH:MM:SS or minutes, e.g. "24:00:00"')
    if walltime_seconds(value) > TIME_LIMIT_MAX_DAYS * 86_400:
        raise ValueError(f"{name} is longer than {TIME_LIMIT_MAX_DAYS} days; write a real walltime, e.g. \"24:00:00\"")
    return value


def _visible(value: str) -> str:
    """Names reach argv, file names, the environment and the store: an invisible character breaks or spoofs them."""
    bad = next((char for char in value if unicodedata.category(char) in INVISIBLE), None)
    if bad is not None:
        raise ValueError(f"holds the control or invisible character U+{ord(bad):04X}; remove it")
    return value


def _env_name(value: str) -> str:
    """A name the job's environment can carry and a shell can read: no '=', no NUL, no spaces."""
    if not ENV_NAME.fullmatch(value):
        raise ValueError("must be an environment variable name: letters, digits and '_', not starting with a digit")
    return value


def _ssh_host(value: str) -> str:
    """A login host as ssh takes it, never something ssh would read as an option."""
    if not SSH_HOST.fullmatch(value):
        raise ValueError("must be host, user@host or user@host:port, without spaces and not starting with '-' "
                         "(ssh would read it as an option)")
    return value


def _env_value(value: str) -> str:
    """An environment string cannot hold NUL, nor a lone surrogate (it cannot be encoded)."""
    if "\0" in value or any(unicodedata.category(char) == "Cs" for char in value):
        raise ValueError("holds a NUL or an unpaired surrogate character, which an environment variable cannot carry")
    return value


ARGUMENT_UNSAFE = re.compile(r"^-|[\s'\"`;$]")
ARGUMENT_SAFE_PATTERN = r"^[^\s'\"`;$-][^\s'\"`;$]*$"  # the same rule for the CRD schema


def _argument_safe(value: str) -> str:
    """Model and dataset reach the job script's argv: never an option, nothing a shell would act on."""
    if ARGUMENT_UNSAFE.search(value):
        raise ValueError("must not start with '-' nor hold whitespace, quotes, ';', '$' or backticks: it is an "
                         "argument of the job script")
    return value


def _dataset_name(value: str) -> str:
    """Its last '/' segment is the benchmark's name in the results DB and in the run tag: it must exist."""
    if not value.strip("/"):
        raise ValueError("names no dataset: its last '/' segment is the benchmark name; write e.g. Org/bench_name")
    return value


Hours = Annotated[float, Field(ge=0, le=HOURS_MAX)]
Minutes = Annotated[float, Field(ge=0, le=MINUTES_MAX)]
PositiveInt = Annotated[int, Field(gt=0)]
Name = Annotated[str, Field(min_length=1, max_length=NAME_MAX), AfterValidator(_visible)]
Short = Annotated[str, Field(min_length=1, max_length=SHORT_MAX), AfterValidator(_visible)]
PathText = Annotated[str, Field(min_length=1, max_length=PATH_MAX), AfterValidator(_visible)]
NamespaceName = Annotated[str, Field(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")]
EnvName = Annotated[str, Field(min_length=1, max_length=ENV_NAME_MAX), AfterValidator(_env_name)]
EnvValue = Annotated[str, Field(max_length=ENV_VALUE_MAX), AfterValidator(_env_value)]
Walltime = Annotated[str, Field(max_length=32), AfterValidator(lambda value: walltime_text(value, "walltime"))]
# The CRD's schema refuses what _argument_safe refuses (the API server never stores it); here the loader says why.
SAFE_SCHEMA = {"pattern": ARGUMENT_SAFE_PATTERN}
Model = Annotated[str, Field(min_length=1, max_length=MODEL_MAX, json_schema_extra=SAFE_SCHEMA),
                  AfterValidator(_visible), AfterValidator(_argument_safe)]
Dataset = Annotated[str, Field(min_length=1, max_length=DATASET_MAX, json_schema_extra=SAFE_SCHEMA),
                    AfterValidator(_visible), AfterValidator(_argument_safe), AfterValidator(_dataset_name)]


RESERVED_ENV = ("{what} {name} is a name the reconciler or the scheduler sets for every job (the EVAL_* contract "
                "of RULES §7, SLURM_*), and would be overridden; remove it, or name your variable differently")


def entry_error(at: tuple[str | int, ...], kind: str, message: str, **ctx: Any) -> PydanticCustomError:
    """A validation error that points at `at` below the validated field (see module docstring)."""
    return PydanticCustomError(kind, message, {"at": at, **ctx})


def _first_duplicate(values: list[str]) -> int | None:
    seen: set[str] = set()
    for index, value in enumerate(values):
        if value in seen:
            return index
        seen.add(value)
    return None


class SpecModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, alias_generator=to_camel, populate_by_name=True,
                              allow_inf_nan=False)


class SecretRef(SpecModel):
    """Where a secret lives: a Kubernetes Secret, or for the CLI an environment variable named after it."""

    name: Name = Field(
        description="Secret name; the CLI reads env var EVALCTL_SECRET_<NAME>_<KEY> (upper, '-'→'_')."
    )
    key: Name = Field("token", description="Key inside the secret.")


class SecretEnv(SpecModel):
    """One secret environment variable for the job, by reference only."""

    name: EnvName = Field(description="Environment variable the job receives.")
    secret_ref: SecretRef = Field(description="Where its value comes from; never written inline.")


class ObjectMeta(SpecModel):
    """Kubernetes object metadata; fields the API server adds are accepted and ignored."""

    model_config = ConfigDict(extra="allow", frozen=True, alias_generator=to_camel, populate_by_name=True)

    name: str = Field(max_length=NAME_MAX, description="Resource name (DNS-1123).")
    namespace: str | None = Field(None, description="Kubernetes namespace (operator only).")
    generation: int | None = Field(None, description="Set by the API server.")
    labels: dict[str, str] = Field(default_factory=dict, description="Kubernetes labels.")
    annotations: dict[str, str] = Field(default_factory=dict, description="e.g. evalrun.io/requestedAt")

    @field_validator("name")
    @classmethod
    def _dns_name(cls, value: str) -> str:
        if not DNS_NAME.match(value) or len(value) > 253:
            raise ValueError(f"name {value!r} must be lowercase letters, digits, '-' or '.' (DNS-1123)")
        return value


# --------------------------------------------------------------------------- EvalCluster


class SchedulerSpec(SpecModel):
    """Which scheduler runs the jobs, and where its commands run."""

    type: Literal["local", "slurm"] = Field(description="local: detached subprocesses on this host; slurm: sbatch.")
    ssh: Annotated[str, Field(max_length=255), AfterValidator(_visible), AfterValidator(_ssh_host)] | None = Field(
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
    submissions_per_minute: PositiveInt = Field(6, le=600, description="Per-cluster submission rate cap.")
    python: PathText = Field("python3", description="The login node's Python (3.9 or later) that runs the run-dir "
                                                    "probe (ssh only): a name on its PATH or an absolute path.")

    @model_validator(mode="after")
    def _ssh_needs_slurm(self) -> SchedulerSpec:
        if self.ssh and self.type != "slurm":
            raise entry_error(("ssh", "[key]"), "ssh_needs_slurm", "ssh is only supported with type: slurm")
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
    username: Short | None = Field(None, description="Rows are written and owned as this user; default: login user.")
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
        index = _first_duplicate([entry.name for entry in value])
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


# --------------------------------------------------------------------------- EvalRun


class ResumePolicy(SpecModel):
    """When a finished or killed run dir is resumed (RULES §4)."""

    max_total_fires: PositiveInt = Field(2, le=100, description="Jobs per run dir: the original plus resumes.")
    infra_error_threshold: int = Field(
        10, ge=-1, le=1_000_000,
        description="More infra errors than this make a finished dir worth resuming (-1: always)."
    )


class MonitorPolicy(SpecModel):
    """When a running job is judged stuck (RULES §5)."""

    near_complete_fraction: float = Field(0.97, gt=0, le=1, description="Scored/total that counts as near complete.")
    stale_near_minutes: Minutes = Field(60, description="No new score for this long near complete → cancel.")
    stale_general_minutes: Minutes = Field(90, description="No new score for this long → Stalled.")
    pre_walltime_minutes: Minutes = Field(15, description="Cancel when this little walltime is left.")
    settle_minutes: Minutes = Field(
        60, description="A killed job's sandboxes may keep writing this long; wait until the dir is quiet."
    )
    zombie_grace_minutes: Minutes = Field(
        10, description="Every trial has a result but the job still runs this long after the last one → cancel."
    )


class HealthPolicy(SpecModel):
    """Launch health (RULES §8): what an operator checks after every launch, and the remedies' bounds."""

    instant_fail_seconds: float = Field(
        10, ge=0, le=3600, description="A trial that raised with no output token and less agent time than this is "
                                       "an instant failure: infra (the model was unreachable), never a score.")
    dead_launch_trials: PositiveInt = Field(
        10, le=100_000, description="A running job with this many completed trials, all instant failures, is a "
                                    "dead launch: cancelled at once.")
    launch_grace_minutes: Minutes = Field(
        30, description="A job running this long with no trial started (no result, no agent/ content) is a stalled "
                        "launch: cancelled and refired.")
    no_traffic_minutes: Minutes = Field(
        15, description="No chat completion request this long after vLLM was ready, with trials pending → Stalled.")
    bad_request_fraction: float = Field(
        0.15, ge=0, le=1, description="A 400 share above this (over 50 requests or more) → Stalled: context "
                                      "overflow?")
    max_refires: int = Field(2, ge=0, le=100, description="Refires per cell (new attempts after a diagnosed "
                                                           "failure); then the cell is held with the diagnosis.")
    refire_backoff_minutes: Minutes = Field(5, description="Wait this long after a failed attempt before its refire.")
    bad_node_hours: float = Field(24, gt=0, le=24 * 30, description="A node a refire-elsewhere failure blames is "
                                                                    "excluded from the cluster's submissions this long.")
    max_quarantined_nodes: int = Field(
        8, ge=0, le=10_000, description="At most this many nodes of a cluster are quarantined at once (and never "
                                        "its last usable one); past it a refire goes elsewhere without excluding.")


class UploadPolicy(SpecModel):
    """Where results go once a cell is evaluated."""

    db: bool = Field(True, description="Write metrics to the results store.")
    mlflow: bool = Field(False, description="Log metrics to MLflow and verify them: a cell is Completed only once "
                                            "its MLflow run reads back what was logged.")
    mlflow_tracking_uri: MlflowTrackingUri | None = Field(
        None, description="MLflow tracking server (default: the EvalCluster's, else $MLFLOW_TRACKING_URI). "
                          "Credentials never go here: see mlflowCredentialsSecret.")
    mlflow_credentials_secret: Name | None = Field(
        None, description=f"{MLFLOW_CREDENTIALS} Default: the EvalCluster's, else MLFLOW_TRACKING_USERNAME / "
                          "MLFLOW_TRACKING_PASSWORD / MLFLOW_TRACKING_TOKEN of the controller's environment.")
    mlflow_experiment: Annotated[str, Field(min_length=1, max_length=250), AfterValidator(_visible)] | None = Field(
        None, description="MLflow experiment (default: the EvalRun's name).")
    min_completed_fraction: float = Field(0.5, ge=0, le=1, description="A partial upload (see partial) covers at "
                                                                        "least this share of the expected trials.")
    max_infra_error_fraction: float = Field(
        0.1, ge=0, le=1, description="A run whose infra trials (exceptions not the model's, ungraded trials, trials "
                                     "without model output) exceed this share of its trials is resumed, then held "
                                     "(or uploaded flagged partial, see partial): never a plain score.")
    partial: Literal["hold", "upload"] = Field(
        "hold", description="A run that resumes cannot complete (too few trials, too many infra): hold it for a human, "
                            "or upload it with partial true on its row, in status, MLflow and the report.")
    overlong_hours: float | None = Field(
        None, gt=0, le=10_000, description="A run that took longer than this many hours, start to last result across "
                                           "its resumes, is overlong (is_overlong; see overlong). Default: longer "
                                           "than one job of the cell may run (the preset's walltime, else the "
                                           "cluster's timeLimit), i.e. a run the wall cut short.")
    overlong: Literal["upload", "hold"] = Field(
        "upload", description="An overlong run: upload it with is_overlong true on its row, or hold it until "
                              "forceUpload.")
    force_upload: bool = Field(False, description="Upload what the overlong hold and the completeness and infra-share "
                                                  "checks hold, flagged partial (a human looked at the numbers); a "
                                                  "run of another model, with invalid rewards or without model "
                                                  "traffic is never uploaded.")


GPU_HOURS_MAX = 10_000_000  # beyond any lab's yearly allocation: a bigger number is a typo


class BudgetPolicy(SpecModel):
    """What the EvalRun may spend."""

    max_gpu_hours: float | None = Field(
        None, gt=0, le=GPU_HOURS_MAX,
        description="GPU-hours the EvalRun may use: a launch that would take its spent + estimated hours past this "
                    "is held, with the numbers in its reason (an estimate that is unknown counts 0, and says so); "
                    "none: no budget.")


class SandboxOverrides(SpecModel):
    """Sandbox size overrides (Harbor `environment.override_*`); they change results, so they are fingerprinted."""

    cpus: PositiveInt | None = Field(None, le=1024, description="environment.override_cpus")
    memory_mb: PositiveInt | None = Field(None, le=16 * 1024 * 1024, description="environment.override_memory_mb")
    storage_mb: PositiveInt | None = Field(None, le=1024 * 1024 * 1024, description="environment.override_storage_mb")


class PinggyPair(SpecModel):
    """One pinggy tunnel: a public URL and a reference to its token."""

    name: Name = Field(description="Pair name, unique in the pool.")
    url: Annotated[str, Field(max_length=URL_MAX), AfterValidator(_visible)] | None = Field(
        None, description="Public tunnel URL (not secret).")
    secret_ref: SecretRef = Field(description="Where the pair's token lives.")


class PinggySpec(SpecModel):
    """Tunnel pool for installed-agent harnesses; one pair serves one running job."""

    pairs: list[PinggyPair] = Field(default_factory=list, max_length=POOL_MAX,
                                    description="Pool; one pair per running installed-agent job.")

    @field_validator("pairs")
    @classmethod
    def _unique_pairs(cls, value: list[PinggyPair]) -> list[PinggyPair]:
        index = _first_duplicate([pair.name for pair in value])
        if index is not None:
            raise entry_error(
                (index, "name"), "duplicate", "pinggy pair {name} is listed twice", name=value[index].name
            )
        return value


NotifyEventName = Literal["Stalled", "Failed", "Completed", "Ready"]
DEFAULT_NOTIFY_EVENTS: tuple[NotifyEventName, ...] = ("Stalled", "Failed", "Ready")
WEBHOOKS_MAX = 16


class Webhook(SpecModel):
    """One webhook that gets a Slack-compatible JSON message (`text`, `blocks`) per transition."""

    name: Name = Field(description="Names it in status, logs and the store (its URL never appears anywhere).")
    secret_ref: SecretRef = Field(description="Where its URL lives (a Slack incoming-webhook URL is its credential); "
                                              "CLI: EVALCTL_SECRET_<NAME>_<KEY>.")
    events: list[NotifyEventName] = Field(
        default_factory=lambda: list(DEFAULT_NOTIFY_EVENTS), min_length=1, max_length=4,
        description="Which transitions it is told of: Stalled (the EvalRun's Stalled condition became True), Failed "
                    "(a cell is held for a human), Completed (a cell's result is uploaded), Ready (every cell "
                    "Completed). Default: Stalled, Failed, Ready.")

    @field_validator("events")
    @classmethod
    def _unique_events(cls, value: list[NotifyEventName]) -> list[NotifyEventName]:
        index = _first_duplicate(list(value))
        if index is not None:
            raise entry_error((index,), "duplicate", "event {event} is listed twice", event=value[index])
        return value


class NotifySpec(SpecModel):
    """Who is told when the EvalRun's cells fail or complete: one message per transition, retried with back-off."""

    webhooks: list[Webhook] = Field(default_factory=list, max_length=WEBHOOKS_MAX, description="Webhooks to post to.")
    max_attempts: PositiveInt = Field(8, le=100, description="Tries per message (back-off doubling from 5 s, at most "
                                                             "10 min apart); then it is given up, with a warning "
                                                             "and a status note.")

    @field_validator("webhooks")
    @classmethod
    def _unique_webhooks(cls, value: list[Webhook]) -> list[Webhook]:
        index = _first_duplicate([hook.name for hook in value])
        if index is not None:
            raise entry_error((index, "name"), "duplicate", "webhook {name} is listed twice", name=value[index].name)
        return value


class ClusterReference(SpecModel):
    """The cluster an EvalRun runs on: an admin's ClusterEvalCluster, or an EvalCluster of its own namespace."""

    kind: Literal["EvalCluster", "ClusterEvalCluster"] = Field(description="EvalCluster (the EvalRun's namespace) "
                                                                           "or ClusterEvalCluster (cluster-scoped).")
    name: Name = Field(description="Its name.")


DURATION = re.compile(r"(\d+(?:\.\d+)?)([hdw])")
DURATION_UNITS = {"h": 1, "d": 24, "w": 24 * 7}  # hours
PATTERNS_MAX = 100
SELECTOR_LIMIT_MAX = 1_000


def _duration(value: str) -> str:
    match = DURATION.fullmatch(value.strip())
    if match is None or not 0 < float(match[1]) * DURATION_UNITS[match[2]] <= HOURS_MAX:
        raise ValueError(f"{value!r} is not a duration up to a year: write a number and h, d or w, e.g. 14d")
    return value.strip()


def duration_hours(value: str) -> float:
    match = DURATION.fullmatch(value)
    assert match is not None  # _duration
    return float(match[1]) * DURATION_UNITS[match[2]]


Glob = Annotated[str, Field(min_length=1, max_length=MODEL_MAX), AfterValidator(_visible)]


class SizeBand(SpecModel):
    """Billions of parameters, read from the model name as the size policy reads it (`Qwen3-30B-A3B` → 30)."""

    min_b: float = Field(0, ge=0, le=100_000, description="Smallest size, in billions (inclusive).")
    max_b: float = Field(100_000, gt=0, le=100_000, description="Largest size, in billions (inclusive).")

    @model_validator(mode="after")
    def _ordered(self) -> SizeBand:
        if self.min_b > self.max_b:
            raise entry_error(("maxB",), "band_order", f"maxB {self.max_b:g} is below minB {self.min_b:g}: swap them")
        return self


class ModelSelector(SpecModel):
    """Models chosen from the results DB's `models` table each pass, newest first (`query_unevaled_models.py`
    as a rule). Sticky: a model once selected stays a cell of this EvalRun, whatever the DB says later."""

    name_patterns: list[Glob] = Field(default_factory=lambda: ["*"], min_length=1, max_length=PATTERNS_MAX,
                                      description="Shell globs a model name must match one of, e.g. laion/*-8B*.")
    size_band: SizeBand | None = Field(None, description="Only models whose name gives a size in this band.")
    created_within: Annotated[str, Field(max_length=16), AfterValidator(_duration)] | None = Field(
        None, description="Only models registered this recently (models.creation_time), e.g. 14d, 36h, 2w.")
    unevaluated: bool = Field(True, description="Only models with a cell that has no Finished row with metrics in "
                                                "its benchmark's family for the cell's config, whoever wrote it.")
    exclude: list[Glob] = Field(default_factory=list, max_length=PATTERNS_MAX,
                                description="Globs of models never to select.")
    limit: PositiveInt = Field(le=SELECTOR_LIMIT_MAX, description="How many models this EvalRun selects in all "
                                                                  "(raise it to take more).")


class ReportSpec(SpecModel):
    """How `evalctl report` shows this EvalRun's results."""

    trust_threshold: PositiveInt = Field(150, le=1_000_000, description="Cells with fewer scored trials are shown "
                                                                         "as provisional (RULES §11: n ≥ 150).")


DeletionPolicy = Literal["Orphan", "Cancel"]
CANCEL_ON_DELETE: DeletionPolicy = "Cancel"


def asks_to_cancel(raw: Mapping[str, Any]) -> bool:
    """Whether an EvalRun object as the API holds it (perhaps one that does not load) says deletionPolicy Cancel."""
    spec = raw.get("spec")
    return isinstance(spec, Mapping) and spec.get(EvalRunSpec.model_fields["deletion_policy"].alias
                                                   or "deletion_policy") == CANCEL_ON_DELETE


class EvalRunSpec(SpecModel):
    """What must be evaluated: models × benchmarks on one cluster, and how the reconciler treats the jobs."""

    cluster: Name | None = Field(None, description="Name of an EvalCluster in the EvalRun's namespace (or clusterRef).")
    cluster_ref: ClusterReference | None = Field(None, description="The cluster, by kind and name (or cluster).")
    models: list[Model] = Field(default_factory=list, max_length=MODELS_MAX,
                                description="HF model names, e.g. laion/Qwen3-8B-sft-v3; the priority list when "
                                            "modelSelector adds more.")
    model_selector: ModelSelector | None = Field(None, description="Models chosen from the results DB (after the "
                                                                   "listed ones).")
    presets: list[Short] | None = Field(
        None, max_length=PRESETS_MAX, description="Benchmark presets (tb2, v2, swebench, …; 'id' = all three)."
    )
    datasets: list[Dataset] | None = Field(None, max_length=DATASETS_MAX,
                                           description="Explicit datasets instead of presets.")
    agent: Short = Field("terminus-2", description="Harbor agent.")
    harbor_config: PathText | None = Field(None,
                                           description="Explicit Harbor config; overrides registry and size rule.")
    timeout_multiplier: float | None = Field(
        None, gt=0, le=100, description="Explicit timeout multiplier; overrides registry and size rule."
    )
    overrides: SandboxOverrides = Field(default_factory=SandboxOverrides, description="Sandbox size overrides.")
    n_attempts: PositiveInt = Field(
        3, le=100, description="Harbor attempts per task (-k); RULES §6 totals (tb2 267 = 89 tasks × 3) assume 3."
    )
    agent_kwargs: list[str] = Field(default_factory=list, max_length=AGENT_KWARGS_MAX,
                                    description="Extra --agent-kwarg values (override registry).")
    force_eval: bool = Field(False, description="Ignore rows this EvalRun did not create; adds new rows.")
    suspend: bool = Field(False, description="Plan but do not act.")
    deletion_policy: DeletionPolicy = Field(
        "Orphan", description="When the EvalRun is deleted (operator): Orphan leaves its queued and running jobs "
                              "alone; Cancel cancels them before the object goes.")
    stale_started_hours: Hours = Field(24, description="Started rows older than this are stale.")
    stale_pending_hours: Hours = Field(6, description="Pending rows older than this are stale.")
    resume: ResumePolicy = Field(default_factory=ResumePolicy, description="When a run dir is resumed.")
    monitor: MonitorPolicy = Field(default_factory=MonitorPolicy, description="When a running job is judged stuck.")
    health: HealthPolicy = Field(default_factory=HealthPolicy, description="Launch health: dead launches, stalled "
                                                                           "launches, traffic, refires.")
    upload: UploadPolicy = Field(default_factory=UploadPolicy, description="Where results go.")
    pinggy: PinggySpec = Field(default_factory=PinggySpec, description="Tunnel pairs for installed-agent harnesses.")
    budget: BudgetPolicy = Field(default_factory=BudgetPolicy, description="What the EvalRun may spend (GPU-hours).")
    report: ReportSpec = Field(default_factory=ReportSpec, description="How `evalctl report` shows the results.")
    notify: NotifySpec = Field(default_factory=NotifySpec, description="Webhooks told of transitions (Stalled, "
                                                                       "Failed, Completed, Ready).")

    @model_validator(mode="after")
    def _one_cluster(self) -> EvalRunSpec:
        if (self.cluster is None) == (self.cluster_ref is None):
            raise entry_error(("cluster",) if self.cluster else (), "one_cluster",
                              "name the cluster once: cluster: NAME (an EvalCluster of this namespace) or clusterRef: "
                              "{kind: ClusterEvalCluster, name: NAME}")
        return self

    @property
    def cluster_kind(self) -> Literal["EvalCluster", "ClusterEvalCluster"]:
        return self.cluster_ref.kind if self.cluster_ref is not None else "EvalCluster"

    @property
    def cluster_name(self) -> str:
        name = self.cluster_ref.name if self.cluster_ref is not None else self.cluster
        assert name is not None  # _one_cluster
        return name

    @model_validator(mode="after")
    def _some_models(self) -> EvalRunSpec:
        if not self.models and self.model_selector is None:
            raise entry_error(("models",), "no_models", "list models (e.g. [laion/Qwen3-8B-sft]) or set modelSelector "
                                               "(e.g. {namePatterns: ['laion/*'], limit: 10})")
        return self

    @model_validator(mode="after")
    def _benchmarks_one_way(self) -> EvalRunSpec:
        if self.presets is not None and self.datasets is not None:
            raise entry_error(("datasets", "[key]"), "presets_and_datasets", "set presets OR datasets, not both")
        if not self.presets and not self.datasets:
            raise entry_error(
                (), "no_benchmarks", "set presets (e.g. [tb2, v2]) or datasets (e.g. [DCAgent2/terminal_bench_2])"
            )
        return self

    @field_validator("agent_kwargs")
    @classmethod
    def _kwargs_fit(cls, value: list[str]) -> list[str]:
        """They reach the job as one environment variable, EVAL_AGENT_KWARGS: bound it as encoded."""
        size = len(json.dumps(value))
        if size > AGENT_KWARGS_BYTES:
            raise ValueError(f"agentKwargs take {size // 1024} KiB as the job's EVAL_AGENT_KWARGS, more than "
                             f"{AGENT_KWARGS_BYTES // 1024} KiB; pass big values as a file the agent reads")
        return value

    @field_validator("models", "datasets")
    @classmethod
    def _unique(cls, value: list[str] | None) -> list[str] | None:
        index = _first_duplicate(value or [])
        if index is not None and value is not None:
            raise entry_error((index,), "duplicate", "'{value}' is listed twice", value=value[index])
        return value


class EvalRun(SpecModel):
    """An evaluation campaign the reconciler keeps converged: one cell per (model, benchmark)."""

    api_version: Literal["evalrun.io/v1alpha1"] = Field(description="evalrun.io/v1alpha1")
    kind: Literal["EvalRun"] = Field(description="EvalRun")
    metadata: ObjectMeta
    spec: EvalRunSpec
