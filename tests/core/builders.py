"""Small builders for planner tests: a cell, an observation, facts — with the defaults of a plain case."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from controller.core.admission import Admission, Admitted, admit
from controller.core.metrics import RunMetrics, run_metrics
from controller.core.observed import JobState, Metric, Observation, ObservedJob, ObservedRow, RunDirFacts, Submission
from controller.core.planner import Policy
from controller.core.trial_errors import ErrorClasses
from controller.core.types import Cell, EvalRunRef

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
RUN = EvalRunRef(name="run1")
ME = "alice"


def spec_policy(**changes: object) -> Policy:
    """The Policy of an EvalRun and an EvalCluster that set nothing — the spec's defaults, the only ones there are —
    as `ME`, with no failure catalog (the tests that need one add it) and `changes` on top."""
    from pathlib import Path

    from controller.api.catalog import load_catalog
    from controller.api.loader import load_objects
    from controller.entry.wiring import policy_for

    meta = {"apiVersion": "evalrun.io/v1alpha1", "metadata": {"name": "c1"}}
    cluster = {**meta, "kind": "EvalCluster", "spec": {"scheduler": {"type": "local"}, "username": ME,
                                                       "jobsDir": "/jobs", "logsDir": "/logs", "jobScript": "/run"}}
    run = {**meta, "kind": "EvalRun", "metadata": {"name": RUN.name},
           "spec": {"cluster": "c1", "models": ["org/m-8B"], "datasets": ["Org/d"]}}
    specs = load_objects([cluster, run], Path("/"))
    [loaded] = specs.evalruns
    policy = policy_for(loaded, specs.cluster_of(loaded), load_catalog())
    plain = {"cluster": "", "health": policy.health.model_copy(update={"failure_modes": ()})}
    return policy.model_copy(update={**plain, **changes})


POLICY = spec_policy()


def ago(**delta: float) -> datetime:
    return NOW - timedelta(**delta)


def cell(model: str = "laion/Qwen3-8B-sft", benchmark_name: str = "terminal_bench_2", **changes: object) -> Cell:
    values = dict(evalrun=RUN, cluster="c1", model=model, benchmark="tb2",
                  dataset=f"DCAgent2/{benchmark_name}", benchmark_name=benchmark_name, agent="terminus-2",
                  n_concurrent=8, harbor_config="dcagent_eval_defaults.yaml", timeout_multiplier=2.0,
                  fingerprint="0123456789abcdef", time_limit="24:00:00")
    values.update(changes)
    return Cell(**values)  # type: ignore[arg-type]


def row(status: str | None, *, user: str = ME, metrics: tuple[Metric, ...] | None = None, job_name: str | None = None,
        created: datetime | None = None, submitted: datetime | None = None, started: datetime | None = None,
        row_id: str = "row-1", slurm_job_id: str | None = None) -> ObservedRow:
    return ObservedRow(id=row_id, job_name=job_name, username=user, job_status=status,
                       created_at=created or ago(hours=1), submitted_at=submitted, started_at=started,
                       metrics=metrics, slurm_job_id=slurm_job_id)


SCORED = (Metric(name="accuracy", value=0.5), Metric(name="accuracy_stderr", value=0.05))


def sub(c: Cell, attempt: int = 1, fire: int = 1, *, job_id: str | None = "100", row_id: str | None = "row-1",
        created: datetime | None = None) -> Submission:
    from controller.core.types import submission_name

    tag = c.run_tag(attempt)
    return Submission(name=submission_name(tag, fire), run_tag=tag, evalrun=c.evalrun, cell_key=c.key,
                      attempt=attempt, fire=fire, row_id=row_id, job_id=job_id, created_at=created or ago(hours=1))


def job(name: str, state: JobState, *, job_id: str = "100", started: datetime | None = None,
        ended: datetime | None = None, time_left_s: int | None = None, reason: str = "") -> ObservedJob:
    return ObservedJob(job_id=job_id, name=name, state=state, submitted_at=ago(hours=2), started_at=started,
                       ended_at=ended, time_left_s=time_left_s, reason=reason)


def facts(tag: str, *, total: int | None = 10, completed: int = 10, scored: int | None = None, infra: int = 0,
          finished: bool = True, fires: int = 1, trial_dirs: int | None = None, has_result: bool = True,
          last_progress: datetime | None = None, no_resume: bool = False, model: str | None = None,
          benchmark_name: str | None = None, agent: str | None = None) -> RunDirFacts:
    graded = max(completed - infra, 0)  # one trial per task; the infra ones first, the rest graded evenly
    n_scored = graded if scored is None else scored  # of the graded, the first `scored` have their reward
    tasks = {f"task-{i:03d}": (1, 1, completed * 0.5 / n_scored) if infra <= i < infra + n_scored else (1, 0, 0.0)
             for i in range(completed)}
    return RunDirFacts(
        run_tag=tag, path=f"/jobs/{tag}", has_config=True, has_result=has_result, n_total=total,
        n_trial_dirs=completed if trial_dirs is None else trial_dirs, n_completed=completed,
        n_scored=n_scored, n_infra_errors=infra, n_graded=graded,
        n_answered=completed, n_usage_reported=completed, tasks=tasks,
        reward_sum=completed * 0.5, started_at=ago(hours=3),
        finished_at=ago(hours=2) if finished else None, last_progress_at=last_progress or ago(hours=2),
        fires=fires, no_resume=no_resume, model=model, benchmark_name=benchmark_name, agent=agent,
    )


def obs(*, rows: tuple[ObservedRow, ...] = (), subs: tuple[Submission, ...] = (), jobs: tuple[ObservedJob, ...] = (),
        dirs: tuple[RunDirFacts, ...] = ()) -> Observation:
    return Observation(rows=rows, submissions=subs, jobs=jobs, run_dirs=dirs)


def cell_of(run: RunDirFacts, **changes: object) -> Cell:
    """A cell the run dir says it evaluated (what it does not say, the builder's default); without Harbor's total,
    its catalog says the benchmark has as many tasks as the dir ran."""
    named = {"model": run.model, "benchmark_name": run.benchmark_name, "dataset": run.dataset, "agent": run.agent,
             "timeout_multiplier": run.timeout_multiplier,
             "tasks": len(run.tasks) or None if run.n_total is None else None}
    return cell(**{key: value for key, value in named.items() if value is not None} | changes)  # type: ignore[arg-type]


def gate(run: RunDirFacts, c: Cell | None = None, *, requests: int | None = 1, **policy: object) -> Admission:
    """The admission gate's verdict on a run dir read whole (no fires left to resume it)."""
    return admit(c or cell_of(run), run, POLICY.admission.model_copy(update=policy), requests=requests)


def admitted(run: RunDirFacts, c: Cell | None = None, **policy: object) -> Admitted:
    """The verdict on a run dir the test takes to be admissible: failing here names what the gate refused."""
    verdict = gate(run, c, **policy)
    assert isinstance(verdict, Admitted), verdict.summary()
    return verdict


def metrics_of(run: RunDirFacts, errors: ErrorClasses, c: Cell | None = None, **policy: object) -> RunMetrics:
    """What an upload of the run dir would write: the gate's numbers."""
    return run_metrics(admitted(run, c, **policy), run, errors)
