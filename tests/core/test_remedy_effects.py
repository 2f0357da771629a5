"""Remedies as timed, scoped effects (RULES §9): a back-off that ends, a catalog match that never shields a job from
the cancel rules, quarantines of one node within a cap, budgets that hold without an estimate, overlong from
accounting."""

from __future__ import annotations

from datetime import timedelta

import pytest

from controller.api.catalog import load_catalog
from controller.core.actions import Cancel, Hold, Quarantine, Submit, Wait
from controller.core.health import blamed_node
from controller.core.hostlist import HostlistError, expand
from controller.core.observed import JobOutput, JobState, RunDirFacts
from controller.core.planner import plan, plan_cell
from controller.core.remedies import CellMemory, FailureMode, FailureStage, Quarantined, QuarantineKind, RemedyKind, StallReading
from controller.core.types import EvalRunRef
from controller.core.vocabulary import CellPlan, Rule
from tests.core.builders import NOW, RUN, ago, cell, facts, job, obs, row, spec_policy, sub

MODES = load_catalog().failures.modes_for([])
POLICY = spec_policy(health=spec_policy().health.model_copy(update={"failure_modes": MODES}), cluster="hpc")
C = cell()
TAG = C.run_tag(1)
RATE_LIMITED = "huggingface_hub.errors.HfHubHTTPError: 429 Client Error: Too Many Requests for url: https://huggingface.co/api/models/x"
FAILED_EARLY = facts(TAG, total=None, completed=0, has_result=False, trial_dirs=0, finished=False)


def kinds(decided: CellPlan) -> list[str]:
    return [a.kind.value for a in decided.actions]


def failed(*, ended_min: float, log: str = RATE_LIMITED, nodes: str = "gpu07", memory: CellMemory | None = None):
    tag = C.run_tag(1)
    over = job(tag, JobState.FAILED, started=ago(minutes=ended_min + 1), ended=ago(minutes=ended_min)).model_copy(
        update={"log_tail": log, "reason": log[-80:], "nodes": nodes})
    return obs(subs=(sub(C),), rows=(row("Started", job_name=tag),), jobs=(over,), dirs=(FAILED_EARLY,)).model_copy(
        update={"memory": memory or CellMemory()})


def backing_off(decided: CellPlan) -> Quarantined:
    (action,) = [a for a in decided.actions if isinstance(a, Quarantine)]
    return Quarantined(kind=action.subject, scope=action.scope, name=action.name, reason=action.reason,
                       until=NOW + timedelta(seconds=action.ttl_s), since=NOW, owner=action.owner)


# --------------------------------------------------------------------------- a back-off that ends


def test_a_back_off_runs_from_the_failure_once_and_its_refire_waits_it_out():
    decided = plan_cell(C, failed(ended_min=1), POLICY, NOW)

    [pause] = [a for a in decided.actions if isinstance(a, Quarantine)]
    assert pause.subject == QuarantineKind.CLUSTER and pause.ttl_s == pytest.approx(9 * 60), "10 min from the failure"
    assert pause.owner == str(RUN)
    assert kinds(decided) == ["quarantine", "wait"] and "refire after 12:09:00" in decided.reason


def test_a_remembered_back_off_is_never_renewed_and_never_blocks_its_own_refire():
    first = plan_cell(C, failed(ended_min=1), POLICY, NOW)
    live = backing_off(first)  # still in force by the store's clock when the refire is due
    later = NOW + timedelta(minutes=9, seconds=30)
    seen = failed(ended_min=1, memory=first.remember)

    [refire] = plan(RUN, [C], [seen], POLICY, later, quarantined=(live,)).cells

    assert kinds(refire) == ["submit"], "its own refire passes the pause it started"
    assert not [a for a in refire.actions if isinstance(a, Quarantine)], "the remembered match starts nothing again"


def test_another_evalrun_on_the_cluster_waits_for_the_back_off_then_launches():
    other = EvalRunRef(name="run2")
    fresh = cell("org/fresh-8B", evalrun=other)
    pause = backing_off(plan_cell(C, failed(ended_min=1), POLICY, NOW))

    [during] = plan(other, [fresh], [obs()], POLICY, NOW + timedelta(minutes=5), quarantined=(pause,)).cells
    [after] = plan(other, [fresh], [obs()], POLICY, NOW + timedelta(minutes=10), quarantined=()).cells

    assert kinds(during) == ["wait"] and "back off until" in during.actions[0].reason
    assert kinds(after) == ["submit"]


def test_a_failure_older_than_its_back_off_pauses_nothing():
    decided = plan_cell(C, failed(ended_min=30), POLICY, NOW)

    assert kinds(decided) == ["submit"] and "refire 1 of 2: hf-hub-rate-limit" in decided.reason


def test_a_running_back_off_match_starts_its_pause_once_per_matched_line():
    live = job(TAG, JobState.RUNNING, started=ago(minutes=20))
    dir_ = facts(TAG, total=60, completed=5, finished=False, last_progress=ago(minutes=1))
    line = JobOutput(job_id=live.job_id, offset=0, end=40, text="DaytonaError: Bearer token is invalid\n")
    seen = obs(subs=(sub(C),), jobs=(live,), dirs=(dir_,)).model_copy(update={"outputs": (line,)})

    first = plan_cell(C, seen, POLICY, NOW)
    quiet = seen.model_copy(update={"outputs": (), "memory": first.remember})
    again = plan_cell(C, quiet, POLICY, NOW + timedelta(minutes=20))

    assert [a.subject for a in first.actions if isinstance(a, Quarantine)] == [QuarantineKind.CLUSTER]
    assert not [a for a in again.actions if isinstance(a, Quarantine)], "no new line: no new pause"
    assert again.rule == Rule.KNOWN_FAILURE, "its advice stays on show while the job runs"


# --------------------------------------------------------------------------- precedence: nothing shields a job

# a line each running catalog entry matches, as the tools print it
RUNNING_LINES = {
    "nccl-timeout": "[rank0]:[E ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog caught collective operation timeout: "
                    "WorkNCCL(SeqNum=1, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for "
                    "600010 milliseconds before timing out.",
    "daytona-load-shedding": "DaytonaError: Failed to create sandbox: Bearer token is invalid",
    "dockerfile-cannot-be-empty": "DaytonaError: Failed to build image: Dockerfile cannot be empty",
}
RUNNING_MODES = [m for m in MODES if m.when == FailureStage.RUNNING]


def _dead() -> RunDirFacts:
    from tests.core.test_launch_health import dead_dir
    return dead_dir(12, finished=False)


CANCEL_RULES = {  # a running job each cancel rule decides, with the memory it needs
    Rule.DEAD_LAUNCH: (_dead, 20, CellMemory()),
    Rule.ZOMBIE: (lambda: facts(TAG, total=10, completed=10, finished=False, last_progress=ago(minutes=20)), 60,
                  CellMemory()),
    Rule.STUCK_NEAR_COMPLETE: (lambda: facts(TAG, total=100, completed=98, finished=False,
                                             last_progress=ago(minutes=70)), 120, CellMemory()),
    Rule.LAUNCH_STALLED: (lambda: None, 40, CellMemory()),
    Rule.STUCK_GENERAL_AGAIN: (lambda: facts(TAG, total=60, completed=20, finished=False,
                                             last_progress=ago(minutes=200)), 300,
                               CellMemory(stall_reading=StallReading(run_tag=TAG, scored=20, at=ago(minutes=95)))),
}


def test_every_running_catalog_entry_has_a_line_here():
    assert {m.name for m in RUNNING_MODES} == set(RUNNING_LINES)


@pytest.mark.parametrize("mode", RUNNING_MODES, ids=lambda m: f"{m.name}-{m.remedy.value}")
@pytest.mark.parametrize("rule", list(CANCEL_RULES), ids=lambda r: r.value)
def test_a_running_catalog_match_never_makes_a_job_immune_to_a_cancel_rule(mode: FailureMode, rule: Rule):
    make_dir, started_min, memory = CANCEL_RULES[rule]
    dir_ = make_dir()
    live = job(TAG, JobState.RUNNING, started=ago(minutes=started_min))
    line = JobOutput(job_id=live.job_id, offset=0, end=100, text=f"{RUNNING_LINES[mode.name]}\n")
    seen = obs(subs=(sub(C),), rows=(row("Started", job_name=TAG),), jobs=(live,),
               dirs=(dir_,) if dir_ else ()).model_copy(update={"outputs": (line,), "memory": memory})
    plain = plan_cell(C, seen.model_copy(update={"outputs": ()}), POLICY, NOW)

    decided = plan_cell(C, seen, POLICY, NOW)

    assert plain.rule == rule, "the scenario is what it says"
    assert any(isinstance(a, Cancel) for a in decided.actions), f"{mode.name} kept a {rule.value} job running"
    if mode.remedy == RemedyKind.BACK_OFF:
        assert decided.rule == rule and f"also matched {mode.name}" in decided.reason
        assert [a.subject for a in decided.actions if isinstance(a, Quarantine)] == [QuarantineKind.CLUSTER]


# --------------------------------------------------------------------------- one node, within a cap


def test_hostlists_expand_like_scontrol_show_hostnames():
    assert expand("gpu[01-03,07],cpu1") == ("gpu01", "gpu02", "gpu03", "gpu07", "cpu1")
    assert expand("r[1-2]n[1-2]") == ("r1n1", "r1n2", "r2n1", "r2n2")
    assert expand("") == ()
    for bad in ("gpu[01-03", "gpu01]", "gpu[3-1]", "gpu[a-b]", "n[0-99999]"):
        with pytest.raises(HostlistError):
            expand(bad)


def test_the_blamed_node_is_the_only_one_or_the_one_its_log_names():
    assert blamed_node("gpu042") == "gpu042"
    assert blamed_node("gpu[01-16]") is None, "a whole NodeList is not a bad node"
    assert blamed_node("gpu[01-16]", "gpu07: NCCL WARN Call to recv failed") == "gpu07"
    assert blamed_node("gpu[01-16]", "gpu017 gpu07x") is None, "names inside other words do not count"
    assert blamed_node("gpu[01-16]", "gpu01 and gpu02 failed") is None


NCCL_AT_START = RUNNING_LINES["nccl-timeout"]


def test_a_multi_node_failure_that_names_no_node_is_refired_without_a_quarantine():
    [decided] = plan(RUN, [C], [failed(ended_min=30, log=NCCL_AT_START, nodes="gpu[01-16]")], POLICY, NOW).cells

    assert kinds(decided) == ["submit"]
    (submit,) = decided.actions
    assert isinstance(submit, Submit) and submit.exclude_nodes == ()


def test_a_single_node_failure_quarantines_that_node_and_the_refire_excludes_it():
    [decided] = plan(RUN, [C], [failed(ended_min=30, log=NCCL_AT_START, nodes="gpu07")], POLICY, NOW).cells

    quarantine, submit = decided.actions
    assert isinstance(quarantine, Quarantine) and quarantine.name == "gpu07" and quarantine.owner == str(RUN)
    assert isinstance(submit, Submit) and submit.exclude_nodes == ("gpu07",)


def node(name: str) -> Quarantined:
    return Quarantined(kind=QuarantineKind.NODE, scope="hpc", name=name, reason="nccl", until=NOW + timedelta(hours=1))


def test_past_max_quarantined_nodes_the_refire_goes_without_a_new_quarantine():
    policy = POLICY.model_copy(update={"health": POLICY.health.model_copy(update={"max_quarantined_nodes": 2})})
    live = (node("gpu01"), node("gpu02"))

    [decided] = plan(RUN, [C], [failed(ended_min=30, log=NCCL_AT_START, nodes="gpu07")], policy, NOW,
                     quarantined=live).cells

    assert kinds(decided) == ["submit"] and "gpu07 not quarantined: 2 already" in decided.reason
    assert decided.actions[0].exclude_nodes == ("gpu01", "gpu02")  # type: ignore[union-attr]


def test_the_last_usable_node_is_never_quarantined():
    [decided] = plan(RUN, [C], [failed(ended_min=30, log=NCCL_AT_START, nodes="gpu07")], POLICY, NOW,
                     quarantined=(node("gpu01"),), usable_nodes=frozenset({"gpu01", "gpu07"})).cells

    assert kinds(decided) == ["submit"] and "last usable node" in decided.reason


def test_with_every_usable_node_quarantined_launches_are_held_saying_so():
    [decided] = plan(RUN, [C], [obs()], POLICY, NOW, quarantined=(node("gpu01"), node("gpu02")),
                     usable_nodes=frozenset({"gpu01", "gpu02"})).cells

    (hold,) = decided.actions
    assert isinstance(hold, Hold) and "every usable node of hpc is quarantined" in hold.reason
    assert "evalctl nodes release" in hold.reason
    assert hold.release == "evalctl nodes release NODE --cluster hpc", "status adds the store it is in"


# --------------------------------------------------------------------------- overlong from accounting


def test_overlong_without_started_at_is_decided_by_the_jobs_accounting():
    run = facts(TAG, total=10, completed=10).model_copy(update={"started_at": None, "finished_at": None,
                                                                "last_progress_at": None})
    over = job(TAG, JobState.COMPLETED, started=ago(hours=30), ended=ago(hours=2))
    policy = POLICY  # the cell's walltime, 24 h (tests/core/builders.cell), is the default overlong limit

    decided = plan_cell(C, obs(subs=(sub(C),), rows=(row("Started", job_name=TAG),), jobs=(over,), dirs=(run,)),
                        policy, NOW)

    (upload,) = [a for a in decided.actions if a.kind.value == "upload"]
    assert upload.is_overlong and "by the scheduler's accounting" in upload.reason  # type: ignore[union-attr]
    assert not [a for a in decided.actions if isinstance(a, Wait)]


# --------------------------------------------------------------------------- effects a person can see


def test_the_plan_lists_each_effect_in_force_with_its_cause_start_end_and_owner():
    [node_q] = [node("gpu01")]
    the_plan = plan(RUN, [C], [failed(ended_min=1)], POLICY, NOW, quarantined=(node_q,))

    by_kind = {e.kind: e for e in the_plan.effects}
    assert set(by_kind) == {"node", "back-off", "refire"}
    back_off, refire = by_kind["back-off"], by_kind["refire"]
    assert (back_off.subject, back_off.since, back_off.until, back_off.owner) == (
        "hpc", NOW, NOW + timedelta(minutes=9), str(RUN))
    assert "hf-hub-rate-limit" in back_off.cause
    assert (refire.subject, refire.until, refire.owner) == (C.label, NOW + timedelta(minutes=9), str(RUN))
    assert by_kind["node"].subject == "gpu01" and "until 2026-11-29 13:00 UTC" in by_kind["node"].line()
