"""The union of a sharded cell's shard run dirs (RULES §17): one run dir of the cell, as the planner uploads it and
`db audit` judges it. Pure."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from controller.core.observed import RunDirFacts, Submission
from controller.core.types import Cell

_SUMMED = ("n_trial_dirs", "n_completed", "n_scored", "n_infra_errors", "n_benign_errors", "n_graded", "n_invalid",
           "n_fractional", "n_answered", "n_usage_reported", "n_instant_failures", "n_started_trials")


def union_of(cell: Cell, parts: Sequence[tuple[Cell, RunDirFacts]],
             own: Sequence[Submission]) -> RunDirFacts | str:
    """One run dir of the cell from one run dir of each shard (their order): counts summed, tasks joined, the
    shards' claims less their task subsets (each shard's gate judges its own); or why they make none (a task two
    shards ran). Its run tag is the cell's, numbered past every attempt the cell launched itself (`own`: before
    it ran as shards) by the shards' attempts, so a shard run again makes another union, and another row."""
    done = [facts for _, facts in parts]
    tasks: dict[str, tuple[int, int, float]] = {}
    for facts in done:
        if shared := sorted(tasks.keys() & facts.tasks.keys()):
            return f"shards share tasks ({', '.join(shared[:3])}): their union is no run of the benchmark"
        tasks |= facts.tasks
    first_attempt = 1 + max((sub.attempt for sub in own), default=0)
    attempt = first_attempt + sum((shard.attempt_of(facts.run_tag) or 1) - 1 for shard, facts in parts)
    totals = [facts.n_total for facts in done]
    ends = [facts.finished_at for facts in done]
    progress = [facts.last_progress_at for facts in done if facts.last_progress_at is not None]
    starts = [facts.started_at for facts in done if facts.started_at is not None]
    return done[0].model_copy(update={
        **{name: sum(getattr(facts, name) for facts in done) for name in _SUMMED},
        "run_tag": cell.run_tag(attempt), "shards": tuple(facts.path for facts in done),
        "has_config": all(facts.has_config for facts in done), "has_result": all(facts.has_result for facts in done),
        "n_total": None if None in totals else sum(t for t in totals if t is not None),
        "invalid": next((facts.invalid for facts in done if facts.invalid), ""),
        "fractional": next((facts.fractional for facts in done if facts.fractional), ""),
        "error_breakdown": dict(sum((Counter(facts.error_breakdown) for facts in done), Counter())),
        "infra_error_breakdown": dict(sum((Counter(facts.infra_error_breakdown) for facts in done), Counter())),
        "reward_sum": sum(facts.reward_sum for facts in done), "tasks": tasks,
        "started_at": min(starts, default=None),
        "finished_at": None if None in ends else max(end for end in ends if end is not None),
        "last_progress_at": max(progress, default=None),
        "fires": max(facts.fires for facts in done), "no_resume": any(facts.no_resume for facts in done),
        "quiet_failures": tuple(failure for facts in done for failure in facts.quiet_failures),
        "recorded": tuple(dict.fromkeys(claim for facts in done for claim in facts.recorded if claim.what != "tasks")),
    })


def newest_dir(shard: Cell, dirs: Sequence[RunDirFacts]) -> RunDirFacts | None:
    """The shard's newest run dir of its own (by attempt): a shard run again replaces its earlier run."""
    own = [facts for facts in dirs if shard.attempt_of(facts.run_tag) is not None]
    return max(own, key=lambda facts: shard.attempt_of(facts.run_tag) or 0, default=None)
