"""Whether a run dir is the cell's run (RULES §14 identity), from what its files record.

Each file speaks for itself: config.json (what Harbor ran), meta.env (what the job script was told) and the trial
results (what each trial ran). One that names something other than the cell makes the dir another run, whatever the
others say; what no file says is not held. Adopting the old listener's dirs (`match.run_dir_matches`) compares the
timeout multiplier the same way.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from controller.core.observed import RecordedWhat, RunDirFacts
from controller.core.types import Cell

HARBOR_PROVIDERS = ("hosted_vllm/", "openai/", "vllm/")
ASPECTS: tuple[RecordedWhat, ...] = ("model", "benchmark", "dataset", "agent", "timeout multiplier", "attempts",
                                      "tasks")
WHOLE_DATASET = "the whole dataset"  # what a cell runs, unless it is a shard (RULES §17)


def identity_differences(cell: Cell, facts: RunDirFacts, model_names: Iterable[str] = (),
                         benchmark_names: Iterable[str] = ()) -> list[str]:
    """How the run dir is not the cell's run, one phrase per aspect naming every value and which file says it;
    [] when it is. `model_names`/`benchmark_names`: the DB's names for the cell's model and benchmark (families)."""
    same = _Same(cell, model_names, benchmark_names)
    said: dict[RecordedWhat, dict[str, list[str]]] = {what: {} for what in ASPECTS}  # what → value → its files
    for what, value in _picked(facts):
        said[what].setdefault(value, [])
    for claim in facts.recorded:
        said[claim.what].setdefault(claim.value, []).append(claim.source)
    wrong = []
    for what, values in said.items():
        if other := [value for value in values if not same(what, value)]:
            wrong.append(_phrase(what, other, values, same.cells(what)))
    if cell.tasks is not None and len(facts.tasks) > cell.tasks:
        wrong.append(f"{len(facts.tasks)} distinct tasks, more than the catalog's {cell.tasks} for "
                     f"{cell.benchmark_name}")
    return wrong


def shard_claims(cell: Cell) -> tuple[str, ...]:
    """What a shard cell's run dir says of its tasks, as the reader words it: meta.env its EVAL_SHARD, config.json
    the task names the job script passed Harbor, as many as its share (RULES §17). A cell that is no shard: none."""
    if cell.shard is None:
        return ()
    return f"shard {cell.shard}", f"task_names ({cell.tasks})"


def same_multiplier(recorded: float | None, cell: Cell) -> bool:
    """The cell's timeout multiplier, or none recorded: another multiplier is another measurement."""
    return recorded is None or recorded == cell.timeout_multiplier


def same_dataset(recorded: str, cell: Cell, benchmark_names: Iterable[str] = ()) -> bool:
    """The cell's dataset when its name (the last part) is the benchmark's, or one of that name's family, and the
    parts before it end alike, part for part, as far as both go: `/lustre/DCAgent2/terminal_bench_2` is
    `DCAgent2/terminal_bench_2` (the job script resolves the path it is given) and so is the bare name
    `terminal_bench_2`; `OtherOrg/terminal_bench_2` is not."""
    parts, own = _parts(recorded), _parts(cell.dataset)
    names = {cell.benchmark_name.lower(), *(name.lower() for name in benchmark_names)}
    if not parts or parts[-1].lower() not in names:
        return False
    shared = min(len(parts), len(own)) - 1  # the parts before the name both have
    return parts[len(parts) - 1 - shared : -1] == own[len(own) - 1 - shared : -1]


def model_key(name: str) -> str:
    """How two spellings of one model compare: no serving provider prefix, no trailing slash, any case."""
    name = name.strip().rstrip("/")
    for prefix in HARBOR_PROVIDERS:
        name = name.removeprefix(prefix)
    return name.lower()


class _Same:
    """Whether a recorded value is the cell's, aspect by aspect."""

    def __init__(self, cell: Cell, model_names: Iterable[str], benchmark_names: Iterable[str]) -> None:
        self.cell = cell
        self.models = {model_key(name) for name in (cell.model, *model_names)}
        self.benchmark_names = tuple(benchmark_names)
        self.benchmarks = {cell.benchmark_name.lower(), *(name.lower() for name in self.benchmark_names)}

    def __call__(self, what: RecordedWhat, value: str) -> bool:
        if what == "model":
            return model_key(value) in self.models
        if what == "benchmark":
            return value.lower() in self.benchmarks
        if what == "dataset":
            return same_dataset(value, self.cell, self.benchmark_names)
        if what == "agent":
            return value == self.cell.agent
        if what == "timeout multiplier":
            return (number := _number(value)) is not None and same_multiplier(number, self.cell)
        if what == "tasks":  # part of the dataset (a filter, a shard) or more than it: not the cell's run
            return value in shard_claims(self.cell)  # unless it is the shard the cell is
        return _number(value) == self.cell.n_attempts

    def cells(self, what: RecordedWhat) -> str:
        """The cell's own value, as a phrase shows it."""
        values = {"model": self.cell.model, "benchmark": self.cell.benchmark_name, "dataset": self.cell.dataset,
                  "agent": self.cell.agent, "timeout multiplier": self.cell.timeout_multiplier,
                  "attempts": self.cell.n_attempts,
                  "tasks": f"shard {self.cell.shard}" if self.cell.shard is not None else WHOLE_DATASET}
        return _shown(str(values[what]), what)


def _picked(facts: RunDirFacts) -> Iterator[tuple[RecordedWhat, str]]:
    """The values the reader picked for matching and display (meta.env over config.json): facts built without
    the files' own claims say only these."""
    picked: tuple[tuple[RecordedWhat, object], ...] = (
        ("model", facts.model), ("benchmark", facts.benchmark_name), ("dataset", facts.dataset),
        ("agent", facts.agent), ("timeout multiplier", facts.timeout_multiplier))
    return ((what, str(value)) for what, value in picked if value is not None)


def _phrase(what: RecordedWhat, wrong: list[str], values: dict[str, list[str]], cells: str) -> str:
    """`model 'org/Other-70B', not 'laion/Qwen3-8B' (config.json: 'org/Other-70B'; meta.env: 'laion/Qwen3-8B')`:
    the values that are not the cell's, then which file says what (just the files, when they all agree)."""
    text = f"{what} {', '.join(_shown(value, what) for value in wrong)}, not {cells}"
    said: dict[str, list[str]] = {}  # the files saying a value → the values they say
    for value, sources in values.items():
        if sources:
            said.setdefault(", ".join(sources), []).append(_shown(value, what))
    if len(said) == 1 and len(next(iter(said.values()))) == 1:
        return f"{text} ({next(iter(said))})"
    if said:
        return f"{text} ({'; '.join(sources + ': ' + ', '.join(shown) for sources, shown in said.items())})"
    return text


def _parts(path: str) -> list[str]:
    return [part for part in path.split("/") if part not in ("", ".")]


def _number(value: str) -> float | None:
    try:
        return float(value)
    except ValueError:
        return None


def _shown(value: str, what: RecordedWhat) -> str:
    if what in ("timeout multiplier", "attempts") and (number := _number(value)) is not None:
        return f"{number:g}"
    return value if what == "tasks" else repr(value)
