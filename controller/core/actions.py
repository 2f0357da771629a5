"""The actions a plan is made of: one small frozen type per action with the fields its execution needs, and a
`Step` per thing the actor does, which is also how Kubernetes Events are named. A closed set: a new action is a new
member here, so every `match` over them is checked by mypy.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, ClassVar, Literal

from pydantic import Field

from controller.core.admission import Admitted
from controller.core.observed import RunDirFacts
from controller.core.remedies import QuarantineKind
from controller.core.types import Frozen, NotedStrEnum, submission_name


class ActionKind(StrEnum):
    SUBMIT = "submit"
    RESUME = "resume"
    CANCEL = "cancel"
    ANALYZE = "analyze"
    UPLOAD = "upload"  # to the results DB, then (with a tracker) to MLflow; each read back
    TRACK = "track"  # to MLflow only, read back (upload.db off, or its Finished row holds the same numbers)
    QUARANTINE = "quarantine"  # a node, a pinggy pair or a cluster's launches, for a while
    WAIT = "wait"
    SKIP = "skip"
    HOLD = "hold"


class Step(NotedStrEnum):
    """What the actor did, in outcomes, the CLI's summary and (as `event_reason`) Kubernetes Events."""

    @property
    def event_reason(self) -> str:
        return self.note

    SUBMIT = "submit", "Submit"
    RESUME = "resume", "Resume"
    CANCEL = "cancel", "Cancel"
    ANALYZE = "analyze", "Analyze"
    UPLOAD = "upload", "Upload"
    TRACK = "track", "Track"
    QUARANTINE = "quarantine", "Quarantine"
    BOOKKEEPING = "bookkeeping", "Bookkeeping"
    RELEASE_TUNNELS = "release pinggy pairs", "ReleasePinggyPairs"


class _Action(Frozen):
    kind: ActionKind
    reason: str

    def render(self) -> str:
        return f"{self.kind.value}: {self.reason}"


class _Mutation(_Action):
    """An action that changes the world; `suspend` turns it into a hold."""

    step: ClassVar[Step]


class _Launch(_Mutation):
    """A job to start on a run dir, by the create-pending protocol."""

    run_tag: str
    attempt: int
    fire: int
    row_id: str | None = Field(None, description="the row it reuses; None: a new one, with a deterministic id")
    tunnel: str | None = Field(None, description="pinggy pair the launched job uses (installed-agent cells)")
    intent_at: datetime | None = Field(None, description="when the intent being repaired was recorded")
    exclude_nodes: tuple[str, ...] = Field((), description="nodes of the cluster quarantined as bad")
    job_env: dict[str, str] = Field(default_factory=dict, description="what a remedy adds to the job's environment")
    time_limit: str | None = Field(None, description="its --time when sized (walltime auto); None: the cell's")
    estimated_hours: float | None = Field(None, description="when sized: how long its job is expected to run")

    @property
    def submission_name(self) -> str:
        return submission_name(self.run_tag, self.fire)


class Submit(_Launch):
    """A new attempt (a fresh run dir), or the repair of one whose intent was recorded."""

    step: ClassVar[Step] = Step.SUBMIT
    kind: Literal[ActionKind.SUBMIT] = ActionKind.SUBMIT
    fire: Literal[1] = 1


class Resume(_Launch):
    """`harbor jobs resume` on an existing run dir: the `fire`-th job on it."""

    step: ClassVar[Step] = Step.RESUME
    kind: Literal[ActionKind.RESUME] = ActionKind.RESUME


class Cancel(_Mutation):
    step: ClassVar[Step] = Step.CANCEL
    kind: Literal[ActionKind.CANCEL] = ActionKind.CANCEL
    job_id: str
    clears_way_for_launch: bool = Field(False, description="it only makes room for this cell's launch: when the "
                                                           "launch cannot go ahead this pass, neither does it")


class Analyze(_Mutation):
    """Write the post-eval report of a run dir."""

    step: ClassVar[Step] = Step.ANALYZE
    kind: Literal[ActionKind.ANALYZE] = ActionKind.ANALYZE
    facts: RunDirFacts
    admitted: Admitted = Field(description="what the admission gate said: the numbers the report shows")


class Upload(_Mutation):
    """Its metrics to the results DB (and, with a tracker, MLflow), each read back."""

    step: ClassVar[Step] = Step.UPLOAD
    kind: Literal[ActionKind.UPLOAD] = ActionKind.UPLOAD
    facts: RunDirFacts
    admitted: Admitted = Field(description="the admission gate's numbers and evidence: what is written")
    row_id: str | None = Field(description="our row of the run; None: an orphan dir, given a row of ours first")
    gpu_hours: float | None = Field(None, description="the attempt's actual GPU-hours: its row's stats, MLflow")
    is_overlong: bool = Field(False, description="the run took longer than upload.overlongHours: written to its row")


class Track(_Mutation):
    """To MLflow only, read back: upload.db is off, or the run's Finished row already holds these numbers."""

    step: ClassVar[Step] = Step.TRACK
    kind: Literal[ActionKind.TRACK] = ActionKind.TRACK
    facts: RunDirFacts
    admitted: Admitted
    gpu_hours: float | None = None


class Quarantine(_Mutation):
    """Do not use a node, a pinggy pair or a cluster's launches for `ttl_s` seconds (by the store's clock)."""

    step: ClassVar[Step] = Step.QUARANTINE
    kind: Literal[ActionKind.QUARANTINE] = ActionKind.QUARANTINE
    subject: QuarantineKind
    scope: str
    name: str
    ttl_s: float
    owner: str = Field("", description="the EvalRun whose pass decided it, shown with it and kept in the store")


class Wait(_Action):
    kind: Literal[ActionKind.WAIT] = ActionKind.WAIT


class Skip(_Action):
    kind: Literal[ActionKind.SKIP] = ActionKind.SKIP


class Hold(_Action):
    """A human decides; the reason says what to look at."""

    kind: Literal[ActionKind.HOLD] = ActionKind.HOLD
    release: str = Field("", description="the command that releases it, where that is not `evalctl retry`, "
                                         "without the store arguments the printing command adds ('': none)")


Launch = Submit | Resume
Mutation = Submit | Resume | Cancel | Analyze | Upload | Track | Quarantine
Action = Annotated[Submit | Resume | Cancel | Analyze | Upload | Track | Quarantine | Wait | Skip | Hold,
                   Field(discriminator="kind")]
