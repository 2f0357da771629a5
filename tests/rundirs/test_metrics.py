"""What an admitted run uploads: accuracy over graded trials and the model's own failures, infra left out, a
stderr clustered by task, and the stats with the gate's evidence."""

from __future__ import annotations

import json
import math
import statistics
from datetime import UTC, datetime
from pathlib import Path

import pytest

from controller.adapters.rundirs.harbor import HarborRunDirs
from controller.core.admission import GATE_VERSION, Admitted, Refusal, Refused, clustered_stderr, task_weights
from controller.core.observed import RunDirFacts
from tests.core.builders import gate, metrics_of
from tests.fixtures.harbor_dirs import REFERENCE_ERRORS, write_trial


def facts_for(rewards: list[float], n_infra_errors: int = 0, per_task: int = 1) -> RunDirFacts:
    """Graded trials with these rewards, `per_task` attempts of each task, and infra ones of their own tasks."""
    tasks: dict[str, tuple[int, int, float]] = {}
    for i, reward in enumerate(rewards):
        seen, scored, total = tasks.get(f"t{i // per_task}", (0, 0, 0.0))
        tasks[f"t{i // per_task}"] = (seen + 1, scored + 1, total + reward)
    tasks |= {f"infra{i}": (1, 0, 0.0) for i in range(n_infra_errors)}
    return RunDirFacts(run_tag="r", path="/r", n_completed=len(rewards) + n_infra_errors, n_infra_errors=n_infra_errors,
                       n_graded=len(rewards), reward_sum=sum(rewards),
                       tasks=tasks, n_total=len(tasks) * per_task if per_task == 1 else None)


def test_the_model_s_failures_count_as_zero_and_every_other_exception_is_infra(tmp_path: Path) -> None:
    run = tmp_path / "r"
    write_trial(run, "a__aaaaaaa", reward=1.0)
    write_trial(run, "b__bbbbbbb", reward=1.0)
    write_trial(run, "c__ccccccc", reward=0.0, exception="AgentTimeoutError")  # graded timeout: the model's 0
    write_trial(run, "f__fffffff", exception="ContextLengthExceededError")  # the model's failure, no reward: a 0
    write_trial(run, "d__ddddddd", exception="RewardFileNotFoundError")  # unknown class: infra, not the model's 0
    write_trial(run, "e__eeeeeee", exception="DaytonaError")  # infra: not a valid trial
    for name in ("g__ggggggg", "h__hhhhhhh", "i__iiiiiii", "j__jjjjjjj", "k__kkkkkkk", "l__lllllll", "m__mmmmmmm",
                 "n__nnnnnnn", "o__ooooooo", "p__ppppppp", "q__qqqqqqq", "r__rrrrrrr", "s__sssssss", "t__ttttttt"):
        write_trial(run, name, reward=0.5 if name < "n" else 0.0)
    (facts,) = HarborRunDirs(str(tmp_path), REFERENCE_ERRORS).observe()
    result = metrics_of(facts, REFERENCE_ERRORS)
    values = {m.name: m.value for m in result.metrics}
    rewards = [1, 1, 0, 0] + [0.5] * 7 + [0.0] * 7
    assert values["accuracy"] == pytest.approx(statistics.fmean(rewards)) and result.score == values["accuracy"]
    assert values["n_valid_trials"] == 18
    assert values["accuracy_stderr"] == pytest.approx(statistics.stdev(rewards) / math.sqrt(18))
    assert result.stats.n_trials == 18 and result.stats.n_infra_errors == 2
    assert result.stats.infra_error_breakdown["DaytonaError"] == 1
    assert result.stats.infra_error_breakdown["RewardFileNotFoundError"] == 1, "unknown classes are infra"
    assert result.stats.n_errors_by_class["RewardFileNotFoundError"] == 1
    assert set(result.stats.n_errors_by_class) >= set(REFERENCE_ERRORS.known) | {"RewardFileNotFoundError"}
    assert result.stats.evidence["graded"] == 16 and result.stats.evidence["model_failures"] == 2


@pytest.mark.parametrize("rewards", [[0.0, 1.0, 1.0, 0.25, 0.5, 0.0, 1.0], [1.0] * 10, [0.3, 0.9]])
def test_with_one_attempt_per_task_the_stderr_is_the_textbook_one(rewards: list[float]) -> None:
    result = metrics_of(facts_for(rewards), REFERENCE_ERRORS)
    values = {m.name: m.value for m in result.metrics}
    assert values["accuracy"] == pytest.approx(statistics.fmean(rewards))
    assert values["accuracy_stderr"] == pytest.approx(statistics.stdev(rewards) / math.sqrt(len(rewards)), abs=1e-12)


def test_attempts_of_one_task_are_a_cluster_not_independent_trials() -> None:
    """3 attempts of 4 tasks that each pass all or nothing: the iid formula would claim √3 less uncertainty."""
    rewards = [1.0] * 3 + [0.0] * 3 + [1.0] * 3 + [0.0] * 3
    per_task = [1.0, 0.0, 1.0, 0.0]
    clustered = clustered_stderr(task_weights(facts_for(rewards, per_task=3).tasks.values(), 3))
    assert clustered == pytest.approx(statistics.stdev(per_task) / math.sqrt(4))
    assert clustered > statistics.stdev(rewards) / math.sqrt(12) * 1.5


def test_empty_dir_is_refused() -> None:
    verdict = gate(facts_for([]).model_copy(update={"n_total": 0}))
    assert isinstance(verdict, Refused) and verdict.refusal == Refusal.NOTHING_SCORED


def test_only_infra_errors_is_refused_for_its_infra_share() -> None:
    verdict = gate(facts_for([], n_infra_errors=3))
    assert isinstance(verdict, Refused) and verdict.refusal == Refusal.INFRA_SHARE and verdict.remedy == "hold"


def test_single_trial_has_score_but_no_stderr() -> None:
    values = {m.name: m.value for m in metrics_of(facts_for([1.0]), REFERENCE_ERRORS).metrics}
    assert (values["accuracy"], values["accuracy_stderr"]) == (1.0, None)


def test_upload_carries_a_list_and_the_stats_dict_with_the_evidence() -> None:
    ended = datetime(2026, 11, 29, tzinfo=UTC)
    upload = metrics_of(facts_for([1.0, 0.0]), REFERENCE_ERRORS).upload(ended_at=ended, is_overlong=True, env="lab")
    assert [m.name for m in upload.metrics] == ["accuracy", "accuracy_stderr", "n_valid_trials"]
    assert upload.n_trials == 2 and upload.ended_at == ended and upload.is_overlong
    assert set(upload.stats) == {"n_trials", "n_scored", "n_infra_errors", "infra_error_breakdown",
                                 "n_errors_by_class", "provisional", "partial", "evidence"}
    assert upload.stats["provisional"] is True and upload.stats["n_scored"] == 2 and upload.stats["partial"] is False
    assert upload.stats["evidence"]["gate"] == GATE_VERSION and upload.stats["evidence"]["expected"] == 2


def step(name: str, exception: str | None, reward: float | None) -> dict[str, object]:
    return {"step_name": name, "agent_result": {"n_input_tokens": 900, "n_output_tokens": 120},
            "verifier_result": None if reward is None else {"rewards": {"reward": reward}},
            "exception_info": None if exception is None else {
                "exception_type": exception, "exception_message": "boom", "exception_traceback": "Traceback ...",
                "occurred_at": "2026-11-29T12:03:00"}}


def multi_step(run: Path, name: str, *steps: dict[str, object]) -> None:
    """A multi-step trial as Harbor 0.26 writes it: failures on the steps, the reward the mean of the verified."""
    path = write_trial(run, name, reward=0.0, output_tokens=120)
    doc = json.loads((path / "result.json").read_text())
    verified = [s["verifier_result"]["rewards"]["reward"] for s in steps if s["verifier_result"]]  # type: ignore[index]
    doc |= {"step_results": list(steps), "agent_result": None, "exception_info": None,
            "verifier_result": {"rewards": {"reward": sum(verified) / len(verified)}} if verified else None}
    (path / "result.json").write_text(json.dumps(doc))


def test_a_multi_step_trial_is_classified_by_the_exception_that_decides_it(tmp_path: Path) -> None:
    """A step that measured nothing makes the trial infra, whatever else raised; the model's own failure on a step
    is its failure; a cancelled step leaves the trial to a resume (not completed)."""
    run = tmp_path / "r"
    multi_step(run, "a__aaaaaaa", step("1", None, 1.0), step("2", None, 0.0))  # graded 0.5
    multi_step(run, "b__bbbbbbb", step("1", "ContextLengthExceededError", 1.0), step("2", "DaytonaError", None))
    multi_step(run, "c__ccccccc", step("1", None, 1.0), step("2", "ContextLengthExceededError", None))
    multi_step(run, "d__ddddddd", step("1", "DaytonaError", 1.0), step("2", "CancelledError", None))
    (facts,) = HarborRunDirs(str(tmp_path), REFERENCE_ERRORS).observe()
    assert (facts.n_completed, facts.n_graded, facts.n_benign_errors, facts.n_infra_errors) == (3, 1, 1, 1)
    assert facts.error_breakdown["DaytonaError"] == 1 and facts.error_breakdown["ContextLengthExceededError"] == 1


def test_a_task_weighs_at_most_its_attempts_in_the_score_and_its_stderr() -> None:
    """One attempt a task: t0's three results (1, 1, 0) weigh as one attempt at their mean, beside t1's 0 and t2's
    1; the standard error is the one of those three task means, and n_scored counts three."""
    facts = RunDirFacts(run_tag="r", path="/r", n_completed=5, n_graded=5, reward_sum=3.0, n_total=3,
                        tasks={"t0": (3, 3, 2.0), "t1": (1, 1, 0.0), "t2": (1, 1, 1.0)})
    values = {m.name: m.value for m in metrics_of(facts, REFERENCE_ERRORS).metrics}
    means = [2 / 3, 0.0, 1.0]
    assert values["accuracy"] == pytest.approx(statistics.fmean(means)) and values["n_valid_trials"] == 3
    assert values["accuracy_stderr"] == pytest.approx(statistics.stdev(means) / math.sqrt(3))


def test_an_infra_result_re_run_with_a_grade_is_measured_not_infra() -> None:
    """The infra share is of (task, attempt) pairs: t0's infra result and its graded re-run measured its attempt;
    t1 has only infra results, so 1 of 4 pairs is unmeasured whatever the number of its results."""
    facts = RunDirFacts(run_tag="r", path="/r", n_completed=7, n_graded=4, n_infra_errors=3, reward_sum=2.0,
                        n_total=4, tasks={"t0": (2, 1, 1.0), "t1": (2, 0, 0.0), "t2": (2, 2, 1.0),
                                          "t3": (1, 1, 0.0)})
    verdict = gate(facts, max_infra_fraction=0.3)
    assert isinstance(verdict, Admitted), verdict
    assert (verdict.evidence.unmeasured, verdict.evidence.seen, verdict.evidence.infra_share) == (1, 4, 0.25)
    assert verdict.score == pytest.approx((1.0 + 0.5 + 0.0) / 3) and verdict.n_scored == 3
