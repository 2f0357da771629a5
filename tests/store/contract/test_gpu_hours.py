"""GPU-hours in the controller's state: each job's actual hours on its submission, and the finished attempts
estimates are the median of (grouped per attempt, summed over its fires, only when every fire's hours are known)."""

from __future__ import annotations

from datetime import UTC, datetime

from controller.core.gpu_hours import AttemptCost
from controller.core.observed import Submission
from controller.core.ports import ControllerState
from controller.core.types import EvalRunRef

T0 = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
HOUR = 3600.0
QWEN = EvalRunRef(name="qwen-evals")


def fire(run_tag: str, n: int, *, model: str = "org/a-8B", benchmark: str = "tb2",
         cell_key: str = "cell-a") -> Submission:
    name = run_tag if n == 1 else f"{run_tag}-r{n - 1}"
    return Submission(name=name, run_tag=run_tag, evalrun=QWEN, cell_key=cell_key, attempt=1, fire=n,
                      created_at=T0, model=model, benchmark=benchmark)


def test_a_jobs_gpu_hours_are_recorded_on_its_submission(state_backend: ControllerState) -> None:
    state_backend.record_submission(fire("ev_a__a1", 1))
    state_backend.record_job_end("ev_a__a1", 2.5, None)
    state_backend.record_job_end("ev_a__a1", 2.5, None)

    (sub,) = state_backend.read_state(QWEN, [], HOUR).submissions
    assert (sub.gpu_hours, sub.model, sub.benchmark) == (2.5, "org/a-8B", "tb2")


def test_a_sized_jobs_estimate_is_kept_from_its_intent_and_how_long_it_ran_from_its_end(
        state_backend: ControllerState) -> None:
    """walltime auto learns its margin from these two; recording one end leaves what the other recorded."""
    state_backend.record_submission(fire("ev_a__a1", 1).model_copy(update={"estimated_hours": 3.25}))
    state_backend.record_job_end("ev_a__a1", None, 2.75)
    state_backend.record_job_end("ev_a__a1", 11.0, None)

    (sub,) = state_backend.read_state(QWEN, [], HOUR).submissions
    assert (sub.estimated_hours, sub.elapsed_hours, sub.gpu_hours) == (3.25, 2.75, 11.0)


def test_history_is_the_finished_attempts_of_the_named_benchmarks_summed_over_their_fires(
        state_backend: ControllerState) -> None:
    for submission, hours in [(fire("ev_a__a1", 1), 1.0), (fire("ev_a__a1", 2), 0.5),  # finished, two fires
                              (fire("ev_b__a1", 1, model="org/b-8B", cell_key="cell-b"), 4.0),  # not finished
                              (fire("ev_c__a1", 1, benchmark="swebench", cell_key="cell-c"), 9.0),  # other benchmark
                              (fire("ev_d__a1", 1, model="org/d-8B", cell_key="cell-d"), 3.0),
                              (fire("ev_d__a1", 2, model="org/d-8B", cell_key="cell-d"), None)]:  # a fire unknown
        state_backend.record_submission(submission)
        if hours is not None:
            state_backend.record_job_end(submission.name, hours, None)
    for run_tag in ("ev_a__a1", "ev_c__a1", "ev_d__a1"):
        state_backend.finish_attempt(run_tag)
        state_backend.finish_attempt(run_tag)

    history = state_backend.read_state(EvalRunRef(name="another"), [], HOUR, ["tb2"]).gpu_history

    assert history == (AttemptCost(run_tag="ev_a__a1", model="org/a-8B", benchmark="tb2", gpu_hours=1.5),)
    assert state_backend.read_state(QWEN, [], HOUR).gpu_history == (), "no benchmark named: no history read"


def test_an_attempts_size_is_kept_from_its_intent_and_read_with_the_history(state_backend: ControllerState) -> None:
    """An estimate from an attempt of another size is scaled to the cell's: the history says each one's size."""
    state_backend.record_submission(fire("ev_a__a1", 1).model_copy(update={"trials": 267, "concurrency": 16}))
    state_backend.record_submission(fire("ev_b__a1", 1, model="org/b-8B", cell_key="cell-b"))  # a size not known
    for run_tag in ("ev_a__a1", "ev_b__a1"):
        state_backend.record_job_end(run_tag, 2.0, 0.5)
        state_backend.finish_attempt(run_tag)

    history = {cost.run_tag: cost for cost in state_backend.read_state(QWEN, [], HOUR, ["tb2"]).gpu_history}

    assert (history["ev_a__a1"].trials, history["ev_a__a1"].concurrency) == (267, 16)
    assert (history["ev_b__a1"].trials, history["ev_b__a1"].concurrency) == (None, None)
    sizes = {s.name: (s.trials, s.concurrency) for s in state_backend.read_state(QWEN, [], HOUR).submissions}
    assert sizes == {"ev_a__a1": (267, 16), "ev_b__a1": (None, None)}
