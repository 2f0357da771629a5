"""Second review of shards chosen by the estimate (RULES §17 `ShardsChosen`, commits 96612b4 and eb9e66c): the
whole pass over a real SQLite store and the local scheduler, pass after pass, with what shares the pass with the
choice (another EvalRun of the same cell, the GPU-hour budget, a crash), and what people read of it. Tests marked
"holds" pin a property the choice depends on; those marked "failed" failed on eb9e66c, each for the defect its
docstring names, and pass since its fix.

The history: one finished 5 h attempt of another 8B model on terminal_bench_2 of the cell's size (267 trials, 48 at
a time). One job of the cell would ask 6 h 30 m, past maxTimeLimit 2 h; 4 shards of at most 23 tasks ask 2 h each.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from controller.adapters.scheduler.local import LocalScheduler
from controller.adapters.store.sqlite import SqliteStore
from controller.api.catalog import load_catalog
from controller.api.loader import SpecSet, load_specs
from controller.core.actions import ActionKind
from controller.core.gpu_hours import EstimateSource, GpuEstimate
from controller.core.observed import ObservedJob, Submission
from controller.core.planner import plan
from controller.core.reconcile import PassResult
from controller.core.store import Store
from controller.core.types import EvalRunRef
from controller.core.vocabulary import Rule
from controller.core.walltime import WalltimePolicy, wall_estimate
from controller.entry.getting import read_cells
from controller.entry.passes import pass_targets, run_pass
from controller.entry.shell import StoreURLs
from tests.core.builders import NOW, POLICY, RUN, cell, obs
from tests.fixtures.evalctl import cancel_live_jobs, run_evalctl

SHARDS = 4  # what the history chooses: see the module's docstring


class Lab:
    """A local cluster (maxTimeLimit 2 h), a SQLite store holding the history, and the EvalRuns of a test."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "jobs").mkdir()
        self.script = root / "job.sh"
        self.script.write_text("#!/bin/sh\nexec sleep 120\n")  # a job that stays live while the test looks
        self.script.chmod(0o755)
        self.spec = root / "spec.yaml"
        self.state = SqliteStore(root / "store.db")
        self.store = Store(self.state, self.state)
        self.scheduler = LocalScheduler(root / "logs" / ".local-scheduler")
        history = Submission(name="ev_earlier__a1", run_tag="ev_earlier__a1", evalrun=EvalRunRef(name="earlier"),
                             cell_key="earlier", attempt=1, fire=1, created_at=datetime.now(UTC) - timedelta(hours=6),
                             model="org/m2-8B", benchmark="terminal_bench_2", trials=267, concurrency=48)
        self.state.record_submission(history)
        self.state.record_job_end(history.name, gpu_hours=5.0, elapsed_hours=5.0)
        self.state.finish_attempt(history.run_tag)

    def write(self, *runs: str) -> SpecSet:
        """The cluster and one EvalRun per `runs` item (its name, then its spec lines), each of org/m1-8B × tb2."""
        evalruns = "".join(f"""---
apiVersion: evalrun.io/v1alpha1
kind: EvalRun
metadata: {{name: {name}}}
spec:
  cluster: a
  models: [org/m1-8B]
  presets: [tb2]
{extra}""" for name, _, extra in (run.partition("\n") for run in runs))
        self.spec.write_text(f"""apiVersion: evalrun.io/v1alpha1
kind: EvalCluster
metadata: {{name: a}}
spec:
  scheduler: {{type: local}}
  jobsDir: {self.root}/jobs
  logsDir: {self.root}/logs
  jobScript: {self.script}
  timeLimit: "2:00:00"
  maxTimeLimit: "2:00:00"
  minTimeLimit: "0:15:00"
  maxConcurrentTrials: 48
{evalruns}""")
        return load_specs([self.spec])

    def reconcile(self, specs: SpecSet) -> list[PassResult]:
        return run_pass(specs, self.store, datetime.now(UTC), act=True)

    def jobs(self) -> list[ObservedJob]:
        return [job for job in self.scheduler.observe() if job.state.active]

    def submitted_keys(self) -> list[str]:
        with sqlite3.connect(self.root / "store.db") as conn:
            return [key for (key,) in conn.execute(
                "SELECT cell_key FROM evalrun_submissions WHERE cell_key != 'earlier' ORDER BY created_at")]

    def remembered(self) -> dict[str, object]:
        with sqlite3.connect(self.root / "store.db") as conn:
            return {key: json.loads(memory) for key, memory in conn.execute(
                "SELECT cell_key, memory FROM evalrun_cell_memory")}

    def close(self) -> None:
        cancel_live_jobs(self.scheduler)
        self.state.close()


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    found = Lab(tmp_path)
    yield found
    found.close()


def asked_seconds(job: ObservedJob, lab: Lab) -> int:
    """The --time the local scheduler holds for the job (job.json)."""
    return int(json.loads((lab.scheduler.jobs_dir / job.job_id / "job.json").read_text())["time_limit_s"])


# ------------------------------------------------------------------ pass after pass, one EvalRun


def test_holds_the_choice_launches_nothing_the_next_pass_launches_its_shards_once_and_the_one_after_nothing(
        lab: Lab) -> None:
    """Holds. Over the real store and scheduler: the choosing pass submits nothing and remembers the count under the
    unsharded key; the next submits exactly one job per shard (never one of the unsharded cell), each asking for at
    most maxTimeLimit; a third pass submits nothing more."""
    specs = lab.write("auto\n  walltime: auto\n")

    [first] = lab.reconcile(specs)
    [choosing] = first.plan.cells
    assert choosing.rule == Rule.SHARDS_CHOSEN, choosing.reason
    assert lab.jobs() == [] and lab.submitted_keys() == []
    assert lab.remembered()[choosing.cell.key]["shards"]["count"] == SHARDS  # type: ignore[index]

    [second] = lab.reconcile(specs)
    sharded, *shards = (c.cell for c in second.plan.cells)
    assert sharded.shards == SHARDS and sharded.former_key == choosing.cell.key
    assert sorted(lab.submitted_keys()) == sorted(s.key for s in shards), "one job per shard, none of the cell"
    assert len(lab.jobs()) == SHARDS and all(asked_seconds(job, lab) <= 2 * 3600 for job in lab.jobs())

    lab.reconcile(specs)
    assert len(lab.submitted_keys()) == SHARDS and len(lab.jobs()) == SHARDS, "nothing more on the third pass"


# ------------------------------------------------------------------ what shares the pass with the choice


@pytest.mark.parametrize("other", ["  walltime: fixed\n", "  walltime: auto\n  shards: 1\n"],
                         ids=["other-walltime-fixed", "other-shards-1"])
def test_the_choice_does_not_hand_the_unsharded_cell_to_another_evalrun_that_runs_it_whole(lab: Lab,
                                                                                           other: str) -> None:
    """Failed. Two EvalRuns list the same cell (one key: model, dataset, fingerprint); the first, walltime auto, owns
    it and chooses 4 shards, and the second (walltime fixed, or `shards: 1`) watches it ("owned by EvalRun auto").
    On the next pass the first claims only its sharded key and its shards' keys (controller/core/reconcile.py:372,
    `_keys` :427; `claim_cells` drops every other claim of the EvalRun, DROP_UNNAMED_CLAIMS), so the unsharded key
    is released, the second EvalRun takes it and submits the whole benchmark as one job beside the 4 shards: the
    benchmark runs twice (5 jobs, twice the GPU-hours), where before the choice it ran once. RULES §17: the choice
    never runs "one job beside shards that may be running"; the sharded cell's former identity is the unsharded key.
    A correct implementation keeps the unsharded key owned with its shards (it is their cell's former identity), so
    the other EvalRun goes on watching it."""
    specs = lab.write("auto\n  walltime: auto\n", f"other\n{other}")

    choosing, watching = lab.reconcile(specs)
    assert choosing.plan.cells[0].rule == Rule.SHARDS_CHOSEN
    assert watching.plan.cells[0].rule == Rule.OWNED_ELSEWHERE, "before the choice the other EvalRun only watches"

    lab.reconcile(specs)
    unsharded = choosing.plan.cells[0].cell.key
    assert unsharded not in lab.submitted_keys(), f"{len(lab.jobs())} jobs: the 4 shards and the whole cell again"


def test_holds_another_evalrun_that_may_shard_the_same_cell_follows_the_choice_and_launches_nothing(lab: Lab) -> None:
    """Holds. The same two EvalRuns, both walltime auto with no shards set: the second reads the same remembered
    count, resolves the same sharded key and shard keys, and watches them; 4 jobs in all."""
    specs = lab.write("auto\n  walltime: auto\n", "other\n  walltime: auto\n")
    lab.reconcile(specs)
    _, watching = lab.reconcile(specs)
    assert {c.rule for c in watching.plan.cells} == {Rule.OWNED_ELSEWHERE}
    assert len(lab.submitted_keys()) == SHARDS and len(lab.jobs()) == SHARDS


def test_a_choice_whose_shards_the_gpu_hour_budget_cannot_pay_does_not_spend_part_of_it(lab: Lab) -> None:
    """Failed. `spec.budget.maxGpuHours: 3` and an estimate of 5 GPU-hours for the cell: as one job its launch is held
    by the budget before anything runs (`shards: 1` below). The choice comes before the launch gates
    (`allocation.admit_launch`, controller/core/planner/allocation.py:160: "a choice takes no ... GPU-hour budget"),
    and the budget then judges each shard alone: shards 1 and 2 (1.3 and 1.2 GPU-h) launch, 3 and 4 are held. The
    EvalRun spends 2.5 GPU-hours on half a benchmark whose union the budget will never let run, where unsharded it
    spent none and said why. A correct implementation admits the shards of a chosen cell together against the budget
    (their summed estimate, as the cell's launch would be), or holds the choice as the cell's launch would be held."""
    budget = "  budget: {maxGpuHours: 3}\n"
    held = lab.write(f"auto\n  walltime: auto\n  shards: 1\n{budget}")
    [one_job] = lab.reconcile(held)
    [hold] = [a for a in one_job.plan.cells[0].actions if a.kind == ActionKind.HOLD]
    assert hold.reason.startswith("budget: 5 of 3 GPU-h") and lab.jobs() == [], hold.reason

    specs = lab.write(f"auto\n  walltime: auto\n{budget}")
    lab.reconcile(specs)
    lab.reconcile(specs)
    assert lab.jobs() == [], f"{len(lab.jobs())} of {SHARDS} shards launched on a budget that holds the rest"


def test_holds_a_reconciler_killed_right_after_remembering_the_choice_launches_the_shards_next_pass(
        lab: Lab) -> None:
    """Holds. `evalctl reconcile` SIGKILLed right after the choice is written (the actor's `after-remember` point),
    before the pass ends or releases its leases: the next process takes the dead one's leases over and submits the
    4 shards, never the unsharded cell."""
    lab.write("auto\n  walltime: auto\n")
    store = f"sqlite:///{lab.root}/store.db"
    lab.state.close()
    killed = run_evalctl(("reconcile", "--once"), spec=lab.spec, store=store, env=os.environ, kill_at="after-remember",
                         check=False, timeout=60)
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr
    run_evalctl(("reconcile", "--once"), spec=lab.spec, store=store, env=os.environ, timeout=60)

    lab.state = SqliteStore(lab.root / "store.db")
    assert len(lab.submitted_keys()) == SHARDS and len(lab.jobs()) == SHARDS
    assert all("+shard" in key for key in lab.submitted_keys())


# ------------------------------------------------------------------ what people read of it


def test_the_choice_says_the_request_that_exceeds_max_time_limit_not_only_the_p90_times_the_margin() -> None:
    """Failed. The reason `allocation.shards_chosen` writes (controller/core/planner/allocation.py:204-207) gives the
    cause as `a sized request of the cell (p90 1 h 30 m × 1.25) exceeds maxTimeLimit 2:00:00`: 1 h 52 m, which
    does not exceed 2 h. What exceeds it is the request, 2:15:00, with the 15 m pre-walltime cancel (and, where the
    estimate lacks it, the server start) added and rounded up to a quarter hour, as `walltime.sized` says it for
    every sized job. `plan`, `explain` and the sharded cell's reason ("chosen by its estimate: ...") repeat it for
    as long as the cell runs. A correct implementation names the request it compared (2:15:00) and what it is made
    of."""
    two_hours = WalltimePolicy(auto=True, cancel_margin=timedelta(minutes=15), minimum=timedelta(minutes=15),
                               maximum=timedelta(hours=2))
    long = cell("org/a-8B", tasks=100, may_shard=True)
    estimate = wall_estimate([1.5], "3 finished attempt(s) of terminal_bench_2, 0–14B", with_start=True, scales=True)
    guess = GpuEstimate(hours=1.5, source=EstimateSource.HISTORY, basis="history", group="tb2", wall=estimate)
    [decided] = plan(RUN, [long], [obs()], POLICY.model_copy(update={"walltime": two_hours}), NOW,
                     estimates={long.key: guess}).cells
    assert decided.rule == Rule.SHARDS_CHOSEN
    assert "2:15:00" in decided.reason, decided.reason


def test_evalctl_get_lists_the_cells_it_knows_whatever_another_cells_remembered_choice_holds(lab: Lab) -> None:
    """Failed. Since eb9e66c `CellMemory.from_stored` (controller/core/remedies.py:173-187) raises for a `shards`
    value that does not decode, so that the pass resolving that cell is Unknown. `evalctl get`, which needs no spec
    and reads every cell's memory only for what its gate admitted (`read_inventory`,
    controller/adapters/store/sqlite.py:208), then fails as a whole: one cell's undecodable choice (an EvalRun
    deleted long ago, a hand edit, another version's writer) hides every EvalRun and cell of the store ("a cell's
    chosen shards do not decode: Field required (check the store file)"). A correct implementation confines the
    failure to the cell (or to the read that resolves it): `get` still lists the others."""
    specs = lab.write("fixed\n  walltime: fixed\n")
    lab.reconcile(specs)  # one submitted cell, of walltime fixed: no choice of its own
    with sqlite3.connect(lab.root / "store.db") as conn:
        conn.execute("INSERT INTO evalrun_cell_memory VALUES (?, ?, ?)",
                     ("another|cell|key", '{"shards": {"count": 2, "reason": "p90 over maxTimeLimit"}}', "now"))
    cells = read_cells(lab.store, StoreURLs(f"sqlite:///{lab.root}/store.db", None, (lab.spec,)))
    assert [c.model for c in cells if c.evalrun == "fixed"] == ["org/m1-8B"]


def test_an_undecodable_choice_does_not_make_unknown_an_evalrun_whose_cell_may_not_shard(lab: Lab) -> None:
    """Failed. The same undecodable choice under the key of a cell that sets `shards: 1` (RULES §17's opt-out: "setting
    shards makes the cell one job again"): the choice no longer decides anything for it (`with_estimated_shards`
    does not even read it), yet the pass's store read decodes it and fails, so the EvalRun is Unknown, its cell
    `ObservationFailed`, with "check that the store is reachable" as the fix, pass after pass. Neither documented
    lever (`shards` set, `walltime: fixed`) gets the EvalRun out; only an edit of the store does. A correct
    implementation lets a choice that cannot decide the cell not fail its read (the cell runs as the one job its spec
    asks for)."""
    specs = lab.write("pinned\n  walltime: auto\n  shards: 1\n")
    [target] = pass_targets(specs, load_catalog(), lab.store, datetime.now(UTC), act=False)
    with sqlite3.connect(lab.root / "store.db") as conn:
        conn.execute("INSERT INTO evalrun_cell_memory VALUES (?, ?, ?)",
                     (target.cells[0].key, '{"shards": {"count": 2, "reason": "p90 over maxTimeLimit"}}', "now"))
    [after] = lab.reconcile(specs)
    assert after.unobserved == (), [u.cause for u in after.unobserved]
    assert after.plan.cells[0].rule != Rule.OBSERVATION_FAILED, after.plan.cells[0].reason


