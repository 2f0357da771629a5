"""`EvalRun`: what must be evaluated — models × benchmarks on one cluster or several — and how the reconciler
treats its jobs (apiVersion evalrun.io/v1alpha1)."""

from __future__ import annotations

import fnmatch
import json
import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, Field, WithJsonSchema, field_validator, model_validator

from controller.api.evalcluster import (
    MLFLOW_CREDENTIALS,
    MlflowTrackingUri,
)
from controller.api.fields import (
    AGENT_KWARGS_BYTES,
    AGENT_KWARGS_MAX,
    DATASETS_MAX,
    HOURS_MAX,
    MODEL_MAX,
    MODELS_MAX,
    POOL_MAX,
    PRESETS_MAX,
    URL_MAX,
    Dataset,
    Hours,
    Minutes,
    Model,
    Name,
    ObjectMeta,
    PathText,
    PositiveInt,
    SecretRef,
    Short,
    SpecModel,
    entry_error,
    first_duplicate,
    visible,
)
from controller.core.walltime import SHARDS_MAX


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


class ClusterReference(SpecModel):
    """The cluster an EvalRun runs on: an admin's ClusterEvalCluster, or an EvalCluster of its own namespace."""

    kind: Literal["EvalCluster", "ClusterEvalCluster"] = Field(description="EvalCluster (the EvalRun's namespace) "
                                                                           "or ClusterEvalCluster (cluster-scoped).")
    name: Name = Field(description="Its name.")


def _named(value: Any) -> Any:
    """A plain name in `clusters` is an EvalCluster of the EvalRun's namespace, as `cluster: NAME` is."""
    return {"kind": "EvalCluster", "name": value} if isinstance(value, str) else value


# The API server takes either shape (a structural schema has no string-or-object type); the loader validates it.
ClusterItem = Annotated[ClusterReference, BeforeValidator(_named), WithJsonSchema({
    "description": "NAME (an EvalCluster of the EvalRun's namespace) or {kind: EvalCluster|ClusterEvalCluster, "
                   "name: NAME}.",
    "x-kubernetes-preserve-unknown-fields": True})]
CLUSTERS_MIN, CLUSTERS_MAX = 2, 8


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


Glob = Annotated[str, Field(min_length=1, max_length=MODEL_MAX), AfterValidator(visible)]


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


class Pin(SpecModel):
    """Models that run on one cluster of `clusters` only."""

    models: list[Glob] = Field(min_length=1, max_length=PATTERNS_MAX,
                               description="Shell globs over model names (as modelSelector's namePatterns), e.g. "
                                           "laion/*-32B*.")
    cluster: Name = Field(description="The cluster they run on: the name of one of clusters.")


class PlacementSpec(SpecModel):
    """Where the cells of an EvalRun with several clusters run (RULES §15)."""

    strategy: Literal["soonest", "ordered"] = Field(
        "soonest", description="Where a cell that has run nowhere yet is launched: soonest, on the cluster where "
                               "its job is expected to start first; ordered, on the first cluster of clusters that "
                               "can take it. A cell that ran somewhere stays there.")
    spill_after_minutes: int | None = Field(
        60, ge=1, le=7 * 24 * 60, description="A job still queued this long, never started, while another cluster the "
                                              "cell may run on has a free slot, is cancelled and the cell placed "
                                              "anew once accounting shows it never started; null: never. A job that "
                                              "started is never moved.")
    pin: list[Pin] = Field(default_factory=list, max_length=CLUSTERS_MAX * 4,
                           description="Models bound to one cluster; a model no pin matches may run on any. A listed "
                                       "model two pins send to different clusters is refused; a model the "
                                       "selector adds goes where the first pin matching it says.")


def pin_matches(pin: Pin, model: str) -> bool:
    return any(glob_matches(glob, model) for glob in pin.models)


def glob_matches(glob: str, model: str) -> bool:
    """As modelSelector's namePatterns match: the whole name, case-insensitively."""
    return fnmatch.fnmatchcase(model.lower(), glob.lower())


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
    """What must be evaluated: models × benchmarks on one cluster or several, and how the reconciler treats the
    jobs."""

    cluster: Name | None = Field(None, description="Name of an EvalCluster in the EvalRun's namespace (or clusterRef).")
    cluster_ref: ClusterReference | None = Field(None, description="The cluster, by kind and name (or cluster).")
    clusters: list[ClusterItem] | None = Field(
        None, json_schema_extra={"minItems": CLUSTERS_MIN, "maxItems": CLUSTERS_MAX},
        description="Several clusters (2 to 8, instead of cluster or clusterRef), each NAME (an EvalCluster of the "
                    "EvalRun's namespace) or {kind: ClusterEvalCluster, name: NAME}: each cell runs on one of them, "
                    "chosen by placement, and stays where it ran; a cell runs only where its preset's walltime fits "
                    "(maxTimeLimit), never cut to a shorter one.")
    placement: PlacementSpec | None = Field(None, description="With clusters: where each cell runs.")
    models: list[Model] = Field(default_factory=list, max_length=MODELS_MAX,
                                description="Models to evaluate: Hugging Face repo ids (Org/Name, e.g. "
                                            "laion/Qwen3-8B-sft-v3) or absolute paths to local checkpoints; the "
                                            "priority list when modelSelector adds more.")
    model_selector: ModelSelector | None = Field(None, description="Models chosen from the results DB (after the "
                                                                   "listed ones).")
    presets: list[Short] | None = Field(
        None, max_length=PRESETS_MAX, description="Benchmark presets (tb2, v2, swebench, …; 'id' = all three), "
                                                  "as `evalctl presets` lists them; set presets or datasets.")
    datasets: list[Dataset] | None = Field(None, max_length=DATASETS_MAX,
                                           description="Explicit datasets (Org/name; a local directory is written "
                                                       "with a /, e.g. ./my_bench) instead of presets.")
    agent: Short = Field("terminus-2", description="Harbor agent (the harness), e.g. terminus-2, openhands, "
                                                   "swe-agent: it picks the model's serving pattern (RULES §10).")
    harbor_config: PathText | None = Field(None,
                                           description="Explicit Harbor config; overrides registry and size rule.")
    timeout_multiplier: float | None = Field(
        None, gt=0, le=100, description="Explicit timeout multiplier; overrides registry and size rule."
    )
    overrides: SandboxOverrides = Field(default_factory=SandboxOverrides, description="Sandbox size overrides, "
                                                                                      "passed to Harbor.")
    n_attempts: PositiveInt = Field(
        3, le=100, description="Harbor attempts per task (-k); RULES §6 totals (tb2 267 = 89 tasks × 3) assume 3."
    )
    agent_kwargs: list[str] = Field(default_factory=list, max_length=AGENT_KWARGS_MAX,
                                    description="Extra --agent-kwarg values for Harbor (they override the "
                                                "registry's); the job gets them as EVAL_AGENT_KWARGS.")
    force_eval: bool = Field(False, description="Evaluate again: ignore the rows and run dirs this EvalRun did not "
                                                "create and add rows of its own (never edits theirs); done once its "
                                                "own row is Finished with metrics (RULES §2).")
    suspend: bool = Field(False, description="Plan but do not act: nothing is submitted, cancelled or uploaded.")
    deletion_policy: DeletionPolicy = Field(
        "Orphan", description="When the EvalRun is deleted (operator): Orphan leaves its queued and running jobs "
                              "alone; Cancel cancels them before the object goes.")
    stale_started_hours: Hours = Field(24, description="A Started row older than this with no live job is stale: "
                                                       "the cell starts again (RULES §2).")
    stale_pending_hours: Hours = Field(6, description="A Pending row or queued job older than this is stale: "
                                                      "cancelled and started again (RULES §2).")
    walltime: Literal["fixed", "auto"] = Field(
        "fixed", description="fixed: every job asks for its preset's walltime, else the cluster's timeLimit. auto: "
                             "each job asks for what attempts alike took (p90 × 1.25, a resume for its trials left), "
                             "within the cluster's minTimeLimit and maxTimeLimit (RULES §16).")
    shards: PositiveInt | None = Field(
        None, le=SHARDS_MAX, description="Run each benchmark as this many jobs over disjoint task subsets, each "
                                         "resumed and refired on its own; one row holds their union's score (RULES "
                                         "§17). A preset's own shards win; a benchmark needs its task count in the "
                                         "catalog. Unset: one job, or with walltime auto as many as the estimate "
                                         "needs to fit maxTimeLimit, chosen once before the first launch; 1: one "
                                         "job, resumed after maxTimeLimit.")
    resume: ResumePolicy = Field(default_factory=ResumePolicy, description="When a run dir is resumed (RULES §4).")
    monitor: MonitorPolicy = Field(default_factory=MonitorPolicy,
                                   description="When a running job is judged stuck (RULES §5).")
    health: HealthPolicy = Field(default_factory=HealthPolicy, description="Launch health: dead launches, stalled "
                                                                           "launches, traffic, refires.")
    upload: UploadPolicy = Field(default_factory=UploadPolicy, description="Where results go, and what may be uploaded "
                                                                           "(RULES §14).")
    pinggy: PinggySpec = Field(default_factory=PinggySpec, description="Tunnel pairs for installed-agent harnesses.")
    budget: BudgetPolicy = Field(default_factory=BudgetPolicy, description="What the EvalRun may spend (GPU-hours).")
    report: ReportSpec = Field(default_factory=ReportSpec, description="How `evalctl report` shows the results.")
    notify: NotifySpec = Field(default_factory=NotifySpec, description="Webhooks told of transitions (Stalled, "
                                                                       "Failed, Completed, Ready).")

    @model_validator(mode="after")
    def _one_cluster(self) -> EvalRunSpec:
        given = [name for name, value in (("cluster", self.cluster), ("clusterRef", self.cluster_ref),
                                          ("clusters", self.clusters)) if value is not None]
        if len(given) != 1:
            raise entry_error(tuple(given[1:2]), "one_cluster",
                              "name the cluster one way: cluster: NAME (an EvalCluster of this namespace), "
                              "clusterRef: {kind: ClusterEvalCluster, name: NAME}, or clusters: [NAME, NAME] "
                              "(several)")
        return self

    @field_validator("clusters")
    @classmethod
    def _clusters_listed(cls, value: list[ClusterReference] | None) -> list[ClusterReference] | None:
        if value is None:
            return None
        if not CLUSTERS_MIN <= len(value) <= CLUSTERS_MAX:
            raise entry_error((), "clusters_count", f"list {CLUSTERS_MIN} to {CLUSTERS_MAX} clusters, not "
                              f"{len(value)}; one cluster is written cluster: NAME")
        index = first_duplicate([item.name for item in value])
        if index is not None:  # by name: cells, pins and the results DB know a cluster by its name
            raise entry_error((index,), "duplicate", "cluster {name} is listed twice (pins and cells name a "
                              "cluster by its name); list each once", name=value[index].name)
        return value

    @model_validator(mode="after")
    def _placement_fits(self) -> EvalRunSpec:
        if self.placement is None:
            return self
        if self.clusters is None:
            raise entry_error(("placement",), "placement_without_clusters", "placement chooses among several "
                              "clusters: list them in clusters: [NAME, NAME] (instead of cluster or clusterRef), "
                              "or remove placement")
        names = [item.name for item in self.clusters]
        for index, pin in enumerate(self.placement.pin):
            if pin.cluster not in names:
                raise entry_error(("placement", "pin", index, "cluster"), "pin_cluster", "pin cluster {cluster} is "
                                  f"not one of clusters; name one of: {', '.join(names)}", cluster=pin.cluster)
        for model in self.models:
            matching = [(index, pin) for index, pin in enumerate(self.placement.pin) if pin_matches(pin, model)]
            clash = next(((index, pin) for index, pin in matching if pin.cluster != matching[0][1].cluster), None)
            if clash is not None:
                index, pin = clash
                at = next(at for at, glob in enumerate(pin.models) if glob_matches(glob, model))
                raise entry_error(("placement", "pin", index, "models", at), "pin_conflict",
                                  f"model {model} is pinned to {matching[0][1].cluster} (pin {matching[0][0]}) and "
                                  f"to {pin.cluster} (pin {index}): a model runs on one cluster; narrow a glob")
        return self

    @model_validator(mode="after")
    def _shared_pools_on_one_cluster(self) -> EvalRunSpec:
        """What an EvalRun shares across its jobs is planned per cluster: with several, one lane could spend what
        another just took (RULES §15)."""
        if self.clusters is None:
            return self
        if self.budget.max_gpu_hours is not None:
            raise entry_error(("budget", "maxGpuHours"), "budget_with_clusters", "budget.maxGpuHours is not "
                              "supported with several clusters yet (each cluster's launches are planned apart, so "
                              "one could spend what another took): remove it, or split the EvalRun per cluster")
        if self.pinggy.pairs:
            raise entry_error(("pinggy", "pairs"), "pinggy_with_clusters", "pinggy pairs are not supported with "
                              "several clusters yet (a pair could be handed to two jobs on two clusters in one "
                              "pass): remove them, or split the EvalRun per cluster")
        return self

    @property
    def cluster_refs(self) -> list[ClusterReference]:
        """Every cluster it names, spec order (one for cluster or clusterRef)."""
        if self.clusters is not None:
            return list(self.clusters)
        if self.cluster_ref is not None:
            return [self.cluster_ref]
        assert self.cluster is not None  # _one_cluster
        return [ClusterReference(kind="EvalCluster", name=self.cluster)]

    @property
    def cluster_kind(self) -> Literal["EvalCluster", "ClusterEvalCluster"]:
        """The first cluster's kind."""
        return self.cluster_refs[0].kind

    @property
    def cluster_name(self) -> str:
        """The first cluster's name."""
        return self.cluster_refs[0].name

    def pinned_to(self, model: str) -> str | None:
        """The cluster name the first pin matching `model` sends it to; None: any cluster."""
        pins = self.placement.pin if self.placement is not None else []
        return next((pin.cluster for pin in pins if pin_matches(pin, model)), None)

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
        index = first_duplicate(value or [])
        if index is not None and value is not None:
            raise entry_error((index,), "duplicate", "'{value}' is listed twice", value=value[index])
        return value


class EvalRun(SpecModel):
    """An evaluation campaign the reconciler keeps converged: one cell per (model, benchmark)."""

    api_version: Literal["evalrun.io/v1alpha1"] = Field(description="evalrun.io/v1alpha1")
    kind: Literal["EvalRun"] = Field(description="EvalRun")
    metadata: ObjectMeta
    spec: EvalRunSpec
