"""Which trial exceptions are the model's own failures (a valid 0) and which are infra (not a measurement).

The class lists are data (RULES §3, shipped as a catalog); this module only gives them a type and the rules
everyone must apply the same way: classification and the dimensionally stable breakdown (every known class
present, 0 included). The classification is closed: an exception is the model's failure only when the catalog
says so; every other one, known or not, is infra (the users' own per-trial extraction leaves every errored trial
out of the denominator).
The reconciler's own buckets are infra too: `InstantFailure` (raised before one output token, within seconds),
`Ungraded` (no exception and no reward: the verifier never ran) and `NoModelOutput` (graded, but the model
produced no token, or no agent ran at all: the verifier graded an untouched workspace).
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import Field, field_validator

from controller.core.observed import ErrorKind
from controller.core.types import Frozen

__all__ = ["INSTANT_FAILURE", "NO_MODEL_OUTPUT", "UNGRADED", "ErrorClasses", "ErrorKind"]

INSTANT_FAILURE = "InstantFailure"
UNGRADED = "Ungraded"
NO_MODEL_OUTPUT = "NoModelOutput"
OWN_BUCKETS = frozenset({INSTANT_FAILURE, UNGRADED, NO_MODEL_OUTPUT})


class ErrorClasses(Frozen):
    """Exception class names by kind; same fields as `catalog/error_classes.yaml`.

    A `benign` name may be qualified (`litellm.BadRequestError`): it is then the model's failure only when the
    trial's exception comes from that package, so a sandbox SDK's class of the same bare name stays infra.
    """

    infra: frozenset[str]
    benign: frozenset[str] = Field(description="the model's own failures: a valid 0 (its reward, if graded)")
    benign_with_reward: frozenset[str] = Field(
        frozenset(),
        description="the model's failure only when the trial still got a reward (a graded AgentTimeoutError is a 0; "
        "an ungraded one is infra)",
    )
    interrupted: frozenset[str] = Field(
        frozenset(),
        description="a cancel cut the trial off: `harbor jobs resume` re-runs it, so it is not completed",
    )

    @field_validator("infra")
    @classmethod
    def _with_own_buckets(cls, infra: frozenset[str]) -> frozenset[str]:
        return infra | OWN_BUCKETS

    @property
    def known(self) -> tuple[str, ...]:
        return tuple(sorted(self.infra | {_bare(name) for name in self.benign | self.benign_with_reward}))

    def classify(self, exception_type: str, has_reward: bool, qualified: str | None = None) -> ErrorKind:
        """BENIGN (the model's failure) only where the catalog lists the class; INFRA for everything else."""
        if _listed(self.benign, exception_type, qualified) or (
                has_reward and _listed(self.benign_with_reward, exception_type, qualified)):
            return ErrorKind.BENIGN
        return ErrorKind.INFRA

    def breakdown(self, counts: Mapping[str, int]) -> dict[str, int]:
        """Every known class (0 when unseen) plus any unknown class seen, sorted by name."""
        merged = dict.fromkeys(self.known, 0) | dict(counts)
        return dict(sorted(merged.items()))

    def infra_breakdown(self, infra_counts: Mapping[str, int]) -> dict[str, int]:
        """Every infra class (0 when unseen) plus every class an infra trial was seen with, from counts of the infra
        trials alone (`RunDirFacts.infra_error_breakdown`): a class the model's failures share by name (an ungraded
        AgentTimeoutError, a BadRequestError not from litellm) is shown with its infra trials, so the breakdown sums
        to the infra count."""
        seen = {name for name, count in infra_counts.items() if count}
        return {name: infra_counts.get(name, 0) for name in sorted(self.infra | seen)}


def _bare(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def _listed(names: frozenset[str], exception_type: str, qualified: str | None) -> bool:
    """A bare catalog name matches the class by name; a qualified one also needs the trial's package to match."""
    bare = _bare(exception_type)
    origin = (qualified or exception_type).split(".", 1)[0] if "." in (qualified or exception_type) else None
    for name in names:
        if _bare(name) != bare:
            continue
        if "." not in name or (origin is not None and origin == name.split(".", 1)[0]):
            return True
    return False
