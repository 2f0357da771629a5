"""A pass reads the run dirs its cells can own, not every entry of a shared jobs dir (issue 18: 100,000 foreign
`ev_` entries raised the operator's memory by gigabytes, every entry read and remembered)."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.adapters.rundirs import harbor
from controller.adapters.rundirs.harbor import HarborRunDirs
from controller.core.cluster_view import own_run_dir
from controller.core.ports import ObservationError
from controller.core.types import stem_of
from tests.fixtures.harbor_dirs import REFERENCE_ERRORS, write_config, write_job_result

OURS = "ev_org__a-8B__tiny_a__0123456789ab__a"


def _run_dir(jobs: Path, name: str) -> None:
    write_config(jobs / name)
    write_job_result(jobs / name, n_total=1)


def test_only_the_passs_own_tags_and_dirs_not_of_ours_are_read(tmp_path: Path) -> None:
    for name in (f"{OURS}1", f"{OURS}2", "legacy-listener-run", "ev_org__a-8B__tiny_a__ffffffffffff__a1"):
        _run_dir(tmp_path, name)
    for index in range(50):  # another tenant's (or a flood of) entries named like ours
        (tmp_path / f"ev_x__y__{index:012x}__a1").mkdir()
    (tmp_path / "ev_not-a-tag").write_text("junk")

    read = HarborRunDirs(str(tmp_path), REFERENCE_ERRORS).observe(lambda tag: own_run_dir(frozenset({OURS}), tag))
    assert sorted(f.run_tag for f in read) == [f"{OURS}1", f"{OURS}2", "legacy-listener-run"]


def test_a_flood_of_dirs_not_of_ours_makes_the_jobs_dir_unobserved_never_half_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """They are read in full (adoption needs their config): past the bound, the pass must not read them all, and
    must not read some and conclude the rest ran nowhere."""
    monkeypatch.setattr(harbor, "FOREIGN_DIRS_MAX", 3)
    for name in (f"{OURS}1", "old-1", "old-2", "old-3"):
        _run_dir(tmp_path, name)
    wanted = lambda tag: own_run_dir(frozenset({OURS}), tag)  # noqa: E731
    assert len(HarborRunDirs(str(tmp_path), REFERENCE_ERRORS).observe(wanted)) == 4  # at the bound: read
    _run_dir(tmp_path, "old-4")
    with pytest.raises(ObservationError, match="holds 4 run dirs not named by evalrun-controller, over the 3 a pass"):
        HarborRunDirs(str(tmp_path), REFERENCE_ERRORS).observe(wanted)


def test_a_stem_is_the_tag_up_to_its_attempt() -> None:
    assert stem_of(f"{OURS}12") == OURS
    assert stem_of("ev_org__a-8B__tiny_a__0123456789ab__a1-r2") is None  # a job name, not a run tag
    assert stem_of("legacy__a1") is None and stem_of("ev_abc") is None


def test_the_memo_forgets_the_least_recently_read_run_dirs_beyond_its_bound(tmp_path: Path) -> None:
    from controller.adapters.rundirs.localfs import signature
    from controller.adapters.rundirs.memo import JobsDirMemo

    for name in ("r1", "r2", "r3"):
        _run_dir(tmp_path, name)
    [facts] = HarborRunDirs(str(tmp_path), REFERENCE_ERRORS).observe(lambda tag: tag == "r1")
    memo = JobsDirMemo(max_runs=2)
    for name in ("r1", "r2"):
        memo.settle(str(tmp_path / name), signature(str(tmp_path / name)), facts)
    assert memo.finished(str(tmp_path / "r1"), signature(str(tmp_path / "r1"))) is not None  # r1 read again: recent
    memo.settle(str(tmp_path / "r3"), signature(str(tmp_path / "r3")), facts)
    assert [memo.knows(str(tmp_path / n)) for n in ("r1", "r2", "r3")] == [True, False, True]
