"""Cells that the results DB could not tell apart are refused at validate time.

The DB knows a result by (model name, `benchmarks.name`), and `benchmarks.name` is only the dataset's last
path part: `OrgA/bench_x` and `OrgB/bench_x` land on the same rows. Two such cells would read each other's
scores, so every loaded EvalRun is checked together and the error names both lines.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from controller.api.catalog import Catalog
from controller.api.errors import SpecError
from controller.api.evalrun import EvalRun
from controller.api.resolve import benchmark_name
from controller.api.yamldoc import Document


def identity_collisions(runs: Sequence[tuple[EvalRun, Document]], catalog: Catalog) -> list[SpecError]:
    """One error per cell whose (model, benchmark name) an earlier cell with another dataset already has."""
    errors: list[SpecError] = []
    first: dict[tuple[str, str], tuple[str, SpecError, str]] = {}  # identity → (dataset, its place, evalrun)
    for run, document in runs:
        for path, dataset in _benchmark_entries(run, catalog):
            place = document.error(path, "")
            for model in run.spec.models:
                identity = (model, benchmark_name(dataset))
                seen = first.setdefault(identity, (dataset, place, run.metadata.name))
                if seen[0] == dataset:
                    continue  # the same cell named twice (another EvalRun): ownership decides, not validate
                errors.append(document.error(path, _message(model, dataset, seen)))
                break
    return errors


def _benchmark_entries(run: EvalRun, catalog: Catalog) -> Iterator[tuple[tuple[str | int, ...], str]]:
    """(YAML path, dataset) of every benchmark the EvalRun names, presets expanded."""
    for index, dataset in enumerate(run.spec.datasets or ()):
        yield ("spec", "datasets", index), dataset
    for index, name in enumerate(run.spec.presets or ()):
        for preset in catalog.presets.expand(name):
            yield ("spec", "presets", index), catalog.presets.presets[preset].dataset


def _message(model: str, dataset: str, seen: tuple[str, SpecError, str]) -> str:
    other, place, evalrun = seen
    return (f"{dataset} and {other} (EvalRun {evalrun}, {place.file}:{place.line}:{place.col}) are both benchmark "
            f"{benchmark_name(dataset)!r} in the results DB, so {model} would get one score for two datasets; "
            "evaluate only one of them, or publish the other under a distinct name")
