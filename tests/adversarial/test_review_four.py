"""Fourth review: what a score is published or verified with besides the trials the gate counts — a run of a subset
of the dataset, a reward Harbor wrote under another key, a results row holding two accuracies, the audit's verdicts
and the step statistics MLflow gets. Each test fails while its hole is open."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from controller.adapters.rundirs.post_eval import step_stats
from controller.adapters.store.codec import already_uploaded
from controller.core.actions import Track
from controller.core.admission import Admitted, admit
from controller.core.audit import audit_cells
from controller.core.metrics import admitted_metrics, run_metrics
from controller.core.observed import JobState, Metric
from controller.core.planner import plan_cell
from controller.core.records import AuditVerdict
from tests.adversarial.test_admission_gaps import PLAIN, decided, genuine, job_files, trial
from tests.core.builders import NOW, POLICY, ago, cell, facts, job, obs, row, sub
from tests.fixtures.harbor_dirs import REFERENCE_ERRORS, write_trial

INSTANT = timedelta(seconds=10)
C = cell(tasks=20)
TAG = C.run_tag(1)
TRACKING = POLICY.model_copy(update={"track": True})


def complete_run() -> Admitted:
    verdict = admit(C, facts(TAG, total=20, completed=20), POLICY.admission)
    assert isinstance(verdict, Admitted), verdict.summary()
    return verdict


def with_an_older_accuracy(gate: Admitted, older: float = 0.9) -> tuple[Metric, ...]:
    """A row of ours whose metrics list holds another tool's accuracy first, then exactly what the gate gives."""
    return (Metric(name="accuracy", value=older), *admitted_metrics(gate))


# --------------------------------------------------------------------------- a run of part of the dataset


def subset_in_config(run: Path) -> None:
    config = json.loads((run / "config.json").read_text())
    config["datasets"][0]["task_names"] = [f"t{i:03d}" for i in range(5)]
    (run / "config.json").write_text(json.dumps(config))


def shard_in_meta(run: Path) -> None:
    with (run / "meta.env").open("a") as meta:
        meta.write("SHARD=1/4\n")


SUBSETS = {"config-task-names": subset_in_config, "meta-env-shard": shard_in_meta}


@pytest.mark.parametrize("restrict", SUBSETS.values(), ids=SUBSETS.keys())
def test_a_run_of_a_subset_of_the_dataset_is_not_published_as_the_benchmark(tmp_path: Path, restrict: Any) -> None:
    """DECISIONS "The shard contract": Harbor writes an `--include-task-name` subset into config.json as the dataset's
    `task_names`, meta.env records `SHARD`, and "where the preset does not say how many tasks there are, Harbor's
    total of that subset would read as complete". Neither file is read: a 5-task run of a dataset the catalog does
    not count is complete by Harbor's total (5) and is published as the benchmark's score."""
    def build(run: Path) -> None:
        genuine(run, 5, passed=5)
        job_files(run, 5)
        restrict(run)

    plan, uploads = decided(tmp_path, PLAIN, build)
    assert uploads == [], f"published a 5-task subset as {PLAIN.dataset}: {plan.reason}"


# --------------------------------------------------------------------------- rewards under another key


def reward_beside_rewards(doc: dict[str, Any]) -> None:
    """The verifier's score as the older result format wrote it, `verifier_result.reward`, not under `rewards`."""
    doc["verifier_result"] = {"reward": 0.0}


def test_a_reward_written_under_another_key_holds_the_cell_not_drops_the_trial(tmp_path: Path) -> None:
    """RULES §14: "A reward ... under another key holds the cell and names the file." A trial whose verifier
    wrote `verifier_result.reward` (no `rewards`) is read as Ungraded (infra) and left out: one such 0 among 20 is
    5% infra, under the 10% share, and the run is published at 10/19 instead of being held."""
    def build(run: Path) -> None:
        genuine(run, 19, passed=10)
        trial(run, "t019", reward=1.0, edit=reward_beside_rewards)
        job_files(run, 20)

    plan, uploads = decided(tmp_path, PLAIN, build)
    assert uploads == [], f"dropped a graded 0 as ungraded and published: {plan.reason}"


# --------------------------------------------------------------------------- rows with two accuracies


def test_a_row_holding_two_accuracies_is_not_shown_with_one_and_logged_with_the_other() -> None:
    """Our Finished row (another tool under our username left an accuracy first) holds 0.9, then the gate's 0.5.
    `metric()` reads the first (the cell shows 0.9), `holds_the_gates_numbers` the last (it matches the gate): the
    cell is Completed at 0.9 in status while MLflow gets 0.5 as this run's score."""
    gate = complete_run()
    seen = obs(subs=(sub(C),), rows=(row("Finished", job_name=TAG, metrics=with_an_older_accuracy(gate)),),
               jobs=(job(TAG, JobState.COMPLETED, started=ago(hours=5), ended=ago(hours=2)),),
               dirs=(facts(TAG, total=20, completed=20),))

    decided_plan = plan_cell(C, seen, TRACKING, NOW)

    tracked = [a.admitted.score for a in decided_plan.actions if isinstance(a, Track)]
    assert not tracked or tracked == [decided_plan.score], \
        f"status shows {decided_plan.score}, MLflow gets {tracked}: {decided_plan.reason}"


def test_db_audit_does_not_mark_ok_a_row_whose_shown_accuracy_the_gate_does_not_give() -> None:
    """The audit lists the row's accuracy as the first one (0.9) and checks the last one (0.5) against the gate:
    the row is marked `ok` for leaderboards while the number it shows is one the gate does not give."""
    gate = complete_run()
    seen = obs(rows=(row("Finished", job_name=TAG, metrics=with_an_older_accuracy(gate)),),
               dirs=(facts(TAG, total=20, completed=20),))

    [judged] = audit_cells([C], [seen], POLICY.admission.model_copy(update={"trust_threshold": 10}), INSTANT).audited

    assert judged.finding, f"{judged.verdict}: row shows accuracy {judged.accuracy}, the gate gives {gate.score}"


def test_an_upload_is_not_taken_as_already_there_when_the_row_also_holds_another_accuracy() -> None:
    """`already_uploaded` (the exactly-once test) and the read-back compare the metrics as a dict: a stored list
    [accuracy 0.9, accuracy 0.5, stderr, n] equals what we write, so the row is not rewritten and reads back as
    verified while its first accuracy, the one `status` and the audit show, is 0.9."""
    gate = complete_run()
    upload = run_metrics(gate, facts(TAG, total=20, completed=20), REFERENCE_ERRORS).upload(NOW, is_overlong=False,
                                                                                             env="lab")
    stored = json.dumps([{"name": m.name, "value": m.value} for m in with_an_older_accuracy(gate)])

    assert not already_uploaded("Finished", stored, False, upload), "a row showing 0.9 taken for our 0.5 upload"


# --------------------------------------------------------------------------- db audit verdicts


def test_db_audit_does_not_call_a_partial_run_ok() -> None:
    """Under `upload.partial: upload` the gate admits an incomplete run only flagged partial. The audit says `ok`
    (no finding, no reason) of a row holding that number for a run that is 18 of 20 trials, e.g. one an older tool
    wrote without the flag: a leaderboard filtering by the marks takes it for a whole run."""
    partial = POLICY.admission.model_copy(update={"partial_upload": True, "trust_threshold": 10})
    short = facts(TAG, total=20, completed=18)
    gate = admit(C, short, partial, can_resume=False)
    assert isinstance(gate, Admitted) and gate.partial, gate.summary()
    seen = obs(rows=(row("Finished", job_name=TAG, metrics=admitted_metrics(gate)),), dirs=(short,))

    [judged] = audit_cells([C], [seen], partial, INSTANT).audited

    assert judged.finding or "partial" in judged.reason, f"{judged.verdict} {judged.reason!r}: {judged.evidence}"


def test_db_audit_does_not_refuse_a_correct_row_for_want_of_the_jobs_output() -> None:
    """A harness whose trials report no token usage is judged by the vLLM requests in its job's output; the planner
    read them and published. The audit never has them (requests=None) and refuses every such row as a dead launch
    (NoModelTraffic), marking correct numbers as refused."""
    run = facts(TAG, total=20, completed=20).model_copy(update={"n_answered": 0, "n_usage_reported": 0})
    gate = admit(C, run, POLICY.admission, requests=500)
    assert isinstance(gate, Admitted), gate.summary()
    seen = obs(rows=(row("Finished", job_name=TAG, metrics=admitted_metrics(gate)),), dirs=(run,))

    [judged] = audit_cells([C], [seen], POLICY.admission.model_copy(update={"trust_threshold": 10}), INSTANT).audited

    assert judged.verdict != AuditVerdict.REFUSED, f"{judged.refusal}: {judged.reason}"


# --------------------------------------------------------------------------- what MLflow gets besides the score


def test_step_statistics_describe_the_trials_that_completed_not_every_trial_dir(tmp_path: Path) -> None:
    """MLflow's steps_* and tokens_* come from every trial dir's trajectory: trials killed mid-run (no result.json)
    and cancelled ones are averaged in with the ten the score counts, so 'steps per trial' describes trials that
    are not the admitted run's."""
    for i in range(10):
        write_trial(tmp_path, f"t{i:03d}__0000000", reward=1.0, output_tokens=300, steps=5)
    for i in range(10):
        write_trial(tmp_path, f"t{i:03d}__killed0", result=False, steps=200)

    stats = step_stats(tmp_path, REFERENCE_ERRORS)

    assert stats is not None and stats.n_trajectories <= 10 and stats.max == 5, \
        f"steps over {stats and stats.n_trajectories} trajectories, max {stats and stats.max}"


# --------------------------------------------------------------------------- forceEval and another EvalRun's attempt


def test_force_eval_does_not_take_another_evalruns_finished_row_for_its_own() -> None:
    """RULES §2: "forceEval ignores every row and run dir the EvalRun did not create". The view keeps the rows of
    every submission of the cell, whichever EvalRun made it: a Finished row that EvalRun `old` wrote for the same
    cell (the claim was handed over) counts as this EvalRun's own, and the forced cell is Completed with `old`'s
    number instead of being evaluated again."""
    from controller.core.types import EvalRunRef

    theirs = sub(C, row_id="old-row").model_copy(update={"evalrun": EvalRunRef(name="old")})
    old_row = row("Finished", metrics=admitted_metrics(complete_run()), job_name=TAG, row_id="old-row",
                  created=ago(days=3))
    forced = POLICY.model_copy(update={"force_eval": True})

    decided_plan = plan_cell(C, obs(rows=(old_row,), subs=(theirs,)), forced, NOW)

    assert [a.kind.value for a in decided_plan.actions] == ["submit"], \
        f"{decided_plan.phase} {decided_plan.score}: {decided_plan.reason}"


# --------------------------------------------------------------------------- a verified row changed afterwards


def test_a_row_changed_after_our_verified_upload_is_not_shown_with_our_evidence() -> None:
    """Our upload of 0.5 (n=20, partial) read back and was recorded; another writer later set the row to 0.9
    (n=267). The Completed cell shows the row's 0.9 with the record's n=20, `partial` and "admitted: …" evidence,
    which describe the 0.5: a number the gate never admitted, shown with the gate's word for another one."""
    from controller.core.admission import admission_record
    from controller.core.remedies import CellMemory

    gate = complete_run().model_copy(update={"partial": True, "partial_why": "18 of 20"})
    changed = (Metric(name="accuracy", value=0.9), Metric(name="accuracy_stderr", value=0.01),
               Metric(name="n_valid_trials", value=267.0))
    seen = obs(subs=(sub(C),), rows=(row("Finished", job_name=TAG, metrics=changed),),
               jobs=(job(TAG, JobState.COMPLETED, started=ago(hours=5), ended=ago(hours=2)),),
               dirs=(facts(TAG, total=20, completed=20),))
    seen = seen.model_copy(update={"memory": CellMemory(admitted=admission_record(TAG, gate))})

    decided_plan = plan_cell(C, seen, POLICY, NOW)

    assert decided_plan.score == 0.9  # the row is history: shown as it is
    assert (decided_plan.n_scored, decided_plan.partial) != (20, True), \
        f"0.9 shown as n={decided_plan.n_scored}, partial={decided_plan.partial}: {decided_plan.evidence}"


# --------------------------------------------------------------------------- error buckets


def test_the_rows_infra_breakdown_holds_every_infra_trial_it_counts(tmp_path: Path) -> None:
    """A `BadRequestError` that no traceback ties to litellm is infra (RULES §3: a sandbox SDK's class of that name),
    and is counted in `n_infra_errors`. `infra_breakdown` leaves out every class whose bare name a model-failure
    class has, so the row's `infra_error_breakdown` does not show those 2 trials (and the post-eval report labels
    them benign): the buckets describe other trials than the ones the gate left out."""
    from controller.adapters.rundirs.harbor import HarborRunDirs

    run = tmp_path / TAG
    for i in range(18):
        write_trial(run, f"t{i:03d}__0000000", reward=float(i % 2), output_tokens=300)
    for i in range(18, 20):
        write_trial(run, f"t{i:03d}__0000000", exception="BadRequestError", output_tokens=300)
    (read,) = HarborRunDirs(str(tmp_path), REFERENCE_ERRORS).observe()
    gate = admit(C, read, POLICY.admission)
    assert isinstance(gate, Admitted) and read.n_infra_errors == 2, gate.summary()

    stats = run_metrics(gate, read, REFERENCE_ERRORS).stats

    assert sum(stats.infra_error_breakdown.values()) == stats.n_infra_errors, stats.infra_error_breakdown


# --------------------------------------------------------------------------- a row of fewer attempts


def test_a_cell_of_three_attempts_is_not_completed_by_a_one_attempt_row() -> None:
    """Our own Finished row of the same model and benchmark from a spec with nAttempts 1 (its config is what
    `row_config` writes: same agent and multiplier, another fingerprint; the row's n_rep_eval 1 is not even read)
    matches the nAttempts 3 cell, which is Completed with the 1-attempt score — the number RULES §14 refuses to
    publish for it from a run dir ("a run of one attempt per task is not a complete run of the cell")."""
    from controller.core.actor import row_config
    from controller.core.match import join_cells
    from controller.core.records import NamedRow, SandboxJobRow, StoreSnapshot

    one = cell(tasks=20, n_attempts=1, fingerprint="1111111111111111")
    three = cell(tasks=20, n_attempts=3, fingerprint="3333333333333333")
    metrics = admitted_metrics(complete_run())
    stored = SandboxJobRow(id="r1", job_name=one.run_tag(1), username="alice", job_status="Finished",
                           created_at=ago(days=2), metrics=metrics, model_id="m", benchmark_id="b",
                           config=row_config(one, one.run_tag(1)))
    snapshot = StoreSnapshot(models=(NamedRow(id="m", name=three.model),),
                             benchmarks=(NamedRow(id="b", name=three.benchmark_name),), rows=(stored,), submissions=())
    [seen] = join_cells([three], snapshot, (), ())

    decided_plan = plan_cell(three, seen, POLICY, NOW)

    assert decided_plan.score is None, f"{decided_plan.phase} {decided_plan.score}: {decided_plan.reason}"
