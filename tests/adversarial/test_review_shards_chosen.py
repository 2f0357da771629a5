"""Review of shards chosen by the estimate (RULES §17 `ShardsChosen`, commit 96612b4): cases the choice gets wrong.
Each test marked "failed" failed on that commit and passes since its fix; those marked "holds" pin a property the
choice depends on.

Planner-level where the store does not matter (the cell's first launch decided with the estimates the pass computes,
then the K shard cells it resolves planned with theirs); over a real SQLite store where it does.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path

import pytest

from controller.adapters.store.sqlite import SqliteStore
from controller.api.catalog import load_catalog
from controller.api.loader import load_specs
from controller.api.resolve import with_chosen_shards
from controller.core.actions import Submit
from controller.core.gpu_hours import AttemptCost, GpuEstimate, SizeBands, estimates
from controller.core.observed import JobState, ObservedJob, RunDirFacts
from controller.core.planner import Policy, launch_of, plan
from controller.core.store import Store
from controller.core.types import Cell
from controller.core.vocabulary import Rule
from controller.core.walltime import Learning, WalltimePolicy
from controller.entry.passes import pass_targets
from tests.core.builders import NOW, POLICY, RUN, ago, cell, facts, obs
from tests.entry.test_estimated_shards import NOW as PASS_NOW
from tests.entry.test_estimated_shards import spec, targets

BANDS = SizeBands(bands=((0, 14),))
EIGHT_HOURS = WalltimePolicy(auto=True, cancel_margin=timedelta(minutes=15), minimum=timedelta(hours=1),
                             maximum=timedelta(hours=8))
AUTO = POLICY.model_copy(update={"walltime": EIGHT_HOURS})
LONG = cell("org/a-8B", tasks=100, may_shard=True)


def attempt(tag: str, hours: float, trials: int | None, concurrency: int | None = None) -> AttemptCost:
    return AttemptCost(run_tag=tag, model="org/x-8B", benchmark="terminal_bench_2", gpu_hours=hours, wall_hours=hours,
                       trials=trials, concurrency=concurrency)


def finished_dir(tag: str, total: int, completed: int, hours: float) -> RunDirFacts:
    """A run dir of another model of the size band whose trials ran `hours` from its first to its last."""
    found = facts(tag, total=total, completed=completed, model="org/x-8B", benchmark_name="terminal_bench_2")
    return found.model_copy(update={"started_at": ago(hours=hours + 2), "finished_at": ago(hours=2)})


def first_job(tag: str, started_hours_ago: float) -> ObservedJob:
    return ObservedJob(job_id=tag, name=tag, state=JobState.COMPLETED, submitted_at=ago(hours=started_hours_ago + 1),
                       started_at=ago(hours=started_hours_ago))


def chosen_count(policy: Policy, history: Sequence[AttemptCost], dirs: Sequence[RunDirFacts] = (),
                 jobs: Sequence[ObservedJob] = ()) -> int | None:
    """What the cell's first launch chooses this pass (None: it launches as one job)."""
    guesses = estimates([LONG], history, dirs, BANDS, gpus_per_job=1, jobs=jobs)
    [decided] = plan(RUN, [LONG], [obs()], policy, NOW, estimates=guesses).cells
    if decided.rule != Rule.SHARDS_CHOSEN:
        return None
    assert decided.remember is not None and decided.remember.shards is not None
    return decided.remember.shards.count


def cut_shards(count: int, policy: Policy, history: Sequence[AttemptCost], dirs: Sequence[RunDirFacts] = (),
               jobs: Sequence[ObservedJob] = ()) -> list[str]:
    """The --time of each of the `count` shards' first launch that is cut at maxTimeLimit, as the next pass plans
    them: the shard cells `with_chosen_shards` resolves, each sized from the estimate `estimates` computes for it
    (a request cut to maxTimeLimit records no estimate: `walltime.sized`)."""
    sharded, *shards = with_chosen_shards([LONG], {LONG.key: count})
    cells: list[Cell] = [sharded, *shards]
    guesses: dict[str, GpuEstimate] = estimates(cells, history, dirs, BANDS, gpus_per_job=1, jobs=jobs)
    planned = plan(RUN, cells, [obs() for _ in cells], policy, NOW, budget=len(cells), estimates=guesses).cells
    launches = [launch_of(p) for p in planned[1:]]
    assert all(isinstance(launch, Submit) and launch.time_limit for launch in launches), [p.reason for p in planned]
    return [f"{shard.label}: --time {launch.time_limit}" for shard, launch in zip(shards, launches, strict=True)
            if isinstance(launch, Submit) and launch.estimated_hours is None]


# ------------------------------------------------------------------ K against what the shards will ask for


def test_shards_chosen_from_attempts_of_unknown_size_still_ask_for_max_time_limit() -> None:
    """Failed. `walltime.shards_needed` (controller/core/walltime.py:167-179, via `_share` :182) scales the cell's
    p90 by each shard's share of the tasks whatever the evidence, but `gpu_hours.estimates` leaves an attempt whose
    trials are not recorded (a submission from before migration 0011, or an EvalRun that ran the benchmark as a
    dataset without a task count) unscaled (`_Size.factor`, controller/core/gpu_hours.py:89-92, is 1.0), for the
    shard cells too. Three 20 h attempts of unknown size choose 4 shards, yet each shard's own estimate is still
    20 h and its --time is cut to maxTimeLimit 8 h: four jobs each resumed after the limit, the one thing the
    choice was for. A correct implementation sizes each candidate shard from the evidence as `estimates` will
    scale it for that shard: here no count fits (RULES §17: "None is chosen when no shard would fit"), so it
    chooses none, or only a count whose shards' requests fit."""
    unknown_size = [attempt(f"ev_x__a{i}", 20.0, trials=None) for i in range(3)]
    assert chosen_count(AUTO, unknown_size) is None, "no count's shards would fit: none is chosen"


def test_one_attempt_of_unknown_size_among_known_ones_makes_the_chosen_shards_still_cut() -> None:
    """Failed. The same defect with mixed evidence, as a store holds it after an upgrade: a 100-trial attempt of 20 h
    and a 10-trial one of 5 h (scaled to 50 h for the cell) choose 9 shards of 12 tasks, but a 9 h attempt of
    unknown size is 9 h for every shard, so each shard's p90 is 9 h and asks for maxTimeLimit. A correct
    implementation chooses only a count whose shards' own requests fit (none does here)."""
    mixed = [attempt("ev_x__a1", 20.0, trials=100), attempt("ev_x__a2", 5.0, trials=10),
             attempt("ev_x__a3", 9.0, trials=None)]
    assert chosen_count(AUTO, mixed) is None, "the attempt of unknown size is 9 h for every shard: none fits"


LEARNT = AUTO.model_copy(update={"walltime": EIGHT_HOURS.model_copy(update={
    "learnt": Learning(jobs=6, median_ratio=1.0, high_ratio=1.2, margin=1.5)})})
STARTED_DIRS = [finished_dir(f"ev_x__r{i}", 100, 100, 20.0) for i in range(3)]
STARTED_JOBS = [first_job(f"ev_x__r{i}", 20.0 + 2 + 1.5) for i in range(3)]  # each server started for 1.5 h


@pytest.mark.parametrize(("policy", "history", "dirs", "jobs"), [
    (AUTO, [attempt(f"ev_x__a{i}", 20.0, trials=100) for i in range(3)], [], []),
    (AUTO, [attempt("ev_x__a1", 20.0, trials=50, concurrency=4), attempt("ev_x__a2", 12.0, trials=200)], [], []),
    (AUTO, [], STARTED_DIRS, []),
    (AUTO, [], STARTED_DIRS, STARTED_JOBS),
    (AUTO, [attempt(f"ev_x__a{i}", 20.0, trials=100) for i in range(3)], STARTED_DIRS, STARTED_JOBS),
    (LEARNT, [attempt(f"ev_x__a{i}", 20.0, trials=100) for i in range(3)], STARTED_DIRS, STARTED_JOBS),
], ids=["history", "history-of-other-sizes", "run-dirs-only", "run-dirs-and-measured-starts",
        "history-and-measured-starts", "learnt-margin"])
def test_holds_with_evidence_of_known_size_the_fewest_shards_that_fit_are_chosen(
        policy: Policy, history: list[AttemptCost], dirs: list[RunDirFacts], jobs: list[ObservedJob]) -> None:
    """Holds. Where every attempt's size is known, K is neither too few nor too many against what the shard cells
    will really ask for: each of the K shards' first --time (sized from the estimate `estimates` computes for that
    shard cell) fits maxTimeLimit, and with K - 1 shards one would not (history of other sizes and concurrency,
    run-dir-only evidence, a measured server start each shard pays, a learnt margin)."""
    count = chosen_count(policy, history, dirs, jobs)
    assert count is not None and count > 2, "the cases are chosen to need more than 2 shards"
    assert cut_shards(count, policy, history, dirs, jobs) == []
    assert cut_shards(count - 1, policy, history, dirs, jobs) != [], f"{count - 1} shards would have fit"


# ------------------------------------------------------------------ the store read before the pass resolves cells


def test_a_store_that_cannot_be_read_makes_the_evalrun_unknown_rather_than_failing_the_pass(tmp_path: Path) -> None:
    """Failed. `SqliteStore.read_memories` (controller/adapters/store/sqlite.py:224-232) asks for the store's tables
    outside its try (line 226): a file that is no SQLite database, or a corrupt one, raises sqlite3.DatabaseError,
    which `passes.with_estimated_shards` (controller/entry/passes.py:30-42, catching ObservationError only) lets out
    of `pass_targets`. It is the first read of the store for an EvalRun without a modelSelector: with `walltime:
    fixed` the same store makes `run_pass` report the cell Unknown ("file is not a database ... point --store at
    the right file"); with `walltime: auto` `plan`, `status` and `explain` stop with an internal error, and a
    reconcile loop is not retried (controller/entry/reconciling.py catches OSError and RuntimeError only). RULES §17:
    "when that read fails the EvalRun's cells are Unknown". A correct implementation raises ObservationError for
    any database error of the read, and the EvalRun is Unknown with the reason."""
    specs = load_specs([spec(tmp_path, "  walltime: auto\n")])
    (tmp_path / "store.db").write_bytes(b"not a database, a file put here by mistake\n" * 64)
    state = SqliteStore(tmp_path / "store.db", readonly=True)
    try:
        [target] = pass_targets(specs, load_catalog(), Store(state, state), PASS_NOW, act=False)
    except sqlite3.Error as error:
        pytest.fail(f"the pass failed instead of making the EvalRun Unknown: {type(error).__name__}: {error}")
    finally:
        state.close()
    assert target.unknown.startswith("the shards its estimates chose cannot be read"), target.unknown


def test_a_stored_choice_that_does_not_decode_is_not_read_as_no_choice(tmp_path: Path) -> None:
    """Failed. `CellMemory.from_stored` (controller/core/remedies.py:173-187) drops a field whose value does not
    decode, "no reading (as an unknown key is)": harmless for a stall reading, not for `shards`. A choice stored
    without its `at` (an older or newer writer, a hand edit) reads as no choice, so `with_estimated_shards` resolves
    the cell as one job with no Unknown: its first launch then chooses again from this pass's estimate (another
    count is another run, abandoning the shards' runs) or, if that now fits, submits one job beside the shards.
    A correct implementation treats a `shards` value that is there but does not decode as a failed read: the
    EvalRun is Unknown, as for memory that is not JSON (tests/entry/test_estimated_shards.py)."""
    [target] = targets(tmp_path, "  walltime: auto\n", '{"shards": {"count": 2, "reason": "p90 over maxTimeLimit"}}')
    assert target.unknown.startswith("the shards its estimates chose cannot be read"), target.unknown


# ------------------------------------------------------------------ a remembered count the cell can no longer run


def test_a_remembered_count_above_the_cells_task_count_resolves_no_empty_shard() -> None:
    """Failed. `resolve.with_chosen_shards` (controller/api/resolve.py:62-73) applies any remembered count >= 2,
    never checking it against the cell's tasks now. The count was at most the catalog's task count when chosen,
    but the catalog's count may shrink (a new controller version, a catalog override): a 6-task cell remembering
    8 shards resolves two shard cells of 0 tasks, whose jobs the sbatch refuses ("EVAL_SHARD=6/8 selects no
    task", exit 2) and whose union can never be made: the cell is stuck. An explicit `shards` above the task
    count is refused by validate (`loader._check_shards`); a correct implementation never resolves a shard of no
    task (it says the remembered count no longer fits, e.g. the EvalRun Unknown with the reason)."""
    small = cell("org/a-8B", tasks=6, may_shard=True)
    _, *shards = with_chosen_shards([small], {small.key: 8})
    assert all(shard.tasks for shard in shards), [shard.tasks for shard in shards]
