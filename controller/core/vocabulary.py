"""The words a plan is written in: phases, the rules that decide, the plan, and what acting said (the actions are
in `actions`).

Closed sets: a `Rule` per row of docs/RULES.md (live numbers go in the reason, never in the rule). A new rule is a
new member here, so every `match` over them is checked by mypy rather than held together by convention.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Literal, final

from pydantic import Field

from controller.core.actions import Action, Hold, Step
from controller.core.admission import Admitted, Refused
from controller.core.gpu_hours import GpuBudget, GpuEstimate
from controller.core.intake import Selection
from controller.core.observed import RowStatus, RunDirFacts, TunnelLease
from controller.core.progress import Progress, progress_of
from controller.core.remedies import CellMemory, Quarantined
from controller.core.retry import RetryRequest
from controller.core.types import Cell, EvalRunRef, Frozen, NotedStrEnum
from controller.core.walltime import Learning


class Phase(StrEnum):
    PENDING = "Pending"
    SUBMITTED = "Submitted"
    RUNNING = "Running"
    STALLED = "Stalled"
    SETTLING = "Settling"
    EVALUATED = "Evaluated"
    COMPLETED = "Completed"
    FAILED = "Failed"
    UNKNOWN = "Unknown"


class Rule(NotedStrEnum):
    """The row of the rule tables that decided a cell. The value is a stable id (`plan -o json`, metrics); the
    citation names the row for a person (`evalctl explain`)."""

    @property
    def citation(self) -> str:
        return self.note

    # RULES §12: fail closed, one owner, the submission protocol
    OBSERVATION_FAILED = "ObservationFailed", "RULES §12: observation failed → Unknown; nothing is submitted or cancelled"
    RUN_DIR_UNREADABLE = ("RunDirUnreadable",
                          "RULES §12: unreadable run dir → Unknown; no upload, resume or submit until it can be read")
    OWNED_ELSEWHERE = ("OwnedElsewhere",
                       "RULES §12: one cell, one owner; another EvalRun claimed it first → observe only")
    SUBMISSION_REPAIR = "SubmissionRepair", "RULES §12: create-pending protocol, step 2–3 repair"
    DELETION_CANCEL = ("DeletionCancel",
                       "RULES §12: deletionPolicy Cancel → cancel the live jobs of the cells this EvalRun owns")
    PREFLIGHT_FAILED = ("PreflightFailed", "RULES §12: the cluster's preflight failed → hold its launches until "
                                           "fixed (could not run → wait); its jobs are still watched")
    # RULES §15: several clusters
    NO_FREE_CLUSTER = ("NoFreeCluster", "RULES §15: no cluster the cell may run on has a free slot (or may be "
                                        "used) this pass → wait; placed when one has")
    SPILL = ("Spill", "RULES §15: queued past placement.spillAfterMinutes, never started, another cluster has a free "
                      "slot → cancel; placed anew once accounting shows it never started")
    NO_ELIGIBLE_CLUSTER = ("NoEligibleCluster", "RULES §15: none of the EvalRun's clusters may run the cell (pins, "
                                                "maxTimeLimit) → hold until the spec changes")
    # RULES §13: a job that failed needs a human
    JOB_FAILED_DIR_UNSEEN = ("JobFailedRunDirUnseen",
                             "RULES §13: FAILED / OUT_OF_MEMORY, run dir not visible → hold for a human "
                             "(evalctl retry releases it)")
    JOB_FAILED_AT_START = ("JobFailedAtStart", "RULES §13: FAILED at start / OUT_OF_MEMORY → hold for a human "
                                               "(evalctl retry releases it)")
    # RULES §2 with a job in the queue
    QUEUED_STALE = "QueuedStale", "RULES §2: Pending, older than stalePendingHours → cancel, then start"
    QUEUED = "Queued", "RULES §2: Pending, younger than stalePendingHours → skip"
    # RULES §5: a running job
    PRE_WALLTIME = "PreWalltime", "RULES §5: pre-walltime"
    ZOMBIE = "Zombie", "RULES §5: zombie → cancel, upload"
    STUCK_NEAR_COMPLETE = "StuckNearComplete", "RULES §5: stuck near complete → cancel, post-eval"
    STUCK_GENERAL = "StuckGeneral", "RULES §5: stuck general → report Stalled"
    STUCK_GENERAL_AGAIN = ("StuckGeneralSecondReading",
                           "RULES §5: stuck general, second consecutive reading → cancel, post-eval")
    IN_FLIGHT = "InFlight", "RULES §4: IN_FLIGHT → wait"
    # RULES §2: nothing queued or running, the newest matching row decides
    NO_EXISTING_JOB = "NoExistingJob", "RULES §2: none → start (no existing job)"
    JOB_FINISHED = "JobFinished", "RULES §2: finished with metrics → skip (job finished)"
    METRICS_CLEARED = "MetricsCleared", "RULES §2: finished, metrics cleared → start (finished but metrics cleared)"
    STARTED_FRESH = "StartedFresh", "RULES §2: started, young → skip (job in progress)"
    STARTED_STALE = "StartedStale", "RULES §2: started, stale → start (stale started)"
    PENDING_FRESH = "PendingFresh", "RULES §2: pending, young → skip (job pending)"
    PENDING_STALE = "PendingStale", "RULES §2: pending, stale → start (stale pending)"
    UNRECOGNISED_STATUS = ("UnrecognisedStatus",
                           "RULES §2: unrecognised job_status → skip (unrecognised job_status; a human decides)")
    # RULES §4: the run dir decides
    DIR_SETTLING = "Settling", "RULES §4: SETTLING → wait"
    DIR_REJECTED = "Rejected", "RULES §4: REJECTED → upload as is"
    DIR_AT_RESUME_LIMIT = "AtResumeLimit", "RULES §4: AT_RESUME_LIMIT → upload as is"
    DIR_EARLY_KILL = "EarlyKill", "RULES §4: EARLY_KILL → resume"
    DIR_INCOMPLETE = "Incomplete", "RULES §4: INCOMPLETE → resume"
    DIR_PARTIAL = "Partial", "RULES §4: PARTIAL → resume"
    DIR_PARTIAL_OK = "PartialOk", "RULES §4: PARTIAL_OK → upload"
    DIR_DONE_WITH_ERRORS = "DoneWithErrors", "RULES §4: DONE_WITH_ERRORS → resume"
    DIR_DONE = "Done", "RULES §4: DONE → upload"
    SETTLE_AFTER_CANCEL = ("SettleAfterCancel",
                           "RULES §3: after a kill, sandboxes keep writing → settling, not finished")
    MONITOR_CANCELLED = ("UploadAsIsAfterMonitorCancel",
                         "RULES §5: the monitor cancelled it → post-eval, upload as is, no resume")
    # RULES §5: verification and the upload gates
    # RULES §8, §9: launch health, and the remedies of the failure catalog
    DEAD_LAUNCH = ("DeadLaunch", "RULES §8: every completed trial an instant failure → dead launch: cancel, "
                                 "refire or hold; never a score")
    LAUNCH_STALLED = ("LaunchStalled",
                      "RULES §8: no trial started within health.launchGraceMinutes → cancel, refire")
    PINGGY_NOT_WIRED = ("PinggyNotWired", "RULES §8: trials call an api_base that is not the leased pinggy URL → "
                                          "cancel, release the pair, hold")
    PINGGY_LOCKED = ("PinggyLocked", "RULES §8: 'a tunnel with the same token is already active' → cancel, lock "
                                     "the pair for an hour, refire on another")
    KNOWN_FAILURE = "KnownFailure", "RULES §9: a catalogued failure in the job's output → its remedy"
    NO_TRAFFIC = ("NoTraffic", "RULES §8: no chat completions for health.noTrafficMinutes after vLLM was ready "
                               "→ report Stalled")
    BAD_REQUESTS = ("BadRequests", "RULES §8: 400 share above health.badRequestFraction → report Stalled "
                                   "(context overflow?)")
    REFIRE = ("Refire", "RULES §9: a remedied attempt → a new attempt after health.refireBackoffMinutes, at most "
                        "health.maxRefires per cell")
    REFIRES_EXHAUSTED = "RefiresExhausted", "RULES §9: health.maxRefires refires used → hold with the diagnosis"
    RETRY = ("Retry", "RULES §13: a human asked to retry a held cell (evalctl retry, evalrun.io/retry) → one new "
                      "attempt, with fresh refire and resume bounds")
    VERIFY_UPLOAD = "VerifyUpload", "RULES §5: verify, don't trust exit codes → Completed only once read back"
    UPLOAD_GATE = ("UploadGate", "RULES §5: upload gate: overlong (upload.overlongHours) with upload.overlong: hold "
                                 "→ hold until upload.forceUpload")

    # RULES §14: the admission gate, before every upload
    ADMISSION_IDENTITY = ("AdmissionIdentity", "RULES §14: a file of the run dir (config.json, meta.env, a trial "
                                               "result) records another model, dataset, benchmark, agent, timeout "
                                               "multiplier or nAttempts than the cell, or more tasks than the catalog "
                                               "→ hold, an incident; never uploaded")
    ADMISSION_INVALID_REWARD = ("AdmissionInvalidReward", "RULES §14: a reward out of [0, 1], not a number, under "
                                                          "another key, or fractional without partial credit → hold")
    ADMISSION_NO_TRAFFIC = ("AdmissionNoTraffic", "RULES §14: no trial shows the model answering → a dead launch: "
                                                  "refire, then hold")
    ADMISSION_NO_TOTAL = ("AdmissionNoTotal", "RULES §14: neither the catalog nor Harbor gives the expected trials "
                                              "→ hold")
    ADMISSION_INCOMPLETE = ("AdmissionIncomplete", "RULES §14: distinct (task, attempt) pairs short of the expected "
                                                   "trials → resume, then hold (or upload.partial: upload)")
    ADMISSION_INFRA_SHARE = ("AdmissionInfraShare", "RULES §14: infra share above upload.maxInfraErrorFraction → "
                                                    "resume, then hold (or upload.partial: upload)")
    ADMISSION_NOTHING_SCORED = ("AdmissionNothingScored", "RULES §14: no trial graded or failed as the model's own "
                                                          "→ hold")

    # RULES §17: a cell run as shards
    SHARD_DONE = ("ShardDone", "RULES §17: a shard's run dir passed its own admission gate → it waits; the cell "
                               "uploads the union of its shards' run dirs, never a shard alone")
    SHARDS_AGAIN = ("ShardsAgain", "RULES §17: the union's row was cleared (a run again, §2) → each shard starts a "
                                   "new attempt")
    SHARDS_CHOSEN = ("ShardsChosen", "RULES §17: walltime auto, no shards set, and a first launch's sized request "
                                     "exceeds maxTimeLimit → it launches nothing; the fewest shards whose requests "
                                     "fit are remembered with the cell, and it runs as them")
    SHARDS = ("Shards", "RULES §17: a sharded cell launches nothing itself → its shards run it; once each shard's "
                        "newest run dir is admitted, their union goes through the cell's gate and is uploaded")


class HealthState(StrEnum):
    ALIVE = "alive"
    LAUNCHING = "launching"
    STALLED = "stalled"  # running, but a health rule found it not working (reported, not cancelled)
    DEAD = "dead"  # being cancelled: a dead launch, an unwired or locked tunnel, a known failure


# --------------------------------------------------------------------------- the plan


class RowUpdate(Frozen):
    """Bookkeeping that brings our records in line with what was observed (not an action on the world).

    Either moves our row along Pending → Started, or records the id of a job found by its name
    (the repair of a crash between `sbatch` and step 3 of the submission protocol), or both.
    """

    row_id: str | None = None
    status: RowStatus | None = None
    started_at: datetime | None = None
    submission_name: str | None = None
    job_id: str | None = None
    gpu_hours: float | None = Field(None, description="the actual GPU-hours of the ended job of `submission_name`")
    elapsed_hours: float | None = Field(None, description="how long the ended job of `submission_name` ran")


@final  # never subclassed: the planner tests a decision's class exactly (planner.fleet.launch_of)
class CellPlan(Frozen):
    cell: Cell
    phase: Phase
    actions: tuple[Action, ...]
    reason: str
    rule: Rule = Field(description="the row of the rule tables that decided, for `evalctl explain`")
    row_updates: tuple[RowUpdate, ...] = ()
    run_dir: RunDirFacts | None = None
    score: float | None = Field(None, description="the uploaded row's accuracy; None until a result is uploaded")
    eta_at: datetime | None = Field(None, description="when a job was found working on its trials: the time its ETA "
                                                     "is reckoned at (None: no ETA)")
    memory: CellMemory = Field(CellMemory(), description="the cell's memory as observed this pass")
    remember: CellMemory | None = Field(None, description="the cell's memory after this pass, written before its "
                                                          "actions (None: unchanged)")
    health: HealthState | None = Field(None, description="of a running job: does it work (RULES §8)")
    health_note: str = Field("", description="the verdict in words: 'alive: 14 trials scored, 42 req/min, …'")
    gpu_hours: float | None = Field(None, description="actual GPU-hours of this EvalRun's jobs of the cell, summed "
                                                      "(None: none known)")
    admission: Admitted | Refused | None = Field(None, description="what the admission gate said of its run dir, "
                                                                   "where it was asked")
    n_scored: int | None = Field(None, description="the uploaded row's scored trials (n_valid_trials)")
    provisional: bool | None = Field(None, description="the score rests on fewer than report.trustThreshold scored "
                                                       "trials")
    partial: bool | None = Field(None, description="its score was uploaded under upload.partial: upload (incomplete, "
                                                   "or over the infra share)")
    evidence: str = Field("", description="the admission gate's evidence in words, where it was asked")
    refire_due: datetime | None = Field(None, description="a refire waiting out its back-off: when it goes")
    retry: RetryRequest | None = Field(None, description="a human's retry request not consumed yet (RULES §13)")

    @property
    def progress(self) -> Progress | None:
        """Scored of expected trials and an ETA, from its run dir: derived where it is shown (the table, `-o json`,
        `watch`), since a pass over 10,000 cells reads none (docs/DECISIONS.md, "Progress derived where shown")."""
        return progress_of(self.run_dir, self.cell.n_attempts, self.eta_at)

    @property
    def held(self) -> bool:
        """Failed with a hold: a human's turn, and what `evalctl retry` releases. A hold in another phase (the GPU
        budget, a failed preflight, a suspended EvalRun, …) is lifted by what its reason names, not by a retry."""
        return self.phase == Phase.FAILED and self.holds != ()

    @property
    def holds(self) -> tuple[Hold, ...]:
        """The holds in its plan, whatever its phase: the controller will not do what they replace on its own."""
        return tuple(a for a in self.actions if isinstance(a, Hold))

    @property
    def hold_reason(self) -> str:
        """Why it is held, in the words that name what releases it: its reason where a hold decided it, and each
        hold that says more (a launch the budget or a preflight holds keeps its cell's reason); '' when not held."""
        holds = self.holds
        own = [self.reason] if any(h.reason in self.reason for h in holds) else []
        return "; ".join(dict.fromkeys([*own, *(h.reason for h in holds if h.reason not in self.reason)]))

    @property
    def trust_note(self) -> str:
        """'provisional, n=36', 'partial', both or '': what a score is never shown without (RULES §14)."""
        flags = (f"provisional, n={self.n_scored}" if self.provisional else "", "partial" if self.partial else "")
        return ", ".join(flag for flag in flags if flag)


EffectKind = Literal["back-off", "node", "pinggy-pair", "refire"]


class Effect(Frozen):
    """A remedy in force (RULES §9): what it takes out of use or waits for, why, from when to when, and whose pass
    decided it. Back-offs, node and pair quarantines are records of the controller state; a pending refire is
    its cell's remembered remedy."""

    kind: EffectKind
    subject: str = Field(description="the cluster, node, pair, or cell it applies to")
    cause: str
    since: datetime | None = Field(None, description="None: recorded before versions kept it")
    until: datetime
    owner: str = Field("", description="the EvalRun whose pass decided it")

    def line(self) -> str:
        since = f"since {self.since:%Y-%m-%d %H:%M}, " if self.since is not None else ""
        owner = f" (by {self.owner})" if self.owner else ""
        return f"{self.kind} {self.subject}: {since}until {self.until:%Y-%m-%d %H:%M} UTC{owner}: {self.cause}"


class Plan(Frozen):
    evalrun: EvalRunRef
    cells: tuple[CellPlan, ...]
    suspended: bool = False
    tunnel_releases: tuple[TunnelLease, ...] = Field((), description="pinggy leases whose job is over")
    quarantined: tuple[Quarantined, ...] = Field((), description="its cluster's bad nodes and back-off, its locked "
                                                                 "pairs: what status lists")
    estimates: dict[str, GpuEstimate] = Field(default_factory=dict, description="cell key → estimated GPU-hours "
                                                                                 "of one attempt")
    gpu_budget: GpuBudget = Field(GpuBudget(), description="GPU-hours spent and committed, against maxGpuHours")
    effects: tuple[Effect, ...] = Field((), description="every remedy in force that touches it: back-offs, "
                                                        "quarantines, locked pairs, refires waiting")
    preflight: str = Field("", description="why its cluster's launches are held: the preflight failed (RULES §12); "
                                           "'' when none was held")
    walltime: Learning | None = Field(None, description="walltime auto: what its sized jobs ran against their "
                                                        "estimate, and the margin that follows (RULES §16)")
    clusters: dict[str, str] = Field(default_factory=dict, description="several clusters (RULES §15): cell key → "
                                                                       "the cluster it ran on or is placed on now")

    def estimate(self, cell: CellPlan) -> GpuEstimate | None:
        """A cell's estimate when it has not run yet (no GPU-hours of its own, not done): what `plan` shows."""
        if cell.gpu_hours is not None or cell.phase in (Phase.COMPLETED, Phase.EVALUATED):
            return None
        return self.estimates.get(cell.cell.key)


class PassNotes(Frozen):
    """What a pass adds beside the planner's `Plan` (which stays the planner's pure output): the modelSelector's
    intake, read before planning, and the webhook messages still undelivered, read after acting."""

    selections: tuple[Selection, ...] = Field((), description="the models its modelSelector took (or would take)")
    intake: str = Field("", description="what its modelSelector did this pass, in words")
    notifications: str = Field("", description="its webhook messages not delivered (yet), in words")


# --------------------------------------------------------------------------- what acting said


class Outcome(Frozen):
    """One executed step, for events and the pass summary."""

    cell: str = Field(description="the cell's label (the EvalRun, for a step of the whole EvalRun): what people read")
    key: str = Field("", description="the cell's key ('' for a step of the whole EvalRun): what joins it to its cell")
    action: Step
    ok: bool
    message: str
