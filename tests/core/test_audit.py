"""`core.audit`: the admission gate re-applied to rows already in the results DB, by the run dirs they name."""

from __future__ import annotations

from datetime import timedelta

from controller.core.admission import GATE_VERSION, GatePolicy, Refusal
from controller.core.audit import AuditReport, audit_cells, merge
from controller.core.observed import ErrorKind, Metric, QuietFailure
from controller.core.records import AuditVerdict, RowAuditMark
from tests.core.builders import POLICY, SCORED, cell, facts, obs, row

C = cell(tasks=None)
GATE = POLICY.admission.model_copy(update={"trust_threshold": 10})
INSTANT = timedelta(seconds=10)
METRICS = (Metric(name="accuracy", value=0.5),)  # what the gate gives the builders' dirs: half the trials solved


def finished(row_id: str, job_name: str | None, *, user: str = "bob") -> object:
    return row("Finished", user=user, metrics=METRICS, job_name=job_name, row_id=row_id)


def audit(*rows: object, dirs: tuple = (), run_dirs_unknown: bool = False, policy: GatePolicy = GATE) -> AuditReport:
    observed = obs(rows=rows, dirs=dirs)  # type: ignore[arg-type]
    if run_dirs_unknown:
        observed = observed.model_copy(update={"run_dirs": None, "unknown_reason": "jobs dir unmounted"})
    return audit_cells([C], [observed], policy, INSTANT)


def verdicts(report: AuditReport) -> dict[str, tuple[AuditVerdict, str | None]]:
    return {a.row_id: (a.verdict, a.refusal) for a in report.audited}


def test_a_complete_genuine_row_is_ok_and_not_a_finding() -> None:
    report = audit(finished("r1", "good"), dirs=(facts("good", total=20, completed=20),))

    [entry] = report.audited
    assert (entry.verdict, entry.n_scored, entry.accuracy, entry.username) == (AuditVerdict.OK, 20, 0.5, "bob")
    assert report.findings == () and report.new == () and report.not_auditable == ()


def test_each_planted_defect_is_refused_with_its_refusal() -> None:
    incomplete = facts("half", total=20, completed=10)
    other_model = facts("other", total=20, completed=20, model="org/Other-70B")
    bad_reward = facts("seven", total=20, completed=20).model_copy(update={"n_invalid": 1,
                                                                          "invalid": "t1/result.json: 7"})
    quiet = tuple(QuietFailure(exception_type="APIConnectionError", kind=ErrorKind.INFRA, agent_seconds=0.4,
                               task=f"task-{i:03d}") for i in range(19))
    dead = facts("dead", total=20, completed=20, infra=19).model_copy(update={
        "quiet_failures": quiet, "n_answered": 1, "error_breakdown": {"APIConnectionError": 19}})
    report = audit(finished("half", "half"), finished("other", "other"), finished("seven", "seven"),
                   finished("dead", "dead"), dirs=(incomplete, other_model, bad_reward, dead))

    assert verdicts(report) == {
        "half": (AuditVerdict.REFUSED, Refusal.INCOMPLETE.value),
        "other": (AuditVerdict.REFUSED, Refusal.IDENTITY.value),
        "seven": (AuditVerdict.REFUSED, Refusal.INVALID_REWARD.value),
        "dead": (AuditVerdict.REFUSED, Refusal.INFRA_SHARE.value),
    }
    assert "10 of 20 expected trials" in {a.row_id: a for a in report.audited}["half"].reason
    assert "resumes cannot complete it" in {a.row_id: a for a in report.audited}["half"].reason, "can_resume=False"
    assert len(report.new) == 4


def test_instant_failures_count_only_where_the_agent_calls_a_model() -> None:
    quiet = tuple(QuietFailure(exception_type=None, kind=None, agent_seconds=0.4, task=f"task-{i:03d}")
                  for i in range(5))
    dir_ = facts("quiet", total=20, completed=20).model_copy(update={"quiet_failures": quiet})

    calling = audit_cells([C], [obs(rows=(finished("q", "quiet"),), dirs=(dir_,))], GATE, INSTANT)
    oracle = audit_cells([C.model_copy(update={"calls_model": False})], [obs(rows=(finished("q", "quiet"),),
                                                                             dirs=(dir_,))], GATE, INSTANT)

    assert verdicts(calling)["q"] == (AuditVerdict.REFUSED, Refusal.INFRA_SHARE.value)
    assert verdicts(oracle)["q"] == (AuditVerdict.OK, None)


def test_a_row_whose_run_the_gate_admits_at_another_number_is_refused_naming_both() -> None:
    other = row("Finished", user="bob", metrics=(Metric(name="accuracy", value=0.7),), job_name="good", row_id="r1")
    report = audit(other, dirs=(facts("good", total=20, completed=20),))

    [entry] = report.findings
    assert (entry.verdict, entry.refusal) == (AuditVerdict.REFUSED, "ScoreDiffers")
    assert entry.reason == "the gate gives 0.5000 (n=20) where the row holds 0.7"


def test_a_small_complete_run_is_provisional_with_its_n_scored() -> None:
    report = audit(finished("r1", "small"), dirs=(facts("small", total=5, completed=5),))

    [entry] = report.findings
    assert (entry.verdict, entry.n_scored, entry.refusal) == (AuditVerdict.PROVISIONAL, 5, None)
    assert "fewer than report.trustThreshold 10" in entry.reason


def test_a_run_only_its_jobs_output_shows_answering_is_judged_on_every_other_check() -> None:
    """The vLLM requests are never read here: traffic is left unjudged and said so, the other checks still refuse."""
    silent = {"n_answered": 0, "n_usage_reported": 0}
    whole = facts("whole", total=20, completed=20).model_copy(update=silent)
    half = facts("half", total=20, completed=10).model_copy(update=silent)
    report = audit(finished("whole", "whole"), finished("half", "half"), dirs=(whole, half))

    assert verdicts(report) == {"whole": (AuditVerdict.OK, None),
                                "half": (AuditVerdict.REFUSED, Refusal.INCOMPLETE.value)}
    assert "traffic not judged" in {a.row_id: a for a in report.audited}["whole"].reason


def test_a_partial_run_is_its_own_finding_naming_why_before_its_small_count() -> None:
    partial = GATE.model_copy(update={"partial_upload": True})
    report = audit(finished("short", "short"), dirs=(facts("short", total=20, completed=18),), policy=partial)

    [entry] = report.findings
    assert (entry.verdict, entry.refusal) == (AuditVerdict.PARTIAL, None)
    assert entry.reason.startswith("partial: 18 of 20 expected trials"), entry.reason


def test_rows_without_a_readable_run_dir_are_not_auditable_never_findings() -> None:
    unreadable = facts("broken", total=20, completed=20).model_copy(update={"unreadable": "broken/t1: EIO"})
    report = audit(finished("gone", "nowhere"), finished("broken", "broken"), finished("nameless", None),
                   dirs=(unreadable,))
    unknown = audit(finished("r1", "good"), run_dirs_unknown=True)

    assert report.audited == () and unknown.audited == ()
    assert {u.row_id: u.why for u in report.not_auditable} == {
        "gone": "run dir nowhere is not among the cell's run dirs (moved, deleted, or another cluster's)",
        "broken": "run dir broken cannot be read: broken/t1: EIO",
        "nameless": "the row names no run dir (job_name is empty)"}
    assert [u.why for u in unknown.not_auditable] == ["run dirs not observed: jobs dir unmounted"]


def test_only_finished_rows_with_metrics_are_judged() -> None:
    dirs = (facts("half", total=20, completed=10),)
    report = audit(row("Started", job_name="half", row_id="running"),
                   row("Finished", job_name="half", row_id="no-metrics"),
                   row("Pending", job_name="half", metrics=SCORED, row_id="pending"), dirs=dirs)

    assert report.audited == () and report.not_auditable == ()


def test_a_row_already_marked_with_the_same_verdict_is_not_new() -> None:
    report = audit(finished("half", "half"), finished("small", "small"),
                   dirs=(facts("half", total=20, completed=10), facts("small", total=5, completed=5)))
    half = next(a for a in report.audited if a.row_id == "half")
    marks = {"half": half.mark(),
             "small": RowAuditMark(row_id="small", gate=GATE_VERSION, verdict=AuditVerdict.REFUSED,
                                   refusal="Incomplete", reason="an older verdict")}

    marked = report.with_marks(marks)
    older_gate = report.with_marks({"half": half.mark().model_copy(update={"gate": GATE_VERSION - 1})})

    assert [a.row_id for a in marked.already_marked] == ["half"]
    assert [a.row_id for a in marked.new] == ["small"], "another verdict since: a new finding"
    assert {a.row_id for a in older_gate.new} == {"half", "small"}, "a mark by an older gate is not this gate's"


def test_a_row_ok_today_under_an_older_refusal_is_marked_again_once() -> None:
    """An older gate refused the row (its mark is what a leaderboard filters on); today's gate admits it: `--apply`
    writes the ok, or the correct number stays hidden."""
    report = audit(finished("good", "good"), dirs=(facts("good", total=20, completed=20),))
    [good] = report.audited
    refused = RowAuditMark(row_id="good", gate=GATE_VERSION - 1, verdict=AuditVerdict.REFUSED,
                           refusal="NoModelTraffic", reason="an older verdict")

    stale = report.with_marks({"good": refused})
    settled = report.with_marks({"good": good.mark()})

    assert good.verdict == AuditVerdict.OK and report.findings == ()
    assert [a.row_id for a in stale.new] == ["good"] and stale.new[0].mark().verdict == AuditVerdict.OK
    assert settled.findings == () and settled.new == ()


def test_a_row_two_evalruns_share_is_judged_once_and_auditable_if_either_can() -> None:
    seen = audit(finished("r1", "good"), dirs=(facts("good", total=20, completed=20),))
    unseen = audit(finished("r1", "good"))
    only_unseen = audit(finished("r2", "gone"))

    merged = merge([unseen, seen, only_unseen])

    assert [a.row_id for a in merged.audited] == ["r1"]
    assert [u.row_id for u in merged.not_auditable] == ["r2"]
