"""The declared side: `EvalCluster` and `EvalRun` resources (apiVersion evalrun.io/v1alpha1).

camelCase in YAML (Kubernetes convention), snake_case in Python. Unknown fields are errors and
every field carries a description, which becomes `kubectl explain` text in the generated CRDs.
Defaults are the ones REFERENCE.md documents.

Validators that reject one entry of a list or one key of a map raise `PydanticCustomError` with
`ctx["at"]` = the location below the field (an index, a key, `"[key]"` for the key itself), so the
loader can point at that entry instead of at the whole field.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

API_VERSION = "evalrun.io/v1alpha1"

NonNegativeFloat = Annotated[float, Field(ge=0)]
PositiveInt = Annotated[int, Field(gt=0)]
NonEmptyStr = Annotated[str, Field(min_length=1)]
DNS_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
SECRET_LOOKING_ENV = re.compile(r"(TOKEN|SECRET|PASSWORD|PASSWD|API_?KEY|PRIVATE_KEY|CREDENTIAL)", re.IGNORECASE)
WALLTIME = re.compile(r"(\d+-)?\d{1,3}:[0-5]\d:[0-5]\d|\d+")


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
    model_config = ConfigDict(extra="forbid", frozen=True, alias_generator=to_camel, populate_by_name=True)


class SecretRef(SpecModel):
    """Where a secret lives: a Kubernetes Secret, or for the CLI an environment variable named after it."""

    name: NonEmptyStr = Field(
        description="Secret name; the CLI reads env var EVALCTL_SECRET_<NAME>_<KEY> (upper, '-'→'_')."
    )
    key: NonEmptyStr = Field("token", description="Key inside the secret.")


class SecretEnv(SpecModel):
    """One secret environment variable for the job, by reference only."""

    name: NonEmptyStr = Field(description="Environment variable the job receives.")
    secret_ref: SecretRef = Field(description="Where its value comes from; never written inline.")


class ObjectMeta(SpecModel):
    """Kubernetes object metadata; fields the API server adds are accepted and ignored."""

    model_config = ConfigDict(extra="allow", frozen=True, alias_generator=to_camel, populate_by_name=True)

    name: str = Field(description="Resource name (DNS-1123).")
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
    ssh: str | None = Field(None, description="Run scheduler commands on this login host over ssh (slurm only).")
    ssh_config: str | None = Field(None, description="ssh_config file for the ssh host alias (default: ~/.ssh/config)")
    submissions_per_minute: PositiveInt = Field(6, description="Per-cluster submission rate cap.")

    @model_validator(mode="after")
    def _ssh_needs_slurm(self) -> SchedulerSpec:
        if self.ssh and self.type != "slurm":
            raise entry_error(("ssh", "[key]"), "ssh_needs_slurm", "ssh is only supported with type: slurm")
        if self.ssh_config and not self.ssh:
            raise entry_error(("sshConfig", "[key]"), "ssh_config_needs_ssh", "sshConfig is only valid with ssh")
        return self


class EvalClusterSpec(SpecModel):
    """Cluster particulars, written once per cluster and shared by every EvalRun on it."""

    scheduler: SchedulerSpec = Field(description="Which scheduler runs the jobs.")
    jobs_dir: str = Field(description="EVAL_JOBS_DIR: where Harbor writes run dirs (path or fsspec URL).")
    logs_dir: str = Field(description="Where job stdout/stderr go (%x_%j.out).")
    job_script: str = Field(description="sbatch script (slurm) or program (local); relative to the spec file.")
    username: str | None = Field(None, description="Rows are written and owned as this user; default: login user.")
    partition: str | None = Field(None, description="SLURM partition.")
    account: str | None = Field(None, description="SLURM account.")
    reservation: str | None = Field(None, description="SLURM reservation.")
    qos: str | None = Field(None, description="SLURM QOS.")
    time_limit: str = Field("24:00:00", description="Walltime per job ([D-]HH:MM:SS, or minutes).")
    gpus_per_job: int = Field(0, ge=0, description="--gres gpu:N; 0 omits --gres.")
    hardware_profile: str | None = Field(None, description="Selects per-model registry variants (e.g. a100-64).")
    gpu_memory_util: float = Field(0.85, gt=0, le=1, description="EVAL_GPU_MEMORY_UTIL ceiling.")
    max_concurrent_trials: PositiveInt = Field(48, description="Ceiling for a cell's n_concurrent on this cluster.")
    max_submissions_per_pass: PositiveInt = Field(6, description="At most this many submit/resume actions per pass.")
    env: dict[str, str] = Field(default_factory=dict, description="Extra non-secret environment for every job.")
    secret_env: list[SecretEnv] = Field(default_factory=list, description="Secret environment, by reference only.")

    @field_validator("time_limit")
    @classmethod
    def _walltime(cls, value: str) -> str:
        if not WALLTIME.fullmatch(value):
            raise ValueError(f'timeLimit {value!r} must look like HH:MM:SS, D-HH:MM:SS or minutes, e.g. "24:00:00"')
        return value

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
    def _no_inline_secrets(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            if SECRET_LOOKING_ENV.search(name):
                raise entry_error(
                    (name, "[key]"),
                    "inline_secret",
                    "env {name} looks like a secret; remove it from env and add it to secretEnv as "
                    "{name} with a secretRef (name: <secret>, key: <key>)",
                    name=name,
                )
        return value

    @field_validator("secret_env")
    @classmethod
    def _unique_secret_env(cls, value: list[SecretEnv]) -> list[SecretEnv]:
        index = _first_duplicate([entry.name for entry in value])
        if index is not None:
            raise entry_error((index, "name"), "duplicate", "secretEnv {name} is listed twice", name=value[index].name)
        return value


class EvalCluster(SpecModel):
    """A cluster evaluations run on: scheduler, paths, limits and secret references."""

    api_version: Literal["evalrun.io/v1alpha1"] = Field(description="evalrun.io/v1alpha1")
    kind: Literal["EvalCluster"] = Field(description="EvalCluster")
    metadata: ObjectMeta
    spec: EvalClusterSpec


# --------------------------------------------------------------------------- EvalRun


class ResumePolicy(SpecModel):
    """When a finished or killed run dir is resumed (REFERENCE §4)."""

    max_total_fires: PositiveInt = Field(2, description="Jobs per run dir: the original plus resumes.")
    infra_error_threshold: int = Field(
        10, ge=-1, description="More infra errors than this make a finished dir worth resuming (-1: always)."
    )


class MonitorPolicy(SpecModel):
    """When a running job is judged stuck (REFERENCE §5)."""

    near_complete_fraction: float = Field(0.97, gt=0, le=1, description="Scored/total that counts as near complete.")
    stale_near_minutes: NonNegativeFloat = Field(60, description="No new score for this long near complete → cancel.")
    stale_general_minutes: NonNegativeFloat = Field(90, description="No new score for this long → Stalled.")
    pre_walltime_minutes: NonNegativeFloat = Field(15, description="Cancel when this little walltime is left.")
    settle_minutes: NonNegativeFloat = Field(
        60, description="A killed job's sandboxes may keep writing this long; wait until the dir is quiet."
    )


class UploadPolicy(SpecModel):
    """Where results go once a cell is evaluated."""

    db: bool = Field(True, description="Write metrics to the results store.")
    mlflow: bool = Field(False, description="Log metrics to MLflow and verify them.")
    min_completed_fraction: float = Field(0.5, ge=0, le=1, description="Upload only with this share of trials done.")


class SandboxOverrides(SpecModel):
    """Sandbox size overrides (Harbor `environment.override_*`); they change results, so they are fingerprinted."""

    cpus: PositiveInt | None = Field(None, description="environment.override_cpus")
    memory_mb: PositiveInt | None = Field(None, description="environment.override_memory_mb")
    storage_mb: PositiveInt | None = Field(None, description="environment.override_storage_mb")


class PinggyPair(SpecModel):
    """One pinggy tunnel: a public URL and a reference to its token."""

    name: NonEmptyStr = Field(description="Pair name, unique in the pool.")
    url: str | None = Field(None, description="Public tunnel URL (not secret).")
    secret_ref: SecretRef = Field(description="Where the pair's token lives.")


class PinggySpec(SpecModel):
    """Tunnel pool for installed-agent harnesses; one pair serves one running job."""

    pairs: list[PinggyPair] = Field(default_factory=list, description="Pool; one pair per running installed-agent job.")

    @field_validator("pairs")
    @classmethod
    def _unique_pairs(cls, value: list[PinggyPair]) -> list[PinggyPair]:
        index = _first_duplicate([pair.name for pair in value])
        if index is not None:
            raise entry_error(
                (index, "name"), "duplicate", "pinggy pair {name} is listed twice", name=value[index].name
            )
        return value


class EvalRunSpec(SpecModel):
    """What must be evaluated: models × benchmarks on one cluster, and how the reconciler treats the jobs."""

    cluster: NonEmptyStr = Field(description="Name of an EvalCluster.")
    models: list[NonEmptyStr] = Field(min_length=1, description="HF model names, e.g. laion/Qwen3-8B-sft-v3.")
    presets: list[NonEmptyStr] | None = Field(
        None, description="Benchmark presets (tb2, v2, swebench, …; 'id' = all three)."
    )
    datasets: list[NonEmptyStr] | None = Field(None, description="Explicit datasets instead of presets.")
    agent: NonEmptyStr = Field("terminus-2", description="Harbor agent.")
    harbor_config: str | None = Field(None, description="Explicit Harbor config; overrides registry and size rule.")
    timeout_multiplier: float | None = Field(
        None, gt=0, description="Explicit timeout multiplier; overrides registry and size rule."
    )
    overrides: SandboxOverrides = Field(default_factory=SandboxOverrides, description="Sandbox size overrides.")
    n_attempts: PositiveInt = Field(
        3, description="Harbor attempts per task (-k); REFERENCE totals (tb2 267 = 89 tasks × 3) assume 3."
    )
    agent_kwargs: list[str] = Field(default_factory=list, description="Extra --agent-kwarg values (override registry).")
    force_eval: bool = Field(False, description="Ignore rows this EvalRun did not create; adds new rows.")
    suspend: bool = Field(False, description="Plan but do not act.")
    stale_started_hours: NonNegativeFloat = Field(24, description="Started rows older than this are stale.")
    stale_pending_hours: NonNegativeFloat = Field(6, description="Pending rows older than this are stale.")
    resume: ResumePolicy = Field(default_factory=ResumePolicy, description="When a run dir is resumed.")
    monitor: MonitorPolicy = Field(default_factory=MonitorPolicy, description="When a running job is judged stuck.")
    upload: UploadPolicy = Field(default_factory=UploadPolicy, description="Where results go.")
    pinggy: PinggySpec = Field(default_factory=PinggySpec, description="Tunnel pairs for installed-agent harnesses.")

    @model_validator(mode="after")
    def _benchmarks_one_way(self) -> EvalRunSpec:
        if self.presets is not None and self.datasets is not None:
            raise entry_error(("datasets", "[key]"), "presets_and_datasets", "set presets OR datasets, not both")
        if not self.presets and not self.datasets:
            raise entry_error(
                (), "no_benchmarks", "set presets (e.g. [tb2, v2]) or datasets (e.g. [DCAgent2/terminal_bench_2])"
            )
        return self

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
