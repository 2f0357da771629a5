"""Spec → desired cells: one `Cell` per (model, benchmark) with every parameter resolved.

Layering, first that sets a value wins:
  harbor config, timeout multiplier: EvalRun (harborConfig / timeoutMultiplier) > model registry
    (hardware-profile variant applied) > size policy;
  agent kwargs: EvalRun agentKwargs > model registry > none.
The fingerprint covers only what changes results, so moving a run to other ports, tunnels or
paths keeps its identity (and its DB rows).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Sequence
from pathlib import PurePosixPath

from pydantic import BaseModel, ConfigDict

from controller.core.types import Cell, EnvironmentOverrides, EvalRunRef
from controller.spec.catalog import Catalog, ServeSettings
from controller.spec.models import AnyCluster, EvalRun


class Benchmark(BaseModel):
    """One benchmark of an EvalRun: what the user wrote and the dataset it means."""

    model_config = ConfigDict(frozen=True)

    name: str
    dataset: str
    n_concurrent: int


def resolve(run: EvalRun, cluster: AnyCluster, catalog: Catalog, models: Sequence[str] | None = None) -> tuple[Cell, ...]:
    """The run's cells, models outer (`models`, default the listed ones: a selector adds more), benchmarks inner,
    both in order."""
    found = benchmarks(run, cluster, catalog)
    return tuple(cell for model in (run.spec.models if models is None else models)
                 for cell in _cells(run, cluster, catalog, model, found))


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
    return tuple(notes)


def benchmarks(run: EvalRun, cluster: AnyCluster, catalog: Catalog) -> tuple[Benchmark, ...]:
    """Presets (aliases expanded) capped by the cluster ceiling, or explicit datasets at the ceiling."""
    ceiling = cluster.spec.max_concurrent_trials
    if run.spec.datasets:
        return tuple(
            Benchmark(name=dataset, dataset=dataset, n_concurrent=ceiling)
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
                )
            )
    return tuple(found)


def fingerprint(
    agent: str,
    harbor_config: str,
    timeout_multiplier: float,
    overrides: EnvironmentOverrides,
    agent_kwargs: tuple[str, ...],
    n_attempts: int,
) -> str:
    """sha256 of the canonical JSON of what changes results; the harbor config counts by file name, not path."""
    payload = {
        "agent": agent,
        "harbor_config": PurePosixPath(harbor_config).name,
        "timeout_multiplier": float(timeout_multiplier),
        "overrides": overrides.model_dump(),
        "agent_kwargs": list(agent_kwargs),
        "n_attempts": n_attempts,
    }
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


def benchmark_name(dataset: str) -> str:
    """`benchmarks.name`: the dataset after its last '/' (`DCAgent2/terminal_bench_2/` → terminal_bench_2)."""
    return dataset.rstrip("/").rsplit("/", 1)[-1]


def _cells(run: EvalRun, cluster: AnyCluster, catalog: Catalog, model: str,
           found: tuple[Benchmark, ...]) -> Iterator[Cell]:
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
    digest = fingerprint(spec.agent, harbor_config, multiplier, overrides, agent_kwargs, spec.n_attempts)
    for benchmark in found:
        yield Cell(
            evalrun=evalrun,
            cluster=cluster.metadata.name,
            model=model,
            benchmark=benchmark.name,
            dataset=benchmark.dataset,
            benchmark_name=benchmark_name(benchmark.dataset),
            agent=spec.agent,
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
            needs_pinggy=needs_pinggy,
            calls_model=spec.agent not in catalog.harnesses.model_free_agents,
            fingerprint=digest,
        )


def _settings(catalog: Catalog, model: str, cluster: AnyCluster) -> ServeSettings:
    return catalog.models.settings(model, cluster.spec.hardware_profile) or ServeSettings()

