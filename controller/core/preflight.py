"""What a cluster's preflight found (RULES §12, rule `PreflightFailed`): the checks a launch there depends on
(jobs dir, partition, account, job script, the login node's Python), read before the first launch of a process.

An observation like the queue: the adapters produce it, the planner reads it and decides; nothing here does I/O.
"""

from __future__ import annotations

from pydantic import Field

from controller.core.types import Frozen


class PreflightFailure(Frozen):
    """One check that failed: a launch would be a queue wait and a failed job."""

    field: str = Field(description="the EvalCluster field to fix, as the spec spells it: jobsDir, partition, …")
    message: str = Field(description="what is wrong there and how to fix it")


class Preflight(Frozen):
    """A cluster's preflight: the checks that failed, what passed, or why it could not run."""

    cluster: str
    failures: tuple[PreflightFailure, ...] = ()
    passed: tuple[str, ...] = Field((), description="what was checked and found fine (or could not be), in words")
    unobserved: str = Field("", description="why the checks (or some) could not run ('' when they ran): with no "
                                            "failure, launches wait")

    @property
    def ok(self) -> bool:
        return not self.failures and not self.unobserved

    @property
    def summary(self) -> str:
        """One line for a plan, a status and a log: what is wrong, or all that passed."""
        if self.failures:
            return f"the preflight of {self.cluster} failed: " + "; ".join(f.message for f in self.failures)
        if self.unobserved:
            return f"the preflight of {self.cluster} could not run: {self.unobserved}"
        return f"the preflight of {self.cluster} passed: " + ", ".join(self.passed)
