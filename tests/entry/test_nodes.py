"""`evalctl nodes list|release`: a real process on a real store, as an operator on a login node runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from controller.adapters.store.sqlite import SqliteStore
from controller.core.remedies import QuarantineKind

HOUR = 3600.0


@pytest.fixture
def store(tmp_path: Path) -> str:
    """Two clusters: gpu03 quarantined on both, gpu04 on one, and a pinggy pair (not a node)."""
    opened = SqliteStore(tmp_path / "store.db")
    opened.quarantine(QuarantineKind.NODE, "lab/gpu", "gpu03", "nccl-timeout: NCCL watchdog [rank 3]", HOUR,
                      "lab/sweep")
    opened.quarantine(QuarantineKind.NODE, "lab/gpu", "gpu04", "nccl-timeout", HOUR, "lab/sweep")
    opened.quarantine(QuarantineKind.NODE, "ClusterEvalCluster/shared", "gpu03", "ECC errors", HOUR, "")
    opened.quarantine(QuarantineKind.PAIR, "lab/sweep", "pair-1", "token locked", HOUR, "lab/sweep")
    opened.close()
    return f"sqlite:///{tmp_path}/store.db"


def evalctl(*args: str, store: str) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("EVALCTL_")}
    return subprocess.run([sys.executable, "-m", "controller.entry.cli", "nodes", *args, "--store", store],
                          capture_output=True, text=True, env={**env, "COLUMNS": "250"}, check=False, timeout=60)


def listed(store: str, *args: str) -> list[tuple[str, str]]:
    done = evalctl("list", "-o", "json", *args, store=store)
    assert done.returncode == 0, done.stderr
    return [(node["cluster"], node["node"]) for node in json.loads(done.stdout)["nodes"]]


def test_list_shows_every_quarantined_node_with_when_whose_and_why(store: str) -> None:
    table = evalctl("list", store=store)
    as_json = json.loads(evalctl("list", "-o", "json", store=store).stdout)["nodes"]

    assert table.returncode == 0, table.stderr
    assert "3 node(s) quarantined" in table.stdout and "pair-1" not in table.stdout, table.stdout
    header = next(line for line in table.stdout.splitlines() if "cluster" in line)
    assert header.replace("┃", " ").split() == ["cluster", "node", "since", "until", "owner", "reason"], header
    assert "NCCL watchdog [rank 3]" in table.stdout, "a reason's brackets are text, not markup"
    assert [(n["cluster"], n["node"], n["owner"]) for n in as_json] == [
        ("ClusterEvalCluster/shared", "gpu03", ""), ("lab/gpu", "gpu03", "lab/sweep"), ("lab/gpu", "gpu04", "lab/sweep")]
    assert all(n["since"] and n["until"] > n["since"] for n in as_json)


def test_list_filters_by_cluster_named_in_full_or_by_its_name(store: str) -> None:
    assert listed(store, "--cluster", "lab/gpu") == [("lab/gpu", "gpu03"), ("lab/gpu", "gpu04")]
    assert listed(store, "--cluster", "shared") == [("ClusterEvalCluster/shared", "gpu03")]
    assert listed(store, "--cluster", "elsewhere") == []


def test_release_lifts_one_node_and_says_what_it_released(store: str) -> None:
    done = evalctl("release", "gpu03", "--cluster", "lab/gpu", store=store)

    assert done.returncode == 0, done.stderr
    flat = " ".join(done.stdout.split())
    assert "released node gpu03 on cluster lab/gpu (quarantined by lab/sweep until" in flat, flat
    assert "UTC" in flat and "nccl-timeout: NCCL watchdog [rank 3]" in flat, flat
    assert listed(store) == [("ClusterEvalCluster/shared", "gpu03"), ("lab/gpu", "gpu04")]


def test_release_without_cluster_takes_the_one_cluster_the_node_is_quarantined_on(store: str) -> None:
    done = evalctl("release", "gpu04", store=store)

    assert done.returncode == 0, done.stderr
    assert listed(store, "--cluster", "gpu") == [("lab/gpu", "gpu03")]


def test_release_of_a_node_quarantined_on_several_clusters_asks_for_one(store: str) -> None:
    done = evalctl("release", "gpu03", store=store)

    assert done.returncode == 2 and done.stdout == "", done
    assert done.stderr.splitlines() == [f"store: {store} (--store)", "evalctl: node gpu03 is quarantined on 2 "
                                        "clusters (ClusterEvalCluster/shared, lab/gpu): name one with --cluster"]
    assert len(listed(store)) == 3, "nothing released"


def test_release_of_a_node_not_quarantined_names_those_that_are_in_one_line(store: str) -> None:
    done = evalctl("release", "gpu07", "--cluster", "lab/gpu", store=store)

    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.splitlines()[1:] == ["evalctl: node gpu07 is not quarantined on lab/gpu; quarantined now: gpu03 "
                                            "(ClusterEvalCluster/shared), gpu03 (lab/gpu), gpu04 (lab/gpu)"]


def test_release_twice_fails_the_second_time(store: str) -> None:
    assert evalctl("release", "gpu04", store=store).returncode == 0
    again = evalctl("release", "gpu04", store=store)

    assert again.returncode == 1 and "node gpu04 is not quarantined;" in again.stderr, again.stderr


def test_a_store_with_no_quarantine_lists_none(tmp_path: Path) -> None:
    done = evalctl("list", store=f"sqlite:///{tmp_path}/nothing-yet.db")

    assert done.returncode == 0 and done.stdout.strip() == "no node is quarantined", done
    assert not (tmp_path / "nothing-yet.db").exists(), "listing is read-only"
    gone = evalctl("release", "gpu03", store=f"sqlite:///{tmp_path}/nothing-yet.db")
    assert gone.returncode == 1 and "no node is quarantined now" in gone.stderr, gone.stderr
