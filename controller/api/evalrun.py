"""`EvalRun`: what must be evaluated — models × benchmarks on one cluster or several — and how the reconciler
treats its jobs (apiVersion evalrun.io/v1alpha1)."""

from __future__ import annotations

import fnmatch
import json
import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, Field, WithJsonSchema, field_validator, model_validator

from controller.api.evalrun_policies import (
    BudgetPolicy,
    HealthPolicy,
    MonitorPolicy,
    NotifySpec,
    PinggySpec,
    ReportSpec,
    ResumePolicy,
    SandboxOverrides,
    UploadPolicy,
)
from controller.api.fields import (
    AGENT_KWARGS_BYTES,
    AGENT_KWARGS_MAX,
    DATASETS_MAX,
    HOURS_MAX,
    MODEL_MAX,
    MODELS_MAX,
    PRESETS_MAX,
    Dataset,
    Hours,
    Model,
    Name,
    ObjectMeta,
    PathText,
    PositiveInt,
    Short,
    SpecModel,
    entry_error,
    first_duplicate,
    visible,
)
from controller.core.walltime import SHARDS_MAX


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
