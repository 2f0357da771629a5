"""The two halves of the store as one pass uses them: one snapshot in, and the order the protocol writes in."""

from __future__ import annotations

from datetime import timedelta

from controller.core.ports import ControllerState, ObservationError, ResultsDB
from controller.core.records import StoreSnapshot
from controller.core.types import EvalRunRef

# An EvalRun keeps the cells it claimed while it renews them (every acting pass); one that stopped naming a
# cell hands it over at once, one that stopped running hands it over after this. Far longer than a pass.
CELL_OWNER_TTL = timedelta(minutes=30)


class Store:
    """The results DB and the controller state (possibly one object, possibly two places)."""

    def __init__(self, results: ResultsDB, state: ControllerState):
        self.results, self.state = results, state

    def observe(self, evalrun: EvalRunRef, model_names: list[str], benchmark_names: list[str],
                cell_keys: list[str] | None = None, owner_ttl_s: float = CELL_OWNER_TTL.total_seconds()) -> StoreSnapshot:
        """Results first, then state: the protocol writes in the opposite order (submission, then its row), so
        every row of ours seen here has its submission in the later read. A submission recorded in between is
        seen without its row, which the planner repairs; never the reverse, a row without its intent, which
        would look like a run to resume.

        Any row that cannot be decoded fails the whole read: guessing would make the planner resubmit.
        """
        results = self.results.read_results(model_names, benchmark_names)
        state = self.state.read_state(evalrun, cell_keys or [], owner_ttl_s, benchmark_names)
        if results.undecodable:
            raise ObservationError("; ".join(results.undecodable[:3])
                                   + (f" (+{len(results.undecodable) - 3} more)" if len(results.undecodable) > 3 else ""))
        return StoreSnapshot(models=results.models, benchmarks=results.benchmarks, rows=results.rows,
                             submissions=state.submissions, tunnel_leases=state.tunnel_leases,
                             cell_owners=state.cell_owners, cell_memory=state.cell_memory,
                             quarantined=state.quarantined, gpu_history=state.gpu_history,
                             retries=state.retries)

    def close(self) -> None:
        self.results.close()
        if id(self.state) != id(self.results):  # one backend may hold both halves
            self.state.close()
