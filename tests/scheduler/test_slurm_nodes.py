"""The SLURM backend's nodes: what `sinfo` says the cluster's jobs may run on (one read serves a pass), and what
reaches `sbatch --exclude`: single names the cluster has, never a hostlist expression taken literally."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest

from controller.adapters.scheduler.commands import CommandResult
from controller.adapters.scheduler.slurm import SlurmOptions, SlurmScheduler
from controller.core.ports import ObservationError, SubmitRequest

RACK = "".join(f"gpu{n:02d}\n" for n in range(1, 9))  # sinfo --Node: one line per node and partition
REQUEST = SubmitRequest(name="ev_x", comment="k", script="/s/job.sh", args=("a",), env={}, logs_dir="/logs",
                        time_limit="10")


class Cluster:
    """A command runner: sinfo prints `nodes` (or exits 1), sbatch answers job 123; every call is recorded."""

    def __init__(self, nodes: str | None = RACK):
        self.nodes = nodes
        self.calls: list[list[str]] = []

    def run(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, timeout: float) -> CommandResult:
        self.calls.append(list(argv))
        if argv[0] != "sinfo":
            return CommandResult(returncode=0, stdout="123\n", stderr="")
        if self.nodes is None:
            return CommandResult(returncode=1, stdout="", stderr="sinfo: error: Unable to contact slurm controller")
        return CommandResult(returncode=0, stdout=self.nodes, stderr="")

    def sinfo_calls(self) -> list[list[str]]:
        return [call for call in self.calls if call[0] == "sinfo"]


def scheduler(cluster: Cluster, partition: str | None = None) -> SlurmScheduler:
    made = SlurmScheduler(cluster, SlurmOptions(partition=partition), logs_dir="/logs", user="alice")
    made._logs_dir_made = True
    return made


def excluded(cluster: Cluster, *nodes: str) -> list[str]:
    """The --exclude sbatch got for a submission that excludes `nodes` ([] when none)."""
    scheduler(cluster).submit(REQUEST.model_copy(update={"exclude_nodes": nodes}))
    sbatch = cluster.calls[-1]
    assert sbatch[-2:] == ["/s/job.sh", "a"], sbatch
    return [arg for arg in sbatch if arg.startswith("--exclude")]


def test_usable_nodes_are_the_partitions_nodes_once_each_in_sinfos_order() -> None:
    cluster = Cluster("gpu02\ngpu01\ngpu02\n")

    assert scheduler(cluster, partition="h100").usable_nodes() == ("gpu02", "gpu01")
    assert cluster.calls == [["sinfo", "--noheader", "--Node", "--format=%N %t", "--partition", "h100"]]


def test_nodes_that_take_no_job_are_not_usable_but_still_known_to_exclude() -> None:
    cluster = Cluster("gpu01 idle\ngpu02 down*\ngpu03 drain\ngpu04 mix\ngpu05 drng\n")
    slurm = scheduler(cluster)

    assert slurm.usable_nodes() == ("gpu01", "gpu04")
    slurm.submit(REQUEST.model_copy(update={"exclude_nodes": ("gpu02", "gpu09")}))
    assert "--exclude=gpu02" in cluster.calls[-1], "a down node is still one sbatch knows"


def test_no_node_listed_is_cannot_tell_and_a_failed_read_raises() -> None:
    assert scheduler(Cluster(""), partition="no-such-partition").usable_nodes() is None
    with pytest.raises(ObservationError, match="sinfo exited 1: sinfo: error: Unable to contact slurm controller"):
        scheduler(Cluster(None)).usable_nodes()


def test_one_sinfo_serves_the_pass_and_its_submissions() -> None:
    cluster = Cluster()
    slurm = scheduler(cluster)

    slurm.usable_nodes()
    slurm.submit(REQUEST.model_copy(update={"exclude_nodes": ("gpu03",)}))
    slurm.submit(REQUEST.model_copy(update={"exclude_nodes": ("gpu04",)}))

    assert len(cluster.sinfo_calls()) == 1


def test_single_nodes_the_cluster_has_are_excluded_once_and_none_adds_nothing() -> None:
    """A node the cluster no longer has is left out: sbatch would refuse the whole job for it."""
    assert excluded(Cluster(), "gpu07", "gpu03", "gpu07", "", "gone99") == ["--exclude=gpu07,gpu03"]
    cluster = Cluster()
    assert excluded(cluster) == [] and cluster.sinfo_calls() == [], "nothing to exclude: no sinfo either"


def test_a_legacy_hostlist_expression_is_expanded_to_the_nodes_the_cluster_has() -> None:
    """`gpu[07-12]` (a multi-node job's NodeList a store still holds) names gpu07..gpu12; the cluster has gpu07 and
    gpu08: those two are excluded, never the expression (sbatch would read it as a rack, or refuse it)."""
    assert excluded(Cluster(), "gpu[07-12]", "gpu01") == ["--exclude=gpu07,gpu08,gpu01"]


def test_an_expression_that_does_not_parse_is_not_sent() -> None:
    assert excluded(Cluster(), "gpu[07-", "gpu02") == ["--exclude=gpu02"]


def test_when_sinfo_fails_every_expanded_name_is_excluded_and_sbatch_judges() -> None:
    assert excluded(Cluster(None), "gpu[01-02]", "gone99") == ["--exclude=gpu01,gpu02,gone99"]
