"""A user who hits a hold sees it and is told the lever: `status` (grid and JSON) lists every cell its plan holds,
whatever the phase, with the hold's reason; `release: evalctl retry …` only where a retry releases it (Failed);
upload.forceUpload beside it for an upload hold it would release; a command that reads no spec with its store;
and `reconcile --until-done` ends with 4 once only held cells are left."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import timedelta

from rich.console import Console

from controller.core.gpu_hours import EstimateSource, GpuEstimate
from controller.core.observed import JobState
from controller.core.planner import Policy, plan
from controller.core.reconcile import PassResult
from controller.core.remedies import Quarantined, QuarantineKind
from controller.core.status import summarize
from controller.core.types import submission_name
from controller.core.vocabulary import CellPlan, Plan
from controller.entry.exit_codes import HELD, TIMED_OUT
from controller.entry.render import explain, status_grid, status_json
from controller.entry.until_done import Deadline, settled_end, timed_out
from tests.core.builders import NOW, POLICY, RUN, SCORED, ago, cell, facts, job, obs, row, sub

SPEC = ["-f", "run.yaml"]
STORE = ["--store", "sqlite:///lab/.evalctl/store.db"]
DONE, WAITING = cell("org/a-8B"), cell("org/b-8B")


def passed(the_plan: Plan) -> PassResult:
    return PassResult(evalrun=the_plan.evalrun, plan=the_plan, status=summarize(the_plan))


def _text(draw: Callable[[Console], None]) -> str:
    console = Console(record=True, width=400)
    draw(console)
    return console.export_text()


def _grid(the_plan: Plan) -> str:
    return _text(lambda console: status_grid(passed(the_plan), console, SPEC, STORE))


def _json(the_plan: Plan) -> dict:
    [run] = json.loads(status_json([passed(the_plan)], SPEC, STORE))["evalruns"]
    return run


def _budget_held() -> Plan:
    """DONE, Completed, spent 380 of a 400 GPU-h budget; WAITING's launch (32 GPU-h) is held, its cell still
    Pending."""
    spent = sub(DONE).model_copy(update={"gpu_hours": 380.0})
    done = obs(subs=(spent,), rows=(row("Finished", job_name=DONE.run_tag(1), metrics=SCORED),),
               dirs=(facts(DONE.run_tag(1)),))
    return plan(RUN, [DONE, WAITING], [done, obs()], POLICY.model_copy(update={"max_gpu_hours": 400.0}), NOW,
                estimates={WAITING.key: GpuEstimate(hours=32.0, source=EstimateSource.HISTORY, group="g",
                                                    basis="history")})


def test_a_launch_the_budget_holds_is_listed_as_held_with_its_reason_and_no_retry() -> None:
    the_plan = _budget_held()
    text = _grid(the_plan)

    assert "held: org/b-8B × tb2: budget: 412 of 400 GPU-h" in text, text
    assert "evalctl retry" not in text, "a retry does not release a budget hold"
    run = _json(the_plan)
    [held] = run["held"]
    assert (held["model"], held["phase"]) == ("org/b-8B", "Pending") and held["hold"].startswith("budget: 412")
    assert "release" not in held
    assert [(a["model"], a["reason"][:11]) for a in run["attention"]] == [("org/b-8B", "budget: 412")]


def test_a_suspended_evalrun_says_so_in_the_grid_title() -> None:
    the_plan = plan(RUN, [WAITING], [obs()], POLICY.model_copy(update={"suspend": True}), NOW)
    text = _grid(the_plan)

    assert f"EvalRun {RUN} (suspended): 1 Pending" in " ".join(text.split()), text
    assert "held: org/b-8B × tb2: suspended; would submit" in text
    assert _json(the_plan)["suspended"] is True


GATES = POLICY.model_copy(update={"max_total_fires": 1, "hold_overlong": True, "overlong": timedelta(hours=24)})


def _finished(the_cell=DONE, **changes: object):
    """Its one job ended, its run dir as `changes` say (100 trials expected)."""
    tag = the_cell.run_tag(1)
    dir_ = facts(tag, total=100, completed=100).model_copy(update=changes)
    return obs(subs=(sub(the_cell),), rows=(row("Started", job_name=tag),),
               jobs=(job(tag, JobState.COMPLETED, started=ago(hours=5), ended=ago(hours=2)),), dirs=(dir_,))


SHORT = {"n_completed": 60, "n_scored": 60, "n_graded": 60, "reward_sum": 30.0, "n_trial_dirs": 60,
         "tasks": {f"t{i}": (1, 1, 0.5) for i in range(60)}}


def _held_upload(policy: Policy = GATES, **changes: object) -> tuple[Plan, CellPlan]:
    the_plan = plan(RUN, [DONE], [_finished(**changes)], policy, NOW)
    return the_plan, the_plan.cells[0]


def test_an_upload_hold_names_force_upload_beside_the_retry() -> None:
    the_plan, held = _held_upload(**SHORT)
    text = _grid(the_plan)

    assert "held: org/a-8B × tb2: refused (Incomplete): 60 of 100 expected trials (harbor) have a result" in text, text
    assert "release: evalctl retry -f run.yaml org/a-8B tb2" in text
    assert "or: set upload.forceUpload: true in the EvalRun: uploads this run and every other run of it held as " \
           "incomplete or over the infra share that covers upload.minCompletedFraction, flagged partial" in text
    [shown] = _json(the_plan)["held"]
    assert shown["release"].startswith("evalctl retry") and shown["levers"][0].startswith("set upload.forceUpload")
    explained = _text(lambda console: explain(held, console, NOW, spec_args=SPEC, store_args=STORE))
    assert "release: evalctl retry" in explained and "or: set upload.forceUpload: true" in explained, explained


def test_an_upload_hold_the_flag_would_not_release_does_not_name_it() -> None:
    """forceUpload does not lower minCompletedFraction: 20 of 100 stays held with it."""
    few = {**SHORT, "n_completed": 20, "n_scored": 20, "n_graded": 20, "n_trial_dirs": 20,
           "tasks": {f"t{i}": (1, 1, 0.5) for i in range(20)}}
    the_plan, _ = _held_upload(**few)
    text = _grid(the_plan)

    assert "release: evalctl retry" in text and "forceUpload" not in text, text
    assert "levers" not in _json(the_plan)["held"][0]


def test_an_overlong_hold_names_force_upload_and_what_it_flags() -> None:
    the_plan, _ = _held_upload(started_at=ago(hours=30))

    assert "or: set upload.forceUpload: true in the EvalRun: uploads this run and every other run of it held as " \
           "overlong, flagged is_overlong" in _grid(the_plan)


def test_a_launch_held_by_quarantined_nodes_gives_the_release_command_with_its_store() -> None:
    quarantined = tuple(Quarantined(kind=QuarantineKind.NODE, scope="c1", name=name, reason="nccl",
                                    until=NOW + timedelta(hours=1)) for name in ("gpu01",))
    the_plan = plan(RUN, [WAITING], [obs()], POLICY.model_copy(update={"cluster": "c1"}), NOW,
                    quarantined=quarantined, usable_nodes=frozenset({"gpu01"}))
    text = _grid(the_plan)

    assert "held: org/b-8B × tb2: every usable node of c1 is quarantined (gpu01)" in text, text
    assert "release: evalctl nodes release gpu01 --cluster c1 --store sqlite:///lab/.evalctl/store.db" in text
    assert "(lift a node's quarantine: evalctl nodes release NODE --cluster CLUSTER --store sqlite:///lab" in text
    assert _json(the_plan)["held"][0]["levers"] == [
        "evalctl nodes release gpu01 --cluster c1 --store sqlite:///lab/.evalctl/store.db"]


def test_until_done_ends_with_held_once_every_unsettled_cell_is_held() -> None:
    only_held = passed(_budget_held())
    running = cell("org/c-8B")
    tag = running.run_tag(1)
    busy = plan(RUN, [running], [obs(subs=(sub(running),), rows=(row("Started", job_name=tag, started=ago(hours=1)),),
                                     jobs=(job(submission_name(tag, 1), JobState.RUNNING, started=ago(hours=1)),),
                                     dirs=(facts(tag, completed=3, finished=False, last_progress=ago(minutes=1)),))],
                POLICY, NOW)

    assert only_held.status.settled and not passed(busy).status.settled
    assert settled_end([only_held]) == (HELD, "evalctl: 1 held — `evalctl status` says what releases each")
    code, line = timed_out([only_held, passed(busy)], Deadline("1s"))
    assert code == TIMED_OUT and "1 cell(s) not settled (1 Running); 1 held" in line, line
