"""Launch health (RULES §8, §9), one test per rule: a dead launch is never a score, a launch that cannot work
is cancelled and refired (bounded) or held with its diagnosis, and a slow but healthy one is left alone."""

from __future__ import annotations

from datetime import timedelta

import pytest

from controller.api.catalog import load_catalog
from controller.core.actions import Cancel, Hold, Quarantine, Submit, Upload, Wait
from controller.core.health import count_instant_failures
from controller.core.observed import ErrorKind, JobOutput, JobState, QuietFailure, RunDirFacts, TunnelLease
from controller.core.planner import plan, plan_cell
from controller.core.remedies import CellMemory, Quarantined, QuarantineKind, Remedy, RemedyCause, RemedyKind
from controller.core.vocabulary import HealthState, Phase, Rule
from tests.core.builders import NOW, RUN, ago, cell, facts, job, obs, row, spec_policy, sub

CATALOG = load_catalog()
HEALTH = spec_policy().health.model_copy(update={"failure_modes": CATALOG.failures.modes_for([])})
POLICY = spec_policy(health=HEALTH, cluster="hpc")
C = cell()
TAG = C.run_tag(1)
LITELLM = "litellm.APIConnectionError"
WATCHDOG = ("[rank1]:[E1021 09:21:44.408271257 ProcessGroupNCCL.cpp:632] [Rank 1] Watchdog caught collective operation "
            "timeout: WorkNCCL(SeqNum=3, OpType=ALLREDUCE, NumelIn=4194304, NumelOut=4194304, Timeout(ms)=600000) "
            "ran for 600010 milliseconds before timing out.")


def instant(n: int, *, seconds: float | None = 0.4, kind: ErrorKind = ErrorKind.INFRA,
            answered: bool = False) -> tuple[QuietFailure, ...]:
    return tuple(QuietFailure(exception_type=LITELLM, kind=kind, agent_seconds=seconds, answered=answered)
                 for _ in range(n))


def live_dir(tag: str = TAG, **changes: object) -> RunDirFacts:
    """A running job's dir whose last trial landed a minute ago (the stall rules stay out of the way)."""
    return facts(tag, **({"total": 60, "finished": False, "last_progress": ago(minutes=1)} | changes))  # type: ignore[arg-type]


def dead_dir(n: int = 12, *, finished: bool = True) -> RunDirFacts:
    """Every completed trial raised within a second, no output token: the served model was unreachable."""
    return facts(TAG, total=60, completed=n, scored=0, finished=finished,
                 last_progress=ago(minutes=1 if not finished else 40)).model_copy(update={
        "reward_sum": 0.0, "n_infra_errors": n, "n_graded": 0, "error_breakdown": {LITELLM: n},
        "quiet_failures": instant(n), "n_started_trials": n, "n_answered": 0, "n_usage_reported": 0,
        "tasks": {f"task-{i:03d}": (1, 0, 0.0) for i in range(n)}})


def running(dir_: RunDirFacts | None, *, started_min: float = 20, outputs: tuple[JobOutput, ...] = (),
            memory: CellMemory | None = None, nodes: str = ""):
    live = job(TAG, JobState.RUNNING, started=ago(minutes=started_min)).model_copy(update={"nodes": nodes})
    return obs(subs=(sub(C),), rows=(row("Started", job_name=TAG),), jobs=(live,),
               dirs=(dir_,) if dir_ else ()).model_copy(update={"outputs": outputs,
                                                                "memory": memory or CellMemory()})


def ended(dir_: RunDirFacts, state: JobState = JobState.COMPLETED, *, ended_min: float = 30, log: str = "",
          memory: CellMemory | None = None, nodes: str = "node7"):
    over = job(TAG, state, started=ago(hours=1), ended=ago(minutes=ended_min)).model_copy(
        update={"log_tail": log, "reason": log[-80:], "nodes": nodes})
    return obs(subs=(sub(C),), rows=(row("Started", job_name=TAG),), jobs=(over,), dirs=(dir_,)).model_copy(
        update={"memory": memory or CellMemory()})


def kinds(decided) -> list[str]:
    return [a.kind.value for a in decided.actions]


# --------------------------------------------------------------------------- instant failures are infra


def score(counted: RunDirFacts) -> float | None:
    """What the admission gate divides: the scored trials' rewards over graded + the model's failures."""
    n = counted.n_graded + counted.n_benign_errors
    return counted.reward_sum / n if n else None


CONTEXT = "ContextLengthExceededError"  # the model's own failure, unless it came before one output token


def quiet(n: int, *, seconds: float | None = 0.4, answered: bool = False,
          task: str = "task-x") -> tuple[QuietFailure, ...]:
    return tuple(QuietFailure(exception_type=CONTEXT, kind=ErrorKind.BENIGN, agent_seconds=seconds, answered=answered,
                              reward=0.0, task=task) for _ in range(n))


def test_instant_failures_are_infra_so_a_quarter_dead_run_scores_over_its_real_trials():
    """24 completed: 9 reward 1, 9 genuine zeros, 6 instant failures of a model-failure class → 9/18, not 9/24."""
    mixed = facts(TAG, total=24, completed=24, scored=24).model_copy(update={
        "reward_sum": 9.0, "n_graded": 18, "n_benign_errors": 6, "error_breakdown": {CONTEXT: 6},
        "quiet_failures": quiet(6), "tasks": {"task-x": (24, 24, 9.0)}})

    counted = count_instant_failures(mixed, HEALTH.instant_fail)

    assert score(mixed) == pytest.approx(9 / 24), "before: the dead trials were the model's zeros"
    assert score(counted) == pytest.approx(9 / 18)
    assert (counted.n_instant_failures, counted.n_infra_errors, counted.n_benign_errors) == (6, 6, 0)
    assert counted.error_breakdown == {CONTEXT: 0, "InstantFailure": 6}
    assert counted.tasks == {"task-x": (24, 18, 9.0)}, "the task's tally loses the moved trials too"


def test_a_slow_failure_of_a_model_that_answered_and_a_genuine_zero_stay_as_they_were():
    slow = facts(TAG, total=2, completed=2, scored=1).model_copy(update={
        "reward_sum": 0.0, "n_benign_errors": 1, "n_graded": 1, "error_breakdown": {CONTEXT: 1},
        "quiet_failures": quiet(1, seconds=45.0, answered=True)})

    assert count_instant_failures(slow, HEALTH.instant_fail) == slow


def test_a_model_that_never_answered_is_an_instant_failure_however_long_the_retries_took():
    """Real Harbor 0.26 retries an unreachable model ~36 s before it raises (InternalServerError, reward 0.0)."""
    retried = facts(TAG, total=3, completed=3, scored=3).model_copy(update={
        "reward_sum": 0.0, "n_infra_errors": 3, "n_graded": 0, "error_breakdown": {"InternalServerError": 3},
        "quiet_failures": tuple(QuietFailure(exception_type="InternalServerError", kind=ErrorKind.INFRA,
                                             agent_seconds=36.2, reward=0.0) for _ in range(3))})

    counted = count_instant_failures(retried, HEALTH.instant_fail)

    assert counted.n_instant_failures == 3 and score(counted) is None, "no valid trial: nothing to score"


def test_a_graded_trial_without_one_output_token_is_no_measurement():
    """A dead server behind a live harness: no exception, 0 output tokens, the verifier graded the untouched
    workspace (reward 0). Moved to NoModelOutput (infra), out of the score."""
    silent = facts(TAG, total=4, completed=4).model_copy(update={
        "reward_sum": 1.0, "n_graded": 4, "tasks": {f"t{i}": (1, 1, float(i == 0)) for i in range(4)},
        "quiet_failures": tuple(QuietFailure(exception_type=None, kind=None, agent_seconds=3.0, reward=0.0,
                                             task=f"t{i}") for i in (1, 2))})

    counted = count_instant_failures(silent, HEALTH.instant_fail)

    assert (counted.n_graded, counted.n_infra_errors, counted.n_instant_failures) == (2, 2, 0)
    assert counted.error_breakdown["NoModelOutput"] == 2 and score(counted) == pytest.approx(0.5)
    assert counted.tasks["t1"] == (1, 0, 0.0) and counted.tasks["t0"] == (1, 1, 1.0)


# --------------------------------------------------------------------------- dead launches


def test_a_running_dead_launch_is_cancelled_at_once_and_remembered_for_a_refire():
    decided = plan_cell(C, running(dead_dir(12, finished=False)), POLICY, NOW)

    assert decided.rule == Rule.DEAD_LAUNCH and decided.health == HealthState.DEAD
    assert kinds(decided) == ["cancel"] and "12 instant failures, 0 real trials" in decided.reason
    assert decided.remember is not None
    [remedy] = decided.remember.remedies
    assert (remedy.run_tag, remedy.kind, remedy.cause) == (TAG, RemedyKind.REFIRE, RemedyCause.DEAD_LAUNCH)


def test_fewer_instant_failures_than_dead_launch_trials_are_not_yet_a_verdict():
    decided = plan_cell(C, running(dead_dir(9, finished=False)), POLICY, NOW)

    assert kinds(decided) == ["wait"] and decided.phase == Phase.RUNNING


def test_an_ended_dead_launch_is_refired_never_uploaded():
    decided = plan_cell(C, ended(dead_dir(60)), POLICY, NOW)

    assert decided.rule == Rule.REFIRE and kinds(decided) == ["submit"]
    [submit] = decided.actions
    assert isinstance(submit, Submit) and submit.attempt == 2 and "refire 1 of 2: dead launch" in submit.reason
    assert not any(isinstance(a, Upload) for a in decided.actions)


def test_a_refire_waits_for_the_back_off_after_the_job_ended():
    decided = plan_cell(C, ended(dead_dir(60), ended_min=2), POLICY, NOW)

    assert kinds(decided) == ["wait"] and "refire after" in decided.reason and decided.phase == Phase.PENDING


def test_after_max_refires_the_cell_is_held_with_the_diagnosis():
    earlier = tuple(Remedy(run_tag=C.run_tag(a), kind=RemedyKind.REFIRE, diagnosis="dead launch", at=ago(hours=h),
                           cause=RemedyCause.DEAD_LAUNCH) for a, h in ((0, 3), (9, 2)))
    decided = plan_cell(C, ended(dead_dir(60), memory=CellMemory(remedies=earlier)), POLICY, NOW)

    assert decided.phase == Phase.FAILED and decided.rule == Rule.REFIRES_EXHAUSTED
    assert kinds(decided) == ["hold"] and "dead launch" in decided.reason and "2 refire(s) used" in decided.reason


def test_a_refire_decided_twice_counts_once():
    """The refire's submit failed before its intent was recorded: the same remedy, not a second refire."""
    first = plan_cell(C, ended(dead_dir(60)), POLICY, NOW)
    again = plan_cell(C, ended(dead_dir(60), memory=first.remember), POLICY, NOW + timedelta(minutes=1))

    assert kinds(again) == ["submit"] and "refire 1 of 2" in again.actions[0].reason
    assert again.remember is None, "nothing new to remember"


# --------------------------------------------------------------------------- the failure catalog


@pytest.mark.parametrize(("log", "remedy", "name"), [
    ("RuntimeError: Bytes object is corrupted, checksum does not match", "refire", "torch-compile-cache-corrupt"),
    (WATCHDOG, "refire-elsewhere", "nccl-timeout"),
    ("eval_harbor: vLLM not healthy after 10 checks (EVAL_VLLM_MAX_RETRIES)", "refire", "vllm-health-check-timeout"),
    ("OSError: [Errno 98] Address already in use", "refire", "vllm-dp-port-collision"),
    ("requests.exceptions.HTTPError: 429 Client Error: Too Many Requests for url: "
     "https://huggingface.co/api/models/Qwen/Qwen3-8B/revision/main", "back-off", "hf-hub-rate-limit"),
    ("huggingface_hub.errors.RepositoryNotFoundError: 401 Client Error. (Request ID: Root=1-69aa2f29)", "hold",
     "model-not-on-hub"),
    ("eval_harbor: harbor config not found: /x/eval/configs//abs/y.yaml", "hold", "harbor-config-not-found"),
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate", "hold", "cuda-out-of-memory"),
    ("ModuleNotFoundError: No module named 'vllm'", "hold", "wrong-env"),
    ("    self._set_model_specific_special_tokens(special_tokens=self.extra_special_tokens)\n"
     "AttributeError: 'list' object has no attribute 'keys'", "hold", "tokenizer-extra-special-tokens"),
])
def test_a_catalogued_start_failure_gets_its_remedy_and_its_advice(log: str, remedy: str, name: str):
    failed_early = facts(TAG, total=None, completed=0, has_result=False, trial_dirs=0, finished=False)
    decided = plan_cell(C, ended(failed_early, JobState.FAILED, log=f"loading model\n{log}\nexit 1"), POLICY, NOW)

    assert name in decided.reason and decided.rule in (Rule.REFIRE, Rule.KNOWN_FAILURE)
    # the job failed 30 min ago: a back-off's pause (from the failure) is already over, so only its refire is left
    expected = {"refire": ["submit"], "refire-elsewhere": ["quarantine", "submit"], "back-off": ["submit"],
                "hold": ["hold"]}[remedy]
    assert kinds(decided) == expected, decided.actions
    [planned] = plan(RUN, [C], [ended(failed_early, JobState.FAILED, log=log)], POLICY, NOW).cells
    assert kinds(planned) == expected, "the plan launches what the cell decided: no pause is left"


def test_a_torch_compile_refire_clears_the_cache_and_an_nccl_refire_excludes_the_node():
    failed_early = facts(TAG, total=None, completed=0, has_result=False, trial_dirs=0, finished=False)
    torch = plan_cell(C, ended(failed_early, JobState.FAILED, log="Bytes object is corrupted, checksum does not match"),
                      POLICY, NOW)
    nccl = plan_cell(C, ended(failed_early, JobState.FAILED, log=WATCHDOG, nodes="gpu042"), POLICY, NOW)

    assert torch.actions[-1].job_env == {"EVAL_CLEAR_COMPILE_CACHE": "1"}
    quarantine = nccl.actions[0]
    assert isinstance(quarantine, Quarantine) and quarantine.subject == QuarantineKind.NODE
    assert (quarantine.scope, quarantine.name, quarantine.ttl_s) == ("hpc", "gpu042", 24 * 3600)
    [same_pass] = plan(RUN, [C], [ended(failed_early, JobState.FAILED, log=WATCHDOG, nodes="gpu042")],
                       POLICY, NOW).cells
    assert same_pass.actions[1].exclude_nodes == ("gpu042",), "the refire of the pass that quarantines the node"


def test_every_launch_on_the_cluster_excludes_its_bad_nodes_and_a_back_off_stops_them():
    bad = Quarantined(kind=QuarantineKind.NODE, scope="hpc", name="gpu042", reason="nccl", until=NOW)
    elsewhere = Quarantined(kind=QuarantineKind.NODE, scope="other", name="gpu001", reason="x", until=NOW)
    [fresh] = plan(RUN, [C], [obs()], POLICY, NOW, quarantined=[bad, elsewhere]).cells
    backing_off = Quarantined(kind=QuarantineKind.CLUSTER, scope="hpc", name="hpc", reason="hf-hub-rate-limit",
                              until=NOW + timedelta(minutes=10))
    [waiting] = plan(RUN, [C], [obs()], POLICY, NOW, quarantined=[backing_off]).cells

    assert isinstance(fresh.actions[0], Submit) and fresh.actions[0].exclude_nodes == ("gpu042",)
    assert kinds(waiting) == ["wait"] and "back off until 12:10 UTC: hf-hub-rate-limit" in waiting.actions[0].reason


def test_an_unknown_failure_at_start_is_still_held_with_its_log():
    failed_early = facts(TAG, total=None, completed=0, has_result=False, trial_dirs=0, finished=False)
    decided = plan_cell(C, ended(failed_early, JobState.FAILED, log="Segmentation fault"), POLICY, NOW)

    assert kinds(decided) == ["hold"] and decided.rule == Rule.JOB_FAILED_AT_START and "Segmentation" in decided.reason


# --------------------------------------------------------------------------- launch grace


def test_a_job_running_past_the_grace_with_no_trial_started_is_cancelled_and_refired_later():
    nothing = live_dir(completed=0, trial_dirs=8)
    stalled = plan_cell(C, running(nothing, started_min=31), POLICY, NOW)
    slow = plan_cell(C, running(nothing, started_min=12), POLICY, NOW)

    assert stalled.rule == Rule.LAUNCH_STALLED and kinds(stalled) == ["cancel"]
    assert "no trial started in 31 min" in stalled.reason
    assert kinds(slow) == ["wait"] and slow.health == HealthState.LAUNCHING and "launching (12 min of 30" in \
        slow.health_note


def test_a_trial_with_agent_content_is_a_started_launch():
    working = live_dir(completed=0, trial_dirs=8).model_copy(
        update={"n_started_trials": 3})

    assert kinds(plan_cell(C, running(working, started_min=45), POLICY, NOW)) == ["wait"]


# --------------------------------------------------------------------------- pinggy


PINGGY = POLICY.model_copy(update={"tunnel_pairs": ("pair-a", "pair-b"),
                                   "tunnel_urls": {"pair-a": "https://a.a.pinggy.link",
                                                   "pair-b": "https://b.a.pinggy.link"}})
AGENT = cell(agent="openhands", needs_pinggy=True)
AGENT_TAG = AGENT.run_tag(1)


def agent_running(api_base: str | None, text: str = ""):
    dir_ = live_dir(AGENT_TAG, completed=2).model_copy(update={"api_base": api_base,
                                                                                       "n_started_trials": 4})
    live = job(AGENT_TAG, JobState.RUNNING, started=ago(minutes=10))
    outputs = (JobOutput(job_id=live.job_id, offset=0, end=len(text), text=text),) if text else ()
    return obs(subs=(sub(AGENT),), rows=(row("Started", job_name=AGENT_TAG),), jobs=(live,), dirs=(dir_,)
               ).model_copy(update={"outputs": outputs})


@pytest.mark.parametrize("api_base", ["http://10.0.3.7:8000/v1", "http://127.0.0.1:8000/v1",
                                      "https://b.a.pinggy.link/v1"])
def test_trials_not_calling_the_leased_pair_are_cancelled_and_held(api_base: str):
    lease = TunnelLease(pair="pair-a", holder=AGENT_TAG, evalrun=RUN, leased_at=ago(hours=1))
    [decided] = plan(RUN, [AGENT], [agent_running(api_base)], PINGGY, NOW, tunnel_leases=[lease],
                     live_job_names=frozenset({AGENT_TAG})).cells

    assert decided.rule == Rule.PINGGY_NOT_WIRED and kinds(decided) == ["cancel"]
    assert api_base in decided.reason and "EVAL_PINGGY_URL" in decided.reason
    assert decided.remember is not None and decided.remember.remedies[0].kind == RemedyKind.HOLD


def test_trials_calling_the_leased_pair_are_fine():
    lease = TunnelLease(pair="pair-a", holder=AGENT_TAG, evalrun=RUN, leased_at=ago(hours=1))
    [decided] = plan(RUN, [AGENT], [agent_running("https://a.a.pinggy.link/v1")], PINGGY, NOW,
                     tunnel_leases=[lease], live_job_names=frozenset({AGENT_TAG})).cells

    assert kinds(decided) == ["wait"] and decided.health == HealthState.ALIVE


def test_a_locked_pair_is_quarantined_and_the_refire_gets_the_other_one():
    lease = TunnelLease(pair="pair-a", holder=AGENT_TAG, evalrun=RUN, leased_at=ago(hours=1))
    locked_line = "Error: A tunnel with the same token (xyz) is already active. Please stop it."
    [decided] = plan(RUN, [AGENT], [agent_running("https://a.a.pinggy.link/v1", locked_line)], PINGGY, NOW,
                     tunnel_leases=[lease], live_job_names=frozenset({AGENT_TAG})).cells
    quarantine = next(a for a in decided.actions if isinstance(a, Quarantine))
    pair_locked = Quarantined(kind=QuarantineKind.PAIR, scope=str(RUN), name="pair-a", reason="locked",
                              until=NOW + timedelta(hours=1))
    [fresh] = plan(RUN, [AGENT], [obs()], PINGGY, NOW, quarantined=[pair_locked]).cells

    assert decided.rule == Rule.PINGGY_LOCKED and any(isinstance(a, Cancel) for a in decided.actions)
    assert (quarantine.subject, quarantine.name, quarantine.ttl_s) == (QuarantineKind.PAIR, "pair-a", 3600)
    assert fresh.actions[0].tunnel == "pair-b"


# --------------------------------------------------------------------------- traffic


def access(n: int, status: int) -> str:
    return "".join(f'INFO:     127.0.0.1:4{i:04d} - "POST /v1/chat/completions HTTP/1.1" {status} OK\n'
                   for i in range(n))


def test_a_third_of_requests_answered_400_is_stalled_with_the_context_overflow_advice():
    text = "INFO:     Application startup complete.\n" + access(40, 200) + access(20, 400)
    live = job(TAG, JobState.RUNNING)
    decided = plan_cell(C, running(live_dir(completed=5),
                                   outputs=(JobOutput(job_id=live.job_id, offset=0, end=9999, text=text),)),
                        POLICY, NOW)

    assert decided.rule == Rule.BAD_REQUESTS and decided.phase == Phase.STALLED and kinds(decided) == ["wait"]
    assert "33% of 60 requests answered 400" in decided.reason and "max_input_tokens" in decided.reason
    assert decided.remember is not None and decided.remember.output is not None
    assert (decided.remember.output.requests, decided.remember.output.offset) == (60, 9999)


def test_no_request_long_after_vllm_was_ready_is_no_traffic():
    live = job(TAG, JobState.RUNNING)
    ready = plan_cell(C, running(live_dir(completed=5), outputs=(
        JobOutput(job_id=live.job_id, offset=0, end=40, text="INFO:     Application startup complete.\n"),)),
        POLICY, NOW - timedelta(minutes=16))
    later = plan_cell(C, running(live_dir(completed=5), memory=ready.remember),
                      POLICY, NOW)

    assert kinds(ready) == ["wait"] and ready.phase == Phase.RUNNING
    assert later.rule == Rule.NO_TRAFFIC and "no chat completion request for 16 min" in later.reason


def test_a_healthy_job_says_so_in_its_verdict():
    live = job(TAG, JobState.RUNNING)
    decided = plan_cell(C, running(live_dir(completed=14, last_progress=ago(minutes=2)),
                                   outputs=(JobOutput(job_id=live.job_id, offset=0, end=1, text=access(50, 200)),)),
                        POLICY, NOW)

    assert decided.health == HealthState.ALIVE and decided.health_note.startswith("alive: 14 trials scored")
    assert "0% 400s of 50 requests" in decided.health_note


def test_a_running_nccl_failure_cancels_and_quarantines_the_node():
    live = job(TAG, JobState.RUNNING)
    decided = plan_cell(C, running(live_dir(completed=5), nodes="gpu9", outputs=(
        JobOutput(job_id=live.job_id, offset=0, end=10, text=f"{WATCHDOG}\n"),)),
        POLICY, NOW)

    assert decided.rule == Rule.KNOWN_FAILURE and kinds(decided) == ["cancel", "quarantine"]
    assert decided.remember is not None and decided.remember.remedies[0].node == "gpu9"


def test_daytona_load_shedding_backs_the_cluster_off_and_lets_the_job_run():
    live = job(TAG, JobState.RUNNING)
    decided = plan_cell(C, running(live_dir(completed=5), outputs=(
        JobOutput(job_id=live.job_id, offset=0, end=10, text="DaytonaError: Bearer token is invalid\n"),)),
        POLICY, NOW)

    assert kinds(decided) == ["quarantine", "wait"] and decided.phase == Phase.STALLED
    assert isinstance(decided.actions[0], Quarantine) and decided.actions[0].subject == QuarantineKind.CLUSTER
    assert not any(isinstance(a, Cancel | Hold) for a in decided.actions)


def test_a_suspended_plan_holds_quarantines_too():
    decided = plan_cell(C, ended(dead_dir(60)), POLICY.model_copy(update={"suspend": True}), NOW)
    [held] = plan(RUN, [C], [ended(dead_dir(60))], POLICY.model_copy(update={"suspend": True}), NOW).cells

    assert kinds(decided) == ["submit"] and kinds(held) == ["hold"] and "would submit" in held.actions[0].reason
    assert isinstance(held.actions[0], Hold) and not isinstance(held.actions[0], Wait)


def test_a_job_with_only_instant_failures_below_the_threshold_is_suspect_not_alive():
    decided = plan_cell(C, running(dead_dir(4, finished=False)), POLICY, NOW)

    assert kinds(decided) == ["wait"] and decided.health == HealthState.STALLED
    assert decided.health_note.startswith("suspect: 4 instant failures and no real trial yet")


def test_an_agent_that_calls_no_model_keeps_its_scores():
    """Harbor's oracle has no tokens ever: its failed trials are the task's, not an unreachable model's."""
    oracle = cell(agent="oracle", calls_model=False)
    tag = oracle.run_tag(1)
    over = job(tag, JobState.COMPLETED, started=ago(hours=1), ended=ago(minutes=30))
    failed = dead_dir(60).model_copy(update={  # the task's own failure (a class the catalog calls the model's)
        "run_tag": tag, "n_completed": 60, "n_total": 60, "n_infra_errors": 0, "n_benign_errors": 60,
        "error_breakdown": {CONTEXT: 60}, "tasks": {f"t{i}": (1, 1, 0.0) for i in range(60)},
        "quiet_failures": tuple(q for i in range(60) for q in quiet(1, task=f"t{i}"))})
    seen = obs(subs=(sub(oracle),), rows=(row("Started", job_name=tag),), jobs=(over,), dirs=(failed,))

    decided = plan_cell(oracle, seen, POLICY, NOW)
    as_llm = plan_cell(oracle.model_copy(update={"calls_model": True}), seen, POLICY, NOW)

    assert kinds(decided) == ["analyze", "upload"] and decided.run_dir.n_instant_failures == 0
    assert kinds(as_llm) == ["submit"] and as_llm.rule == Rule.REFIRE, "the same dir of an LLM agent: a dead launch"
