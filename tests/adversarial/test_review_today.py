"""Review of the gate-2 weights (a task weighs at most nAttempts), the unverified-upload path and MLflow retries
on Finished rows: every surface must say one thing of one run, and a row that did not read back as written is
never shown as the cell's score."""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path

from controller.adapters.store.sqlite import SqliteStore
from controller.core.actions import Track, Upload
from controller.core.admission import Admitted, admit
from controller.core.audit import audit_cells
from controller.core.metrics import admitted_metrics
from controller.core.observed import JobState, Metric, RunDirFacts
from controller.core.planner import plan_cell
from controller.core.remedies import CellMemory
from controller.core.vocabulary import Phase
from tests.adversarial.test_upload_path import NOT_AS_WRITTEN, actor, finished_run, one_pass
from tests.core.builders import NOW, POLICY, ago, cell, facts, job, obs, row, sub

C = cell(tasks=10)
TAG = C.run_tag(1)
PARTIAL = POLICY.model_copy(update={"admission": POLICY.admission.model_copy(update={"partial_upload": True}),
                                    "max_total_fires": 1})


def incomplete_run() -> RunDirFacts:
    """8 of 10 tasks have a result and no fire is left: what upload.partial: upload publishes flagged partial."""
    return facts(TAG, total=10, completed=8)


def test_an_unverified_partial_upload_is_uploaded_again_not_shown_as_the_score() -> None:
    """SCORES.md: "the next pass does not take the Finished row for done (nor show its numbers as the cell's
    score), it uploads again and reads back". Our partial upload of an incomplete run at its fire limit read back
    as 0.9 (another writer, a rounding store): the next pass must keep the cell Evaluated and upload again."""
    dir_ = incomplete_run()
    landed = (Metric(name="accuracy", value=0.9), Metric(name="accuracy_stderr", value=0.01),
              Metric(name="n_valid_trials", value=8.0))
    seen = obs(subs=(sub(C),), rows=(row("Finished", job_name=TAG, metrics=landed),),
               jobs=(job(TAG, JobState.COMPLETED, started=ago(hours=5), ended=ago(hours=2)),), dirs=(dir_,))
    seen = seen.model_copy(update={"memory": CellMemory(db_unverified=TAG)})

    decided = plan_cell(C, seen, PARTIAL, NOW)

    assert decided.score != 0.9, f"{decided.phase}: {decided.reason}: the unverified 0.9 is shown as the score"
    assert decided.phase == Phase.EVALUATED and any(isinstance(a, Upload) for a in decided.actions), decided.reason


TRACKING = POLICY.model_copy(update={"track": True})
ROW_TEN = (Metric(name="accuracy", value=0.5), Metric(name="accuracy_stderr", value=0.1),
           Metric(name="n_valid_trials", value=20.0))


def with_late_duplicates() -> RunDirFacts:
    """10 tasks, one attempt each; task t0 also has 10 late passing results of a killed fire's sandboxes. Gate 1
    published 10/20 = 0.5 (n=20); gate 2 gives t0 its mean at weight 1: (10/11)/10 (n=10)."""
    tasks = {"t0": (11, 11, 10.0)} | {f"t{i}": (1, 1, 0.0) for i in range(1, 10)}
    return facts(TAG, total=10, completed=20).model_copy(update={
        "tasks": tasks, "n_scored": 20, "n_graded": 20, "reward_sum": 10.0, "n_answered": 20,
        "n_usage_reported": 20})


def test_a_finished_row_not_logged_to_mlflow_shows_its_own_count_beside_its_own_score() -> None:
    """A Finished row of ours from gate 1 (0.5, n_valid_trials 20) whose MLflow run never read back: gate 2 gives
    the dir another number, so the row is not rewritten and the cell is Completed with the row's score. Its n and
    provisional flag must be the row's too: `status` must not print the row's 0.5 with gate 2's n=10."""
    seen = obs(subs=(sub(C),), rows=(row("Finished", job_name=TAG, metrics=ROW_TEN),),
               jobs=(job(TAG, JobState.COMPLETED, started=ago(hours=5), ended=ago(hours=2)),),
               dirs=(with_late_duplicates(),))

    decided = plan_cell(C, seen, TRACKING, NOW)

    assert decided.phase == Phase.COMPLETED and decided.score == 0.5, decided.reason
    assert decided.n_scored == 20, f"score {decided.score} shown with n={decided.n_scored}: {decided.evidence}"


def test_db_audit_does_not_call_a_row_ok_whose_number_the_gate_no_longer_gives() -> None:
    """DECISIONS "Audit marks": the marks say which stored numbers the gate would not publish today, and gate 2
    exists because late duplicates moved 0.1 to 0.55. A row holding gate 1's 0.5 for a dir gate 2 scores 0.09
    is exactly such a number: the audit must list it, not mark it ok."""
    seen = obs(rows=(row("Finished", job_name=TAG, metrics=ROW_TEN),), dirs=(with_late_duplicates(),))
    gate2 = admit(C, with_late_duplicates(), POLICY.admission)
    assert round(gate2.score, 4) == 0.0909  # type: ignore[union-attr]

    trusting = POLICY.admission.model_copy(update={"trust_threshold": 5})  # n=10 is not provisional

    report = audit_cells([C], [seen], trusting, timedelta(seconds=30))

    [judged] = report.audited
    assert judged.finding, f"{judged.verdict}: row accuracy {judged.accuracy}, gate {judged.evidence}"


# 5 tasks × 3 attempts of partial credit, in trial order: gate 1 summed the rewards trial by trial.
PARTIAL_CREDIT = {"t0": (0.5, 0.25, 1.0), "t1": (0.25, 0.1, 0.1), "t2": (0.1, 2 / 3, 0.75), "t3": (0.25, 0.1, 0.0),
                  "t4": (2 / 3, 2 / 3, 0.0)}


def gate1_row(rewards: Mapping[str, tuple[float, ...]]) -> tuple[Metric, ...]:
    """What gate 1 uploaded for a run without duplicates: Σ rewards / scored, the CR1 stderr over raw task sums."""
    total, sums = 0.0, []
    for task in rewards.values():
        task_sum = 0.0
        for reward in task:
            task_sum += reward
            total += reward
        sums.append((len(task), task_sum))
    n = sum(count for count, _ in sums)
    mean = sum(s for _, s in sums) / n
    spread = sum((s - count * mean) ** 2 for count, s in sums)
    stderr = (len(sums) / (len(sums) - 1) * spread / (n * n)) ** 0.5
    return (Metric(name="accuracy", value=total / n), Metric(name="accuracy_stderr", value=stderr),
            Metric(name="n_valid_trials", value=float(n)))


def test_a_gate_1_row_without_duplicates_is_still_logged_to_mlflow() -> None:
    """DECISIONS gate 2: "equal to the old formula when there are no duplicates". A partial-credit run with no
    duplicate, uploaded and verified by gate 1, whose MLflow run never read back: its row holds what gate 2 gives
    (0.36, the same number summed in another order), so the retry must log it (Track), not leave the run out of
    MLflow saying "its run dir now gives 0.3600 where its row holds 0.36"."""
    c3 = cell(tasks=5, n_attempts=3, partial_credit=True)
    tag = c3.run_tag(1)
    tasks = {name: (3, 3, sum(rewards)) for name, rewards in PARTIAL_CREDIT.items()}
    total = 0.0
    for rewards in PARTIAL_CREDIT.values():
        for reward in rewards:
            total += reward
    dir_ = facts(tag, total=15, completed=15).model_copy(update={
        "tasks": tasks, "n_scored": 15, "n_graded": 15, "reward_sum": total, "n_fractional": 12})
    seen = obs(subs=(sub(c3),), rows=(row("Finished", job_name=tag, metrics=gate1_row(PARTIAL_CREDIT)),),
               jobs=(job(tag, JobState.COMPLETED, started=ago(hours=5), ended=ago(hours=2)),), dirs=(dir_,))

    decided = plan_cell(c3, seen, TRACKING, NOW)

    assert [a.kind.value for a in decided.actions] == ["analyze", "track"], decided.reason


def test_a_partial_upload_whose_mlflow_run_did_not_read_back_is_logged_again() -> None:
    """SCORES.md "Reaching MLflow never rewrites the row": a Finished row whose MLflow run has not read back is
    logged to MLflow alone, when its run dir still gives the row's numbers. Our partial upload of an incomplete
    run at its fire limit read back in the DB; MLflow was down. The next pass must log it (Track), not hold the
    cell Failed with the run missing from MLflow for good."""
    dir_ = incomplete_run()
    gate = admit(C, dir_, PARTIAL.admission)
    assert isinstance(gate, Admitted) and gate.partial
    seen = obs(subs=(sub(C),), rows=(row("Finished", job_name=TAG, metrics=admitted_metrics(gate)),),
               jobs=(job(TAG, JobState.COMPLETED, started=ago(hours=5), ended=ago(hours=2)),), dirs=(dir_,))
    seen = seen.model_copy(update={"memory": CellMemory(track_error="MLflow at http://mlflow: connection refused")})

    decided = plan_cell(C, seen, PARTIAL.model_copy(update={"track": True}), NOW)

    assert any(isinstance(a, Track) for a in decided.actions), f"{decided.phase}: {decided.reason}"


def test_a_store_that_always_rounds_is_not_rewritten_every_pass(tmp_path: Path) -> None:
    """A results DB that rounds every metric it stores (a numeric column of scale 2) can never read back what the
    gate computed. Each pass then uploads again, rewrites the Finished row with the same numbers and finds them
    rounded again: the cell never settles and the shared row is written once a pass, for ever. By the third pass
    the same read-back failure must have settled into something a human can act on, without another write."""
    facts = finished_run(tmp_path / "jobs", passed=1, n=3)  # 1/3: no two decimals hold it
    store = SqliteStore(tmp_path / "store.db")
    try:
        with sqlite3.connect(tmp_path / "store.db") as conn:
            store.read_results(None, None)
            conn.execute(f"""CREATE TRIGGER rounding AFTER UPDATE OF metrics ON sandbox_jobs
                             WHEN NEW.metrics <> {NOT_AS_WRITTEN['rounded-by-the-store']}
                             BEGIN UPDATE sandbox_jobs SET metrics = {NOT_AS_WRITTEN['rounded-by-the-store']}
                             WHERE id = NEW.id; END""")
            conn.execute("CREATE TABLE writes (n INTEGER)")
            conn.execute("""CREATE TRIGGER count_writes AFTER UPDATE OF stats ON sandbox_jobs
                            BEGIN INSERT INTO writes VALUES (1); END""")
        the_actor = actor(store, tmp_path)
        decided = [one_pass(store, the_actor, facts) for _ in range(3)]
        with sqlite3.connect(tmp_path / "store.db") as conn:
            [[writes]] = conn.execute("SELECT count(*) FROM writes").fetchall()
    finally:
        store.close()

    assert not any(isinstance(a, Upload) for a in decided[2].actions), \
        f"pass 3 uploads again ({writes} writes so far): {decided[2].reason}"


def test_an_upload_that_never_reads_back_is_held_for_a_human_and_a_retry_releases_it() -> None:
    """After a second upload that did not read back the cell holds: Failed, so `status` lists it with its release
    command, and `evalctl retry` starts a new attempt (a row of its own) instead of answering "nothing to retry"."""
    from controller.core.actions import Hold, Submit
    from controller.core.retry import RetryRequest

    dir_ = facts(TAG, total=10, completed=10)
    landed = (Metric(name="accuracy", value=0.9), Metric(name="accuracy_stderr", value=0.01),
              Metric(name="n_valid_trials", value=10.0))
    seen = obs(subs=(sub(C),), rows=(row("Finished", job_name=TAG, metrics=landed),),
               jobs=(job(TAG, JobState.COMPLETED, started=ago(hours=5), ended=ago(hours=2)),), dirs=(dir_,))
    seen = seen.model_copy(update={"memory": CellMemory(db_unverified=TAG, db_unverified_uploads=2)})

    held = plan_cell(C, seen, POLICY, NOW)
    assert held.phase == Phase.FAILED and held.held and "`evalctl retry`" in held.reason, held.reason
    assert [type(a) for a in held.actions] == [Hold]

    request = RetryRequest(id="r1", cell_key=C.key, evalrun=C.evalrun, requested_by="alice", requested_at=NOW)
    released = plan_cell(C, seen.model_copy(update={"retries": (request,)}), POLICY, NOW)
    assert [a.attempt for a in released.actions if isinstance(a, Submit)] == [2], released.reason
