"""Fifth review (the changes of 2026-12-03): cases today's changes leave wrong. Each test fails on main."""

from __future__ import annotations

from typing import Any

from controller.core.actor import row_config
from controller.core.admission import Admitted, admit
from controller.core.match import join_cells, row_config_matches
from controller.core.metrics import admitted_metrics
from controller.core.planner import plan_cell
from controller.core.records import NamedRow, SandboxJobRow, StoreSnapshot
from tests.core.builders import NOW, POLICY, ago, cell, facts

ONE = cell(tasks=20, n_attempts=1, fingerprint="1111111111111111")
THREE = cell(tasks=20, n_attempts=3, fingerprint="3333333333333333")


def config_written_before_today() -> dict[str, Any]:
    """What `row_config` wrote until today: no `n_attempts` key, but the cell's fingerprint (which has always
    hashed nAttempts, api/resolve.py `fingerprint`); the row's n_rep_eval column held nAttempts too."""
    config = row_config(ONE, ONE.run_tag(1))
    del config["n_attempts"]
    return config


def test_our_row_from_before_today_of_one_attempt_does_not_match_a_cell_of_three() -> None:
    """This tool's own pre-today row records another fingerprint (nAttempts 1): it is no row of the 3-attempt
    cell, whose fingerprint differs only by nAttempts. Until today its config did not say nAttempts, but the row's
    n_rep_eval did (this tool has always written it)."""
    assert not row_config_matches(config_written_before_today(), THREE, n_rep_eval=1)
    assert row_config_matches(config_written_before_today(), THREE, n_rep_eval=3)
    legacy = {key: value for key, value in config_written_before_today().items() if key != "fingerprint"}
    assert row_config_matches(legacy, THREE, n_rep_eval=1), "the old listener's n_rep_eval is not read"


def test_a_cell_of_three_attempts_is_not_completed_by_our_one_attempt_row_written_before_today() -> None:
    """The same row through the join and the planner: the 3-attempt cell shows the 1-attempt score as its own
    (what `test_a_cell_of_three_attempts_is_not_completed_by_a_one_attempt_row` guards only for rows written
    from today on)."""
    verdict = admit(ONE, facts(ONE.run_tag(1), total=20, completed=20), POLICY.admission)
    assert isinstance(verdict, Admitted), verdict.summary()
    stored = SandboxJobRow(id="r1", job_name=ONE.run_tag(1), username="alice", job_status="Finished",
                           created_at=ago(days=2), metrics=admitted_metrics(verdict), model_id="m",
                           benchmark_id="b", config=config_written_before_today(), n_rep_eval=1)
    snapshot = StoreSnapshot(models=(NamedRow(id="m", name=THREE.model),),
                             benchmarks=(NamedRow(id="b", name=THREE.benchmark_name),), rows=(stored,),
                             submissions=())
    [seen] = join_cells([THREE], snapshot, (), ())

    decided = plan_cell(THREE, seen, POLICY, NOW)

    assert decided.score is None, f"{decided.phase} {decided.score}: {decided.reason}"
