"""Which trial exceptions are infra (retry-worthy), benign (a valid score of 0) or other.

The class lists are data (RULES §3, shipped as a catalog); this module only gives them a
type and the two rules everyone must apply the same way: classification and the
dimensionally stable breakdown (every known class present, 0 included). `InstantFailure` is
always an infra class: the reconciler files instant failures there, whatever Harbor called them.
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import Field, field_validator

from controller.core.types import ErrorKind, Frozen

__all__ = ["INSTANT_FAILURE", "ErrorClasses", "ErrorKind"]

# The reconciler's own bucket (never Harbor's): an exception before one output token, within seconds.
INSTANT_FAILURE = "InstantFailure"


class ErrorClasses(Frozen):
    """Exception class names by kind; same fields as `catalog/error_classes.yaml`."""

    infra: frozenset[str]
    benign: frozenset[str]
    benign_with_reward: frozenset[str] = Field(
        frozenset(),
        description="benign only when the trial still got a reward (a graded AgentTimeoutError is a 0; "
        "an ungraded one is an ordinary error)",
    )
    interrupted: frozenset[str] = Field(
        frozenset(),
        description="a cancel cut the trial off: `harbor jobs resume` re-runs it, so it is not completed",
    )

    @field_validator("infra")
    @classmethod
    def _with_instant_failures(cls, infra: frozenset[str]) -> frozenset[str]:
        return infra | {INSTANT_FAILURE}

    @property
    def known(self) -> tuple[str, ...]:
        return tuple(sorted(self.infra | self.benign | self.benign_with_reward))

    def classify(self, exception_type: str, has_reward: bool) -> ErrorKind:
        if exception_type in self.infra:
            return ErrorKind.INFRA
        if exception_type in self.benign or (has_reward and exception_type in self.benign_with_reward):
            return ErrorKind.BENIGN
        return ErrorKind.OTHER

    def breakdown(self, counts: Mapping[str, int]) -> dict[str, int]:
        """Every known class (0 when unseen) plus any unknown class seen, sorted by name."""
        merged = dict.fromkeys(self.known, 0) | dict(counts)
        return dict(sorted(merged.items()))

    def infra_breakdown(self, counts: Mapping[str, int]) -> dict[str, int]:
        return {name: counts.get(name, 0) for name in sorted(self.infra)}
