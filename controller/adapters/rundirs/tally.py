"""What the trial results of one run dir add up to (RULES §14 classes, rewards per task, quiet failures), and the
reader that parses a run dir's files, keeping the first it could not read."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar, cast

from controller.adapters.rundirs.harbor_format import (
    FormatError,
    TrialOutcome,
    trial_outcome,
)
from controller.adapters.rundirs.localfs import (
    TRIAL_RESULT,
    Content,
    StatKey,
    Unreadable,
)
from controller.adapters.rundirs.tree import TrialRead
from controller.core.observed import QuietFailure, Recorded, RecordedWhat
from controller.core.trial_errors import UNGRADED, ErrorClasses, ErrorKind

log = logging.getLogger(__name__)
T = TypeVar("T")


class Reader:
    """Parses the files of one run dir, keeping the first that could not be read as '<path>: <why>'."""

    def __init__(self, run_path: str) -> None:
        self.run_path = run_path
        self.problem = ""

    def parse(self, name: str, content: Content | None, parse: Callable[[bytes], T]) -> T | None:
        """`parse(content)`; None when the file is absent, or cannot be read (then noted)."""
        if content is None:
            return None
        if isinstance(content, Unreadable):
            reason = content.reason
        else:
            try:
                return parse(content)
            except FormatError as exc:
                reason = str(exc)
        self.problem = self.problem or f"{self.run_path}/{name}: {reason}"
        return None


def tally(trials: Iterable[TrialRead], errors: ErrorClasses, reader: Reader,
           remember: Callable[[str, StatKey, TrialOutcome], None] | None = None) -> dict[str, Any]:
    """Per-trial counts, each completed trial in exactly one class (RULES §14): graded (no exception, a usable
    reward), the model's failure (an exception the catalog lists as the model's), invalid (a reward that is no
    number in [0, 1], or under another key), or infra (every other exception, and a trial nobody graded). Reward
    sums cover the scored trials (graded and the model's failures), per task as well, so the core can drop what it
    files as infra later and cluster the standard error by task.

    A trial is classified by the one exception that decides it, of its own and its steps' (`decided`). The infra
    trials are also counted by class on their own (`infra_error_breakdown`): a class name is not a kind (an ungraded
    AgentTimeoutError is infra, a graded one the model's failure), and the infra breakdown must hold every one.
    Each completed trial that raised without an output token, and each graded one whose agent reported 0 of them
    or never ran (no agent_execution, no agent_result), is also listed as a `QuietFailure`: the core, which knows
    the EvalRun's `instant_fail` and whether the agent calls a model, moves those that are no measurement to infra.
    Stops at the first trial result `reader` cannot read: the counts are then not data anyway.
    """
    tally = _Tally(errors)
    for trial in trials:
        tally.n_dirs += 1
        if trial.known is not None:
            outcome: TrialOutcome | None = cast(TrialOutcome, trial.known)
        else:
            outcome = reader.parse(f"{trial.name}/{TRIAL_RESULT}", trial.result, trial_outcome)
            if reader.problem:
                break
            if outcome is not None and remember is not None and trial.key is not None:
                remember(trial.name, trial.key, outcome)
        if outcome is None:
            tally.n_started += int(trial.agent_active)  # no result yet: its agent is working, or it is only created
            continue
        tally.add(trial, outcome)
    return tally.fields()


def decided(outcome: TrialOutcome, errors: ErrorClasses) -> TrialOutcome:
    """The trial as the one exception that decides its class, of all Harbor recorded (its own, then each step's,
    as `TrialResult.recorded_exceptions` lists them): one that interrupted it (Harbor re-runs a trial any of
    whose exceptions is a cancel), else the first that is not the model's own failure (a step that measured
    nothing leaves the trial's reward, a mean over the steps verified, no measurement of the model), else the
    first."""
    if not outcome.step_exceptions:
        return outcome
    recorded = [(name, origin) for name, origin in ((outcome.exception_type, outcome.exception_qualified),
                                                    *outcome.step_exceptions) if name is not None]
    interrupted = [e for e in recorded if e[0] in errors.interrupted]
    not_the_models = [e for e in recorded
                      if errors.classify(e[0], outcome.reward is not None, e[1]) is ErrorKind.INFRA]
    name, origin = (interrupted or not_the_models or recorded)[0]
    return outcome._replace(exception_type=name, exception_qualified=origin, step_exceptions=())


def completed(outcome: TrialOutcome, errors: ErrorClasses) -> bool:
    """Whether `tally` counts the trial of this result as completed: no cancel interrupted it (a resume runs it
    again). What else reads a run dir's trials (the post-eval step statistics) describes the same trials."""
    return decided(outcome, errors).exception_type not in errors.interrupted


@dataclass
class _Tally:
    """The counts `_tally` builds, one trial result at a time."""

    errors: ErrorClasses
    n_dirs: int = 0
    n_started: int = 0
    n_completed: int = 0
    n_scored: int = 0
    n_graded: int = 0
    n_answered: int = 0
    n_reported: int = 0
    reward_sum: float = 0.0
    newest: float | None = None
    invalid: list[str] = field(default_factory=list)
    fractional: list[str] = field(default_factory=list)
    quiet: list[QuietFailure] = field(default_factory=list)
    kinds: Counter[ErrorKind] = field(default_factory=Counter)
    classes: Counter[str] = field(default_factory=Counter)
    infra_classes: Counter[str] = field(default_factory=Counter)  # the classes of the infra trials alone
    tasks: dict[str, tuple[int, int, float]] = field(default_factory=dict)
    recorded: set[tuple[RecordedWhat, str]] = field(default_factory=set)  # (what, value) the trials name, distinct

    def add(self, trial: TrialRead, outcome: TrialOutcome) -> None:
        self.n_started += 1
        self._record(outcome)
        if trial.mtime is not None and (self.newest is None or trial.mtime > self.newest):
            self.newest = trial.mtime
        outcome = decided(outcome, self.errors)
        reward, exception_type = outcome.reward, outcome.exception_type
        if exception_type in self.errors.interrupted:
            return  # not completed: a resume runs it again
        self.n_completed += 1
        task = outcome.task or trial.name.split("__", 1)[0]
        seen, scored, task_sum = self.tasks.get(task, (0, 0, 0.0))
        seen += 1
        self.n_reported += outcome.n_output_tokens is not None
        self.n_answered += bool(outcome.n_output_tokens)
        problem = outcome.reward_problem or (
            f"reward {reward:g} is outside [0, 1]" if reward is not None and not 0.0 <= reward <= 1.0 else None)
        if reward is not None:
            self.n_scored += 1
        if problem is not None:
            self.invalid.append(f"{trial.name}/{TRIAL_RESULT}: {problem}")
            self.tasks[task] = (seen, scored, task_sum)
            return
        if reward is not None and 0.0 < reward < 1.0:
            self.fractional.append(f"{trial.name}/{TRIAL_RESULT}: reward {reward:g}")
        kind = self._kind(outcome)
        if (exception_type is not None and not outcome.n_output_tokens) or (
                kind is None and (outcome.n_output_tokens == 0 or not outcome.agent_ran)):
            self.quiet.append(QuietFailure(exception_type=exception_type, kind=kind,
                                           agent_seconds=outcome.agent_seconds, reward=reward,
                                           answered=bool(outcome.n_input_tokens), task=task))
        if kind is not ErrorKind.INFRA:
            value = reward or 0.0
            scored += 1
            task_sum += value
            self.reward_sum += value
        self.tasks[task] = (seen, scored, task_sum)

    def _record(self, outcome: TrialOutcome) -> None:
        """What the trial says it ran, whether or not it completed: a cancelled trial of another model is one too."""
        named: tuple[tuple[RecordedWhat, str | None], ...] = (
            ("model", outcome.model), ("dataset", outcome.source), ("dataset", outcome.task_dir))
        self.recorded.update((what, value) for what, value in named if value)

    def _kind(self, outcome: TrialOutcome) -> ErrorKind | None:
        """The class of a completed trial with a valid reward or none: None when graded."""
        if outcome.exception_type is not None:
            self.classes[outcome.exception_type] += 1
            kind: ErrorKind | None = self.errors.classify(outcome.exception_type, outcome.reward is not None,
                                                          outcome.exception_qualified)
        elif outcome.reward is None:
            self.classes[UNGRADED] += 1
            kind = ErrorKind.INFRA
        else:
            self.n_graded += 1
            kind = None
        if kind is not None:
            self.kinds[kind] += 1
        if kind is ErrorKind.INFRA:
            self.infra_classes[outcome.exception_type or UNGRADED] += 1
        return kind

    def fields(self) -> dict[str, Any]:
        return {
            "n_trial_dirs": self.n_dirs,
            "n_completed": self.n_completed,
            "n_scored": self.n_scored,
            "n_graded": self.n_graded,
            "n_infra_errors": self.kinds[ErrorKind.INFRA],
            "n_benign_errors": self.kinds[ErrorKind.BENIGN],
            "n_invalid": len(self.invalid),
            "invalid": self.invalid[0] if self.invalid else "",
            "n_fractional": len(self.fractional),
            "fractional": self.fractional[0] if self.fractional else "",
            "n_answered": self.n_answered,
            "n_usage_reported": self.n_reported,
            "error_breakdown": self.errors.breakdown(self.classes),
            "infra_error_breakdown": dict(sorted(self.infra_classes.items())),
            "reward_sum": self.reward_sum,
            "tasks": self.tasks,
            "last_progress_at": datetime.fromtimestamp(self.newest, UTC) if self.newest is not None else None,
            "quiet_failures": tuple(self.quiet),
            "n_started_trials": self.n_started,
            "recorded": tuple(Recorded(what=what, value=value, source="trials") for what, value in sorted(self.recorded)),
        }
