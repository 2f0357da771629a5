"""The admission gate over a corpus of real run dirs (Harbor's files, read by the real adapter, planned by the pure
planner): every way a number that is not real reached the leaderboard ends refused, with a reason naming the
evidence, and never as an upload; the controls (genuine zeros, the model's own failures with a reward) are
uploaded exactly as they were.

Each case is a finished run dir of one cell whose job ended two hours ago, with no fire left to resume it (so the
gate's last word is what the cell shows), and again with fires left (so its remedy is what the cell does).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.adapters.rundirs.harbor import HarborRunDirs
from controller.core.actions import Resume, Submit, Upload
from controller.core.admission import Admitted, Refusal, Refused, admit
from controller.core.health import count_instant_failures
from controller.core.observed import JobState, RunDirFacts
from controller.core.planner import plan_cell
from controller.core.remedies import CellMemory, OutputReading
from controller.core.types import Cell
from controller.core.vocabulary import Phase
from tests.core.builders import NOW, POLICY, ago, cell, job, obs, row, sub
from tests.fixtures.harbor_dirs import (
    REFERENCE_ERRORS,
    write_config,
    write_job_result,
    write_meta_env,
    write_trial,
)

MODEL = "laion/Qwen3-8B"
PLAIN = cell(model=MODEL, benchmark="DCAgent2/terminal_bench_2")  # a dataset: Harbor's total is expected
TB2 = cell(model=MODEL, tasks=89, n_attempts=3, partial_credit=False)  # the preset: 89 tasks × 3 attempts
NO_FIRES_LEFT = POLICY.model_copy(update={"max_total_fires": 1})
LITELLM_TRACE = ("Traceback (most recent call last):\n  ...\nlitellm.exceptions.BadRequestError: "
                 "litellm.BadRequestError: Hosted_vllmException - context length exceeded\n")
DAYTONA_TRACE = ("Traceback (most recent call last):\n  ...\ndaytona_api_client.exceptions.BadRequestError: "
                 "(400) Reason: Bad Request\n")


def trial(run: Path, task: str, attempt: int = 0, *, reward: float | None = 0.0, exception: str | None = None,
          tokens: object = 300, seconds: float | None = 240.0, **doc: object) -> None:
    """One finished trial of `task`; `doc` replaces top-level keys of its result.json (rewards, tracebacks)."""
    path = write_trial(run, f"{task}__{attempt:07d}", reward=reward, exception=exception, output_tokens=tokens,
                       agent_seconds=seconds)
    if doc:
        result = path / "result.json"
        content = json.loads(result.read_text())
        for key, value in doc.items():
            if key == "exception_traceback":
                content["exception_info"]["exception_traceback"] = value
            else:
                content[key] = value
        result.write_text(json.dumps(content))


def finished(run: Path, n_total: int | None, *, model: str = MODEL, dataset: str = "DCAgent2/terminal_bench_2",
             n_attempts: int = 1) -> None:
    write_config(run, model=f"hosted_vllm/{model}", dataset=dataset, n_attempts=n_attempts)
    write_meta_env(run, MODEL=model, REPO_ID=dataset, AGENT_NAME="terminus-2", TIMEOUT_MULTIPLIER=2.0,
                   RESUME_COUNT=0)
    write_job_result(run, n_total)


def genuine(run: Path, n: int, *, passed: int = 0, start: int = 0) -> None:
    """Trials of tasks start..start+n-1 that ran: tokens, agent time, and a verifier that graded them."""
    for i in range(start, start + n):
        trial(run, f"t{i:03d}", reward=1.0 if i - start < passed else 0.0)


@dataclass(frozen=True)
class Case:
    build: Callable[[Path], None]
    refusal: Refusal | None  # None: a control, admitted
    says: str  # a fragment of the reason (refused) or of the evidence (admitted)
    cell: Cell = PLAIN
    score: float | None = None  # a control's admitted score
    requests: int | None = None  # what the job's vLLM logged (None: its output was not read)


def mostly_dead(run: Path) -> None:
    genuine(run, 1, passed=1)
    for i in range(1, 20):
        trial(run, f"t{i:03d}", reward=None, exception="APIConnectionError", tokens=None, seconds=0.3)
    finished(run, 20)


def sixty_percent_instant(run: Path) -> None:
    genuine(run, 2, passed=1)
    trial(run, "t002", reward=1.0)
    trial(run, "t003", reward=0.0, exception="AgentTimeoutError")
    for i in range(4, 10):
        trial(run, f"t{i:03d}", reward=None, exception="APIConnectionError", tokens=None, seconds=0.3)
    finished(run, 10)


def dead_server_zero_tokens(run: Path) -> None:
    for i in range(10):
        trial(run, f"t{i:03d}", reward=0.0, tokens=0)
    finished(run, 10)


def dead_server_null_usage(run: Path) -> None:
    for i in range(10):
        trial(run, f"t{i:03d}", reward=0.0, agent_result=None)
    finished(run, 10)


def unknown_class_after_tokens(run: Path) -> None:
    genuine(run, 16, passed=8)
    for i in range(16, 18):
        trial(run, f"t{i:03d}", reward=None, exception="SandboxLostError")
    finished(run, 18)


def qualified_daytona(run: Path) -> None:
    genuine(run, 16, passed=8)
    for i in range(16, 18):
        trial(run, f"t{i:03d}", reward=None, exception="daytona.common.errors.DaytonaError")
    finished(run, 18)


def sandbox_bad_request(run: Path) -> None:
    genuine(run, 16, passed=8)
    for i in range(16, 18):
        trial(run, f"t{i:03d}", reward=None, exception="BadRequestError", exception_traceback=DAYTONA_TRACE)
    finished(run, 18)


def reward_of(value: object, key: str = "reward") -> Callable[[Path], None]:
    def build(run: Path) -> None:
        genuine(run, 3, passed=1)
        trial(run, "t003", verifier_result={"rewards": {key: value}})
        finished(run, 4)
    return build


def never_verified(run: Path) -> None:
    genuine(run, 16, passed=8)
    for i in range(16, 20):
        trial(run, f"t{i:03d}", reward=None)  # no reward, no exception: the verifier never ran
    finished(run, 20)


def another_models_run(run: Path) -> None:
    genuine(run, 10, passed=5)
    finished(run, 10, model="org/Other-70B")


def tb2_ten_tasks(run: Path) -> None:
    """Harbor saw 10 of the catalog's 89 tasks: it says 30 trials, 30 have results."""
    for i in range(10):
        for attempt in range(3):
            trial(run, f"t{i:03d}", attempt, reward=float(attempt == 0))
    finished(run, 30, n_attempts=3)


def no_total(run: Path) -> None:
    genuine(run, 10, passed=5)
    finished(run, None)


def resume_re_ran_the_same(run: Path) -> None:
    """20 expected; a resume re-ran the same 10 tasks instead of the other 10."""
    genuine(run, 10, passed=5)
    for i in range(10):
        trial(run, f"t{i:03d}", 1, reward=1.0)
    finished(run, 20)


def leftovers_of_an_earlier_fire(run: Path) -> None:
    """32 results for 20 trials: 12 trials of a killed fire's sandboxes landed beside the re-runs. Each task weighs
    one attempt (RULES §14): t000-t009 passed once and failed once (0.5 each), t010-t011 failed twice, the other 8
    failed once, so the score is 5/20, not 10/32 (which let the 12 extra results weigh as 12 more attempts)."""
    genuine(run, 20, passed=10)
    for i in range(12):
        trial(run, f"t{i:03d}", 1, reward=0.0)
    finished(run, 20)


def ten_graded_and_a_flood_of_unknown(run: Path) -> None:
    genuine(run, 10, passed=5)
    for i in range(10, 160):
        trial(run, f"t{i:03d}", reward=None, exception="SandboxLostError")
    finished(run, 160)


def genuine_zeros(run: Path) -> None:
    genuine(run, 20, passed=0)
    finished(run, 20)


def model_failures_with_a_reward(run: Path) -> None:
    genuine(run, 16, passed=8)
    trial(run, "t016", reward=0.0, exception="AgentTimeoutError")
    trial(run, "t017", reward=None, exception="ContextLengthExceededError")
    trial(run, "t018", reward=None, exception="BadRequestError", exception_traceback=LITELLM_TRACE)
    finished(run, 19)


CASES = {
    "19-of-20-instant": Case(mostly_dead, Refusal.INFRA_SHARE, "19 of 20 trials are infra (95%)"),
    "60%-instant": Case(sixty_percent_instant, Refusal.INFRA_SHARE, "6 of 10 trials are infra (60%)"),
    "dead-server-0-tokens": Case(dead_server_zero_tokens, Refusal.NO_TRAFFIC,
                                 "10 graded trials without one output token"),
    "dead-server-null-usage": Case(dead_server_null_usage, Refusal.NO_TRAFFIC, "0 vLLM requests", requests=0),
    "dead-server-null-usage-unread": Case(dead_server_null_usage, Refusal.NO_TRAFFIC, "vLLM requests not read"),
    "unknown-class-is-infra": Case(unknown_class_after_tokens, Refusal.INFRA_SHARE, "2 of 18 trials are infra"),
    "qualified-daytona-is-infra": Case(qualified_daytona, Refusal.INFRA_SHARE, "2 of 18 trials are infra"),
    "sandbox-bad-request-is-infra": Case(sandbox_bad_request, Refusal.INFRA_SHARE, "2 of 18 trials are infra"),
    "reward-minus-one": Case(reward_of(-1), Refusal.INVALID_REWARD, "t003__0000000/result.json: reward -1 is outside"),
    "reward-seven": Case(reward_of(7), Refusal.INVALID_REWARD, "reward 7 is outside [0, 1]"),
    "reward-under-another-key": Case(reward_of(1.0, key="score"), Refusal.INVALID_REWARD, "no 'reward' key"),
    "reward-a-string": Case(reward_of("1.0"), Refusal.INVALID_REWARD, "reward is '1.0', not a finite number"),
    "fractional-on-tb2": Case(reward_of(0.5), Refusal.INVALID_REWARD, "no partial credit",
                              cell=TB2.model_copy(update={"tasks": 4, "n_attempts": 1})),
    "never-verified-is-infra": Case(never_verified, Refusal.INFRA_SHARE, "4 of 20 trials are infra"),
    "another-model's-run": Case(another_models_run, Refusal.IDENTITY, "model 'org/Other-70B', not 'laion/Qwen3-8B'"),
    "tb2-10-of-89-tasks": Case(tb2_ten_tasks, Refusal.INCOMPLETE, "30 of 267 expected trials (catalog)", cell=TB2),
    "no-total-anywhere": Case(no_total, Refusal.NO_TOTAL, "neither the benchmark catalog nor Harbor"),
    "resume-re-ran-the-same": Case(resume_re_ran_the_same, Refusal.INCOMPLETE, "10 of 20 expected trials"),
    "10-graded-150-unknown": Case(ten_graded_and_a_flood_of_unknown, Refusal.INFRA_SHARE, "150 of 160 trials"),
    "control-genuine-zeros": Case(genuine_zeros, None, "20 graded", score=0.0),
    "control-leftovers-count-once": Case(leftovers_of_an_earlier_fire, None, "12 duplicates", score=5 / 20),
    "control-model-failures": Case(model_failures_with_a_reward, None, "16 graded, 3 model failures",
                                   score=8 / 19),
}


def observed(tmp_path: Path, case: Case) -> tuple[Cell, RunDirFacts]:
    run = tmp_path / case.cell.run_tag(1)
    case.build(run)
    written = ago(hours=3).timestamp()  # well before the job ended: not settling
    for path in run.rglob("*"):
        os.utime(path, (written, written))
    (facts,) = HarborRunDirs(str(tmp_path), REFERENCE_ERRORS).observe()
    assert not facts.unreadable, facts.unreadable
    return case.cell, facts


def planned(c: Cell, facts: RunDirFacts, case: Case, policy=NO_FIRES_LEFT, fires: int = 1):
    tag = c.run_tag(1)
    ended = job(tag, JobState.COMPLETED, started=ago(hours=4), ended=ago(hours=2))
    seen = obs(rows=(row("Started", job_name=tag),), subs=tuple(sub(c, fire=f) for f in range(1, fires + 1)),
               jobs=(ended,), dirs=(facts,))
    if case.requests is not None:
        seen = seen.model_copy(update={"memory": CellMemory(output=OutputReading(
            job_id=ended.job_id, read_at=ago(hours=2), requests=case.requests))})
    return plan_cell(c, seen, policy, NOW)


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_a_number_goes_out_only_with_the_evidence_that_the_model_earned_it(tmp_path: Path, case: Case) -> None:
    c, facts = observed(tmp_path, case)
    decided = planned(c, facts, case)
    uploads = [a for a in decided.actions if isinstance(a, Upload)]
    if case.refusal is None:
        assert decided.phase == Phase.EVALUATED and len(uploads) == 1, decided.reason
        admitted = uploads[0].admitted
        assert admitted.score == pytest.approx(case.score) and not admitted.partial
        assert case.says in admitted.evidence.summary()
        return
    assert uploads == [], f"published: {decided.reason}"
    assert case.says in decided.reason, decided.reason
    if case.refusal == Refusal.NO_TRAFFIC:  # a dead launch: refired as a new attempt (health.maxRefires), then held
        assert "dead launch" in decided.reason and [type(a) for a in decided.actions] == [Submit]
        return
    assert isinstance(decided.admission, Refused) and decided.admission.refusal == case.refusal, decided.reason
    assert decided.phase == Phase.FAILED and [a.kind.value for a in decided.actions] == ["hold"]


REMEDIES = {Refusal.INFRA_SHARE: Resume, Refusal.INCOMPLETE: Resume, Refusal.NO_TRAFFIC: Submit}


@pytest.mark.parametrize("case", [c for c in CASES.values() if c.refusal in REMEDIES],
                         ids=[k for k, c in CASES.items() if c.refusal in REMEDIES])
def test_with_fires_left_the_remedy_is_a_resume_or_a_refire_never_an_upload(tmp_path: Path, case: Case) -> None:
    c, facts = observed(tmp_path, case)
    decided = planned(c, facts, case, policy=POLICY.model_copy(update={"health": POLICY.health.model_copy(
        update={"refire_backoff": timedelta(0)})}))
    kinds = [type(a) for a in decided.actions]
    assert Upload not in kinds and REMEDIES[case.refusal] in kinds, decided.reason


# --------------------------------------------------------------------------- property: the score is the rule


TRIAL_CLASSES = st.sampled_from(["pass", "fail", "model-failure", "model-failure-graded", "infra", "unknown",
                                 "ungraded", "instant"])


@settings(max_examples=60, deadline=None)
@given(st.lists(TRIAL_CLASSES, min_size=1, max_size=40))
def test_the_admitted_score_is_graded_rewards_over_graded_and_model_failures(tmp_path_factory: pytest.TempPathFactory,
                                                                           classes: list[str]) -> None:
    """For any mixture: admitted ⇒ score = Σ rewards / (graded + the model's failures) and the infra share is within
    the threshold; anything else is refused and planned as no upload."""
    jobs = tmp_path_factory.mktemp("jobs")
    run = jobs / PLAIN.run_tag(1)
    for i, kind in enumerate(classes):
        task = f"t{i:03d}"
        if kind in ("pass", "fail"):
            trial(run, task, reward=float(kind == "pass"))
        elif kind == "model-failure":
            trial(run, task, reward=None, exception="ContextLengthExceededError")
        elif kind == "model-failure-graded":
            trial(run, task, reward=1.0, exception="AgentTimeoutError")
        elif kind == "infra":
            trial(run, task, reward=None, exception="DaytonaError")
        elif kind == "unknown":
            trial(run, task, reward=0.0, exception="SandboxLostError")
        elif kind == "ungraded":
            trial(run, task, reward=None)
        else:
            trial(run, task, reward=None, exception="APIConnectionError", tokens=None, seconds=0.2)
    finished(run, len(classes))
    (facts,) = HarborRunDirs(str(jobs), REFERENCE_ERRORS).observe()
    counted = count_instant_failures(facts, POLICY.health.instant_fail)
    verdict = admit(PLAIN, counted, POLICY.admission, requests=None)

    scored = [k for k in classes if k in ("pass", "fail", "model-failure", "model-failure-graded")]
    infra = len(classes) - len(scored)
    rewards = sum(1.0 for k in scored if k in ("pass", "model-failure-graded"))
    if isinstance(verdict, Admitted):
        assert verdict.score == pytest.approx(rewards / len(scored))
        assert verdict.n_scored == len(scored) and infra / len(classes) <= POLICY.admission.max_infra_fraction
    else:
        assert not scored or infra / len(classes) > POLICY.admission.max_infra_fraction \
            or verdict.refusal == Refusal.NO_TRAFFIC
        tag = PLAIN.run_tag(1)
        decided = plan_cell(PLAIN, obs(rows=(row("Started", job_name=tag),), subs=(sub(PLAIN),),
                                       jobs=(job(tag, JobState.COMPLETED, started=ago(hours=4), ended=ago(hours=2)),),
                                       dirs=(facts,)), NO_FIRES_LEFT, NOW)
        assert not any(isinstance(a, Upload) for a in decided.actions)
