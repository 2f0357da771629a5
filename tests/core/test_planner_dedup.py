"""RULES §2, one test row per table row: the newest matching row decides."""

from __future__ import annotations

import pytest

from controller.core.actions import Resume, Submit
from controller.core.dedup import DEDUP_TABLE
from controller.core.planner import plan_cell
from controller.core.types import EvalRunRef
from controller.core.vocabulary import Phase, Rule
from tests.core.builders import NOW, POLICY, SCORED, ago, cell, facts, obs, row

C = cell()
BOB = "bob"

# (name, row, expected phase, expected action kinds, reason fragment). Rows of another user: their job
# is invisible to us, so the §2 thresholds alone decide.
DEDUP_ROWS = [
    ("no row", None, Phase.PENDING, ["submit"], "no existing job"),
    ("finished with metrics", row("Finished", user=BOB, metrics=SCORED), Phase.COMPLETED, ["skip"], "job finished"),
    ("finished, metrics null", row("Finished", user=BOB, metrics=None), Phase.PENDING, ["submit"],
     "finished but metrics cleared"),
    ("finished, metrics []", row("Finished", user=BOB, metrics=()), Phase.PENDING, ["submit"],
     "finished but metrics cleared"),
    ("started young", row("Started", user=BOB, started=ago(hours=23)), Phase.RUNNING, ["skip"], "job in progress"),
    ("started old", row("Started", user=BOB, started=ago(hours=25)), Phase.PENDING, ["submit"], "stale started"),
    ("started, started_at null", row("Started", user=BOB, started=None), Phase.PENDING, ["submit"], "stale started"),
    ("pending young", row("Pending", user=BOB, submitted=ago(hours=5)), Phase.SUBMITTED, ["skip"], "job pending"),
    ("pending old", row("Pending", user=BOB, submitted=ago(hours=7)), Phase.PENDING, ["submit"], "stale pending"),
    ("pending, submitted_at null", row("Pending", user=BOB, submitted=None), Phase.PENDING, ["submit"],
     "stale pending"),
    # The old listener measured Pending staleness from started_at (always null): not us.
    ("pending young, started_at null", row("Pending", user=BOB, submitted=ago(minutes=5), started=None),
     Phase.SUBMITTED, ["skip"], "job pending"),
    ("unreadable status", row("Failed", user=BOB), Phase.FAILED, ["hold"], "job_status 'Failed'"),
]


@pytest.mark.parametrize(("name", "the_row", "phase", "kinds", "reason"), DEDUP_ROWS, ids=[r[0] for r in DEDUP_ROWS])
def test_dedup_table_row(name, the_row, phase, kinds, reason):
    decided = plan_cell(C, obs(rows=(the_row,) if the_row else ()), POLICY, NOW)
    assert decided.phase == phase
    assert [a.kind.value for a in decided.actions] == kinds
    assert reason in decided.reason or any(reason in a.reason for a in decided.actions)
    assert decided.rule in {dedup.rule for dedup in DEDUP_TABLE.values()}
    assert decided.rule.citation.startswith("RULES §2")


def test_newest_matching_row_decides():
    old_finished = row("Finished", user=BOB, metrics=SCORED, created=ago(days=3), row_id="old")
    newer_cleared = row("Finished", user=BOB, metrics=None, created=ago(days=1), row_id="new")
    decided = plan_cell(C, obs(rows=(old_finished, newer_cleared)), POLICY, NOW)
    assert [a.kind.value for a in decided.actions] == ["submit"]
    assert "metrics cleared" in decided.reason


def test_stale_started_never_overrides_a_finished_row():
    finished = row("Finished", user=BOB, metrics=SCORED, started=ago(days=30))
    policy = POLICY.model_copy(update={"stale_started": ago(hours=0) - ago(minutes=1)})
    decided = plan_cell(C, obs(rows=(finished,)), policy, NOW)
    assert decided.phase == Phase.COMPLETED and [a.kind.value for a in decided.actions] == ["skip"]


def test_force_eval_adds_a_new_row_next_to_the_old_one():
    finished = row("Finished", user=BOB, metrics=SCORED, job_name="theirs")
    decided = plan_cell(C, obs(rows=(finished,)), POLICY.model_copy(update={"force_eval": True}), NOW)
    [submit] = decided.actions
    assert submit.kind.value == "submit"
    assert submit.row_id is None, "a new row is created; the old one is never edited"
    assert submit.run_tag == C.run_tag(1)


def test_force_eval_does_not_loop_once_its_own_row_finished():
    from tests.core.builders import sub

    mine = row("Finished", metrics=SCORED, job_name=C.run_tag(1), row_id="mine", created=ago(minutes=5))
    theirs = row("Finished", user=BOB, metrics=SCORED, row_id="theirs", created=ago(days=2))
    decided = plan_cell(C, obs(rows=(theirs, mine), subs=(sub(C, row_id="mine"),)),
                        POLICY.model_copy(update={"force_eval": True}), NOW)
    assert decided.phase == Phase.COMPLETED


def test_another_users_stale_pending_row_is_not_cancelled_by_us():
    decided = plan_cell(C, obs(rows=(row("Pending", user=BOB, submitted=ago(hours=8), slurm_job_id="77"),)),
                        POLICY, NOW)
    assert [a.kind.value for a in decided.actions] == ["submit"], "their job is not ours to cancel"


# Tenants on one ClusterEvalCluster share its username; their cells differ by namespace (so by run tag).
TENANT_A = cell(evalrun=EvalRunRef(name="demo", namespace="team-a"))
TENANT_B = cell(evalrun=EvalRunRef(name="demo", namespace="team-b"))


@pytest.mark.parametrize("status", ["Started", "Pending"])
def test_a_row_of_another_tenants_cell_is_their_evidence_never_ours_to_resume(status: str) -> None:
    theirs = row(status, job_name=TENANT_A.run_tag(1), started=ago(hours=1), submitted=ago(hours=1),
                 slurm_job_id="41")
    decided = plan_cell(TENANT_B, obs(rows=(theirs,)), POLICY, NOW)
    assert [a.kind.value for a in decided.actions] == ["skip"], decided
    assert decided.phase in (Phase.RUNNING, Phase.SUBMITTED)

    stale = theirs.model_copy(update={"started_at": ago(hours=25), "submitted_at": ago(hours=25)})
    [submit] = plan_cell(TENANT_B, obs(rows=(stale,)), POLICY, NOW).actions
    assert isinstance(submit, Submit) and submit.run_tag == TENANT_B.run_tag(1) and submit.row_id is None, \
        "once stale, a job of its own under its own tag and a row of its own: never theirs"


def test_the_tenants_own_row_is_still_resumed() -> None:
    ours = row("Started", job_name=TENANT_B.run_tag(1), started=ago(hours=1))
    decided = plan_cell(TENANT_B, obs(rows=(ours,), dirs=(facts(TENANT_B.run_tag(1), completed=4),)), POLICY, NOW)
    [resume] = decided.actions
    assert isinstance(resume, Resume) and resume.run_tag == TENANT_B.run_tag(1) and resume.row_id == ours.id


def test_a_row_of_the_old_listener_is_adopted_only_outside_a_namespace() -> None:
    legacy = row("Started", job_name="laion_Qwen3-8B-sft_terminal_bench_2_1712", started=ago(hours=1))
    assert [a.kind.value for a in plan_cell(TENANT_B, obs(rows=(legacy,)), POLICY, NOW).actions] == ["skip"], \
        "in the operator, two tenants could both adopt it"
    alone = plan_cell(C, obs(rows=(legacy,)), POLICY, NOW)
    assert "our Started row" in alone.reason, alone.reason


def test_an_unrecognised_job_status_is_held_naming_the_row_its_status_and_the_retry() -> None:
    decided = plan_cell(C, obs(rows=(row("Exploded", user=BOB, row_id="row-7"),)), POLICY, NOW)

    assert decided.rule == Rule.UNRECOGNISED_STATUS and decided.held
    assert "row row-7 has job_status 'Exploded'" in decided.reason
    assert "`evalctl retry` starts a new attempt" in decided.reason
    assert decided.hold_reason == decided.reason, "status shows the hold in the words that name its lever"
