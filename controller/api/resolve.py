"""Spec → desired cells: one `Cell` per (model, benchmark) with every parameter resolved.

Layering, first that sets a value wins:
  harbor config, timeout multiplier: EvalRun (harborConfig / timeoutMultiplier) > model registry
    (hardware-profile variant applied) > size policy;
  agent kwargs: EvalRun agentKwargs > model registry > none;
  vLLM serving: the registry entry's settings for the harness's pattern > its settings for every pattern;
  config yaml (EVAL_CONFIG_YAML): the harness's scaffold config > the preset's;
  time limit: the preset's walltime (at most the cluster's maxTimeLimit) > the cluster's timeLimit.
The fingerprint covers only what changes results, so moving a run to other ports, tunnels or
paths keeps its identity (and its DB rows).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping, Sequence
from pathlib import PurePosixPath

from pydantic import BaseModel, ConfigDict, Field

from controller.api.catalog import Catalog, ServeSettings
from controller.api.evalcluster import AnyCluster
from controller.api.evalrun import EvalRun
from controller.core.types import Cell, EnvironmentOverrides, EvalRunRef, Serving, walltime_seconds


class Benchmark(BaseModel):
    """One benchmark of an EvalRun: what the user wrote and the dataset it means."""

    model_config = ConfigDict(frozen=True)

    name: str
    dataset: str
    n_concurrent: int
    config_yaml: str | None = None
    tasks: int | None = Field(None, description="the preset's task count; None: only Harbor's total says")
    partial_credit: bool | None = None
    walltime: str | None = Field(None, description="the preset's walltime, as it asks for it")
    sized: bool = Field(False, description="the preset's `walltime: auto`: its jobs are sized (RULES §16)")
    time_limit: str | None = Field(None, description="its jobs' walltime: the preset's, at most the cluster's "
                                                     "maximum; None: the cluster's timeLimit")
    shards: int = Field(1, description="the jobs its cells run as (RULES §17): the preset's, else the EvalRun's")
    shards_set: bool = Field(False, description="the preset or the EvalRun sets shards: no estimate chooses them")

    @property
    def clamped(self) -> bool:
        return self.walltime is not None and self.walltime != self.time_limit


def resolve(run: EvalRun, cluster: AnyCluster, catalog: Catalog, models: Sequence[str] | None = None, *,
            one_cluster: bool = True) -> tuple[Cell, ...]:
    """The run's cells, models outer (`models`, default the listed ones: a selector adds more), benchmarks inner,
    both in order; a sharded cell is followed by its shards (RULES §17). `one_cluster`: False for a lane of several
    clusters, whose cells no estimate shards."""
    found = benchmarks(run, cluster, catalog)
    return tuple(cell for model in (run.spec.models if models is None else models)
                 for cell in _cells(run, cluster, catalog, model, found, one_cluster))


def with_chosen_shards(cells: Sequence[Cell], chosen: Mapping[str, int]) -> tuple[Cell, ...]:
    """`cells` with each that may shard and whose estimate chose K shards (`chosen`: cell key → K, what the store
    remembers) run as K shards, followed by them (RULES §17); never more than its tasks (a catalog whose count fell
    since would leave shards of none, which can never run)."""
    found: list[Cell] = []
    for cell in cells:
        count = min(chosen.get(cell.key, 1), cell.tasks or 1) if cell.may_shard else 1
        if count < 2:
            found.append(cell)
            continue
        sharded = cell.model_copy(update={"shards": count})
        found += (sharded, *sharded.sharded())
    return tuple(found)


def resolution_notes(run: EvalRun, cluster: AnyCluster, catalog: Catalog) -> tuple[str, ...]:
    """Things worth logging about how cells were resolved (e.g. a size-rule fallback), one per model."""
    notes = []
    for model in run.spec.models:
        settings = _settings(catalog, model, cluster)
        config_set = run.spec.harbor_config or settings.harbor_config
        multiplier_set = run.spec.timeout_multiplier or settings.timeout_multiplier
        choice = catalog.size_policy.choose(model)
        if choice.note and not (config_set and multiplier_set):
            rule = choice.rule
            notes.append(
                f"{model}: {choice.note}: using base default {rule.harbor_config} ×{rule.timeout_multiplier:g}"
            )
    harness = catalog.harnesses.harness(run.spec.agent)
    for benchmark in benchmarks(run, cluster, catalog):
        if harness.config_yaml and benchmark.config_yaml and harness.config_yaml != benchmark.config_yaml:
            notes.append(f"{benchmark.name}: agent {run.spec.agent} runs with its scaffold config "
                         f"{harness.config_yaml}, not the preset's {benchmark.config_yaml}")
    return tuple(notes)


def walltime_warnings(run: EvalRun, cluster: AnyCluster, catalog: Catalog) -> tuple[str, ...]:
    """Presets that ask for more walltime than the cluster allows: their jobs get the cluster's longest, and a job
    the walltime ends is resumed (RULES §4), so the run goes on in chunks instead of being refused."""
    return tuple(
        f"preset {b.name} asks for walltime {b.walltime}, more than cluster {cluster.metadata.name} allows "
        f"(maxTimeLimit {cluster.spec.longest_walltime}): its jobs get {b.time_limit} and are resumed after the "
        "walltime; raise maxTimeLimit if the partition allows longer"
        for b in benchmarks(run, cluster, catalog) if b.clamped)


def benchmarks(run: EvalRun, cluster: AnyCluster, catalog: Catalog) -> tuple[Benchmark, ...]:
    """Presets (aliases expanded) capped by the cluster ceiling, or explicit datasets at the ceiling."""
    ceiling = cluster.spec.max_concurrent_trials
    if run.spec.datasets:
        return tuple(
            Benchmark(name=dataset, dataset=dataset, n_concurrent=ceiling, shards=run.spec.shards or 1,
                      shards_set=run.spec.shards is not None)
            for dataset in run.spec.datasets
        )
    found = []
    for name in run.spec.presets or ():
        for preset_name in catalog.presets.expand(name):
            preset = catalog.presets.presets[preset_name]
            found.append(
                Benchmark(
                    name=preset_name,
                    dataset=preset.dataset,
                    n_concurrent=min(preset.n_concurrent, ceiling),
                    config_yaml=preset.config_yaml,
                    tasks=preset.tasks,
                    partial_credit=preset.partial_credit,
                    walltime=None if preset.walltime == "auto" else preset.walltime,
                    sized=preset.walltime == "auto",
                    time_limit=_time_limit(None if preset.walltime == "auto" else preset.walltime, cluster),
                    shards=preset.shards or run.spec.shards or 1,
                    shards_set=preset.shards is not None or run.spec.shards is not None,
                )
            )
    return tuple(found)


def _time_limit(walltime: str | None, cluster: AnyCluster) -> str | None:
    """The preset's walltime, clamped to the cluster's longest (see `walltime_warnings`)."""
    if walltime is None:
        return None
    longest = cluster.spec.longest_walltime
    return walltime if walltime_seconds(walltime) <= walltime_seconds(longest) else longest


def fingerprint(
    agent: str,
    harbor_config: str,
    timeout_multiplier: float,
    overrides: EnvironmentOverrides,
    agent_kwargs: tuple[str, ...],
    n_attempts: int,
    serving: Serving | None = None,
) -> str:
    """sha256 of the canonical JSON of what changes results; the harbor config counts by file name, not path.

    The serving settings that change what the agent sees count only when set, so cells without them keep the
    identity they had before serving was resolved. The config yaml is not hashed: the harness (the agent) and the
    preset (the dataset) that choose it already are."""
    payload: dict[str, object] = {
        "agent": agent,
        "harbor_config": PurePosixPath(harbor_config).name,
        "timeout_multiplier": float(timeout_multiplier),
        "overrides": overrides.model_dump(),
        "agent_kwargs": list(agent_kwargs),
        "n_attempts": n_attempts,
    }
    if serving is not None and serving.fingerprinted():
        payload["serving"] = serving.fingerprinted()
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


def benchmark_name(dataset: str) -> str:
    """`benchmarks.name`: the dataset after its last '/' (`DCAgent2/terminal_bench_2/` → terminal_bench_2)."""
    return dataset.rstrip("/").rsplit("/", 1)[-1]


def _cells(run: EvalRun, cluster: AnyCluster, catalog: Catalog, model: str,
           found: tuple[Benchmark, ...], one_cluster: bool) -> Iterator[Cell]:
    """One model's cells; what depends on the model alone is resolved once for all its benchmarks."""
    spec = run.spec
    settings = _settings(catalog, model, cluster)
    size_rule = catalog.size_policy.choose(model).rule
    harbor_config = spec.harbor_config or settings.harbor_config or size_rule.harbor_config
    multiplier = spec.timeout_multiplier or settings.timeout_multiplier or size_rule.timeout_multiplier
    agent_kwargs = tuple(spec.agent_kwargs) or settings.agent_kwargs or ()
    overrides = EnvironmentOverrides(
        override_cpus=spec.overrides.cpus,
        override_memory_mb=spec.overrides.memory_mb,
        override_storage_mb=spec.overrides.storage_mb,
    )
    evalrun = EvalRunRef(namespace=run.metadata.namespace, name=run.metadata.name)
    needs_pinggy = catalog.harnesses.needs_pinggy(spec.agent, harbor_config)
    harness = catalog.harnesses.harness(spec.agent)
    serving = catalog.models.serving(model, harness.pattern)
    digest = fingerprint(spec.agent, harbor_config, multiplier, overrides, agent_kwargs, spec.n_attempts, serving)
    for benchmark in found:
        cell = Cell(
            evalrun=evalrun,
            cluster=cluster.metadata.name,
            model=model,
            benchmark=benchmark.name,
            dataset=benchmark.dataset,
            benchmark_name=benchmark_name(benchmark.dataset),
            agent=harness.agent or spec.agent,
            n_concurrent=benchmark.n_concurrent,
            n_attempts=spec.n_attempts,
            harbor_config=harbor_config,
            timeout_multiplier=multiplier,
            overrides=overrides,
            agent_kwargs=agent_kwargs,
            conda_env=settings.conda_env,
            tensor_parallel_size=settings.tensor_parallel_size,
            data_parallel_size=settings.data_parallel_size,
            max_model_len=settings.max_model_len,
            max_output_tokens=settings.max_output_tokens,
            serving=serving,
            config_yaml=harness.config_yaml or benchmark.config_yaml,
            time_limit=benchmark.time_limit or cluster.spec.time_limit,  # the one place a walltime is decided
            walltime_auto=benchmark.sized,
            needs_pinggy=needs_pinggy,
            calls_model=spec.agent not in catalog.harnesses.model_free_agents,
            reports_tokens=harness.reports_tokens,
            tasks=benchmark.tasks,
            partial_credit=benchmark.partial_credit,
            fingerprint=digest,
            shards=benchmark.shards,
            may_shard=(one_cluster and not benchmark.shards_set and (benchmark.sized or spec.walltime == "auto")
                       and (benchmark.tasks or 0) >= 2),
        )
        yield cell
        if cell.shards > 1:  # validate refuses shards where the catalog does not count the tasks
            yield from cell.sharded()


def _settings(catalog: Catalog, model: str, cluster: AnyCluster) -> ServeSettings:
    return catalog.models.settings(model, cluster.spec.hardware_profile) or ServeSettings()

