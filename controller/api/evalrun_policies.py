"""What an EvalRun asks of each rule: resume, monitor, launch health, upload, budget, sandbox overrides, pinggy
pairs, notifications and the report (the blocks of `EvalRunSpec`, RULES §2–§14)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, Field, field_validator

from controller.api.evalcluster import (
    MLFLOW_CREDENTIALS,
    MlflowTrackingUri,
)
from controller.api.fields import (
    POOL_MAX,
    URL_MAX,
    Minutes,
    Name,
    PositiveInt,
    SecretRef,
    SpecModel,
    entry_error,
    first_duplicate,
    visible,
)


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
    mlflow_experiment: Annotated[str, Field(min_length=1, max_length=250), AfterValidator(visible)] | None = Field(
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
    force_upload: bool = Field(False, description="A human looked at the numbers: upload every run the overlong hold "
                                                  "holds (flagged is_overlong), and, as partial: upload does, every "
                                                  "run the completeness and infra-share checks hold that covers "
                                                  "minCompletedFraction with something scored (flagged partial). A "
                                                  "run short of minCompletedFraction, of another model, with invalid "
                                                  "rewards or without model traffic is never uploaded.")


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

    cpus: PositiveInt | None = Field(None, le=1024, description="Sandbox CPUs (environment.override_cpus).")
    memory_mb: PositiveInt | None = Field(None, le=16 * 1024 * 1024,
                                          description="Sandbox memory, MB (environment.override_memory_mb).")
    storage_mb: PositiveInt | None = Field(None, le=1024 * 1024 * 1024,
                                           description="Sandbox disk, MB (environment.override_storage_mb).")


class PinggyPair(SpecModel):
    """One pinggy tunnel: a public URL and a reference to its token."""

    name: Name = Field(description="Pair name, unique in the pool.")
    url: Annotated[str, Field(max_length=URL_MAX), AfterValidator(visible)] | None = Field(
        None, description="Public tunnel URL (not secret).")
    secret_ref: SecretRef = Field(description="Where the pair's token lives.")


class PinggySpec(SpecModel):
    """Tunnel pool for installed-agent harnesses; one pair serves one running job."""

    pairs: list[PinggyPair] = Field(default_factory=list, max_length=POOL_MAX,
                                    description="Pool; one pair per running installed-agent job.")

    @field_validator("pairs")
    @classmethod
    def _unique_pairs(cls, value: list[PinggyPair]) -> list[PinggyPair]:
        index = first_duplicate([pair.name for pair in value])
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
        index = first_duplicate(list(value))
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
        index = first_duplicate([hook.name for hook in value])
        if index is not None:
            raise entry_error((index, "name"), "duplicate", "webhook {name} is listed twice", name=value[index].name)
        return value


class ReportSpec(SpecModel):
    """How `evalctl report` shows this EvalRun's results."""

    trust_threshold: PositiveInt = Field(150, le=1_000_000, description="Cells with fewer scored trials are shown "
                                                                         "as provisional (RULES §11: n ≥ 150).")
