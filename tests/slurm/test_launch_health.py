"""Launch health on the real SLURM cluster (issue 16): catalogued start failures are refired up to
`health.maxRefires` then held, or held at once; an NCCL failure on the lab's one node refires without quarantining
its last usable node, and a cell whose every usable node is quarantined is held until `evalctl nodes release`; a
job RUNNING with no trial past
`launchGraceMinutes` is cancelled and refired; a refire pass SIGKILLed between the protocol's steps still gives one
SLURM job per attempt name.

Every job script here follows the job-script contract's first step (`mkdir -p "$EVAL_JOBS_DIR"`: a missing jobs
dir reads as unmounted, not fresh) and then fails or idles before creating any trial. Synchronisation is on
observable state only: `evalctl reconcile --once` in a bounded poll until the status settles.
"""

from __future__ import annotations

import json
import re
import shlex
import signal
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from controller.adapters.store import open_store
from controller.core.remedies import QuarantineKind
from tests.slurm.conftest import REPO, SlurmCluster, slurm, wait_until

pytestmark = pytest.mark.slurm

CATALOG = yaml.safe_load((REPO / "controller" / "api" / "catalog" / "failures.yaml").read_text())["modes"]
FAST_REFIRES = "  health: {maxRefires: 2, refireBackoffMinutes: 0}"


def start_advice(name: str) -> tuple[str, str]:
    """(remedy, advice) of the catalog's start-time entry `name`."""
    [mode] = [m for m in CATALOG if m["name"] == name and m["when"] == "start"]
    return mode["remedy"], mode["advice"]


def failing_at_start(cluster: SlurmCluster, line: str) -> Path:
    """A job that prints `line` (on stderr, into the job's log) and exits 1 before any trial exists."""
    return cluster.script("fails_at_start.sbatch", "#!/bin/bash\n"
                          'mkdir -p "$EVAL_JOBS_DIR"\n'
                          'echo "eval: starting vLLM for $1 (EVAL_CLEAR_COMPILE_CACHE=${EVAL_CLEAR_COMPILE_CACHE:-0})"\n'
                          f"echo {shlex.quote(line)} >&2\n"
                          "exit 1\n")


def idle_launch(cluster: SlurmCluster) -> Path:
    """A job that stays RUNNING and never starts a trial (a server that never comes up)."""
    return cluster.script("idle.sbatch", '#!/bin/bash\nmkdir -p "$EVAL_JOBS_DIR"\necho "eval: starting vLLM"\n'
                                         "exec sleep 600\n")


def passes_until(cluster: SlurmCluster, outputs: list[str], done: Callable[[dict], bool], what: str,
                 timeout_s: float = 240) -> dict:
    """Acting passes until the (single) cell satisfies `done`; each pass's output goes to `outputs`."""

    def reached() -> dict | None:
        result = cluster.reconcile(check=False)
        outputs.append(f"--- rc={result.returncode}\n{result.stdout}{result.stderr}")
        assert "Traceback" not in result.stdout + result.stderr, outputs[-1]
        [cell] = cluster.status()["cells"]
        return cell if done(cell) else None

    cell = wait_until(reached, what, timeout_s=timeout_s, step_s=0.5)
    assert isinstance(cell, dict)
    return cell


def held(cell: dict) -> bool:
    return cell["phase"] == "Failed"


def one_job_each(cluster: SlurmCluster, names: list[str]) -> list[dict]:
    """Each name has exactly one job in accounting (the lab's sacct keeps every job): the jobs, in order."""
    jobs = []
    for name in names:
        accounted = wait_until(lambda n=name: cluster.accounting(n), f"sacct to list {name}")
        assert len(accounted) == 1, f"{name}: {accounted}"
        jobs.append(accounted[0])
    return jobs


def flat(text: str) -> str:
    """Rich wraps long lines at the terminal width: compare text with its whitespace collapsed."""
    return " ".join(text.split())


def tag_stem(run_tag: str) -> str:
    """`…__a1` → `…__a`: the next attempts' names are the stem and their number."""
    assert run_tag.endswith("__a1"), run_tag
    return run_tag.removesuffix("1")


def scontrol_job(cluster: SlurmCluster, job_id: str) -> dict[str, str]:
    out = slurm(["scontrol", "show", "job", "-o", job_id], cluster.env).stdout
    return dict(field.split("=", 1) for field in out.split() if "=" in field)


# --------------------------------------------------------------------------- 1. catalogued start failures


@pytest.mark.parametrize(("name", "line"), [pytest.param(name, line, id=name) for name, line in [
    ("torch-compile-cache-corrupt", "RuntimeError: Bytes object is corrupted, checksum does not match"),
    ("vllm-health-check-timeout", "eval_harbor: vLLM not healthy after 20 checks (EVAL_VLLM_MAX_RETRIES)"),
    ("vllm-dp-port-collision", "OSError: [Errno 98] Address already in use"),
    ("cuda-out-of-memory", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"),
    ("model-not-on-hub", "huggingface_hub.errors.RepositoryNotFoundError: 401 Client Error"),
]])
def test_a_catalogued_start_failure_is_refired_up_to_max_refires_or_held_at_once(cluster, name, line):
    remedy, advice = start_advice(name)
    assert remedy in ("refire", "hold"), remedy
    cluster.write(models=[cluster.model(1)], datasets=["DCAgent/startbench"], script=failing_at_start(cluster, line),
                  extra_run=FAST_REFIRES)
    outputs: list[str] = []

    cell = passes_until(cluster, outputs, held, "the cell to be held")

    subs = cluster.submissions()
    stem = tag_stem(subs[0]["run_tag"])
    expected = [f"{stem}1", f"{stem}2", f"{stem}3"] if remedy == "refire" else [f"{stem}1"]
    text = "".join(outputs)
    assert [s["name"] for s in subs] == expected, text[-4000:]
    assert all(s["run_tag"] == s["name"] and s["fire"] == 1 and s["job_id"] for s in subs), subs
    assert [s["attempt"] for s in subs] == list(range(1, len(expected) + 1))
    jobs = one_job_each(cluster, expected)
    assert [j["job_id"] for j in jobs] == [s["job_id"] for s in subs]
    assert all(j["state"] == "FAILED" for j in jobs), jobs

    assert f"{name}: {advice}" in cell["reason"], cell
    assert [a["kind"] for a in cell["actions"]] == ["hold"], cell
    if remedy == "refire":
        assert "not refired again: 2 refire(s) used (health.maxRefires)" in cell["reason"], cell
        assert cell["rule"] == "RefiresExhausted", cell
        assert text.count("submitted job") == 3, text[-4000:]
    else:
        assert cell["rule"] == "KnownFailure" and "refire" not in cell["reason"], cell
        assert text.count("submitted job") == 1, text[-4000:]
    explained = flat(cluster.evalctl("explain", cluster.model(1), "DCAgent/startbench").stdout)
    assert "Failed" in explained and f"{name}: {flat(advice)}" in explained, explained

    if name == "torch-compile-cache-corrupt":  # the refires carry the entry's job_env, the first fire does not
        flags = [re.search(r"EVAL_CLEAR_COMPILE_CACHE=(\d)", (cluster.logs_dir / f"{s['name']}_{s['job_id']}.out")
                           .read_text()).group(1) for s in subs]
        assert flags == ["0", "1", "1"], flags

    again = cluster.reconcile().stdout
    assert "submitted job" not in again, again
    assert cluster.submissions() == subs
    assert cluster.our_queued_jobs() == []


# --------------------------------------------------------------------------- 2. refire elsewhere

NCCL_LINE = ("[rank0]: Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE) ran for "
             "600000 milliseconds before timing out")


def test_an_nccl_failure_on_the_last_usable_node_refires_without_quarantining_it(cluster):
    """`vm` is the lab's only node: quarantining it would leave every job pending on BadConstraints (slurm-wlm
    refuses a job that excludes every node of its partition). The refire goes, and says why nothing was excluded."""
    model, dataset = cluster.model(1), "DCAgent/ncclbench"
    cluster.write(models=[model], datasets=[dataset], script=failing_at_start(cluster, NCCL_LINE),
                  extra_run="  health: {maxRefires: 2, refireBackoffMinutes: 0}")
    cluster.reconcile()
    [first] = cluster.submissions()
    assert cluster.wait_job_final(first["job_id"]) == "FAILED"
    assert scontrol_job(cluster, first["job_id"])["NodeList"] == "vm"
    refire_name = f"{tag_stem(first['run_tag'])}2"
    outputs: list[str] = []
    [planned] = cluster.plan_cells()

    seen: list[dict] = []  # kept as found: a fast job can leave squeue before sacct lists it

    def refire_seen(_: dict) -> bool:
        seen[:] = cluster.accounting(refire_name) or cluster.queue(refire_name)
        return bool(seen)

    passes_until(cluster, outputs, refire_seen, f"a SLURM job named {refire_name}")

    assert [a["kind"] for a in planned["actions"]] == ["submit"], planned
    assert "node vm not quarantined: it is the last usable node of slurm-test" in planned["reason"], planned
    assert "quarantined for" not in flat("".join(outputs)), outputs
    [refire] = seen
    assert scontrol_job(cluster, refire["job_id"]).get("ExcNodeList") in (None, "(null)", ""), "nothing excluded"
    assert cluster.status()["quarantined"] == []


def test_with_every_usable_node_quarantined_the_cell_is_held_until_a_human_releases_the_node(cluster):
    """An older quarantine of `vm` (another EvalRun's, or from before the cap): the launch is held saying so, not
    sent to wait on BadConstraints; `evalctl nodes release` is the lever, and the next pass launches on vm."""
    model, dataset = cluster.model(1), cluster.tiny_dataset("release")
    cluster.write(models=[model], datasets=[dataset], script=cluster.fake_harbor_script())
    store = open_store(cluster.store)
    try:
        store.state.quarantine(QuarantineKind.NODE, "slurm-test", "vm", "nccl-timeout: an earlier failure", 3600,
                               owner="earlier")
    finally:
        store.close()

    cluster.reconcile()

    [cell] = cluster.status()["cells"]
    [hold] = [a for a in cell["actions"] if a["kind"] == "hold"]
    assert "every usable node of slurm-test is quarantined (vm)" in hold["reason"], cell
    assert cluster.submissions() == [] and cluster.our_queued_jobs() == []
    listed = json.loads(cluster.evalctl("nodes", "list", "-o", "json", "--store", cluster.store).stdout)["nodes"]
    assert [(n["cluster"], n["node"], n["owner"]) for n in listed] == [("slurm-test", "vm", "earlier")], listed

    released = cluster.evalctl("nodes", "release", "vm", "--cluster", "slurm-test", "--store", cluster.store)

    assert "vm" in released.stdout and "nccl-timeout" in released.stdout, released.stdout
    cluster.reconcile()
    [first] = cluster.submissions()
    wait_until(lambda: cluster.job_state(first["job_id"]) not in ("PENDING", ""), "the job to start")
    assert scontrol_job(cluster, first["job_id"])["NodeList"] == "vm"
    assert json.loads(cluster.evalctl("nodes", "list", "-o", "json", "--store", cluster.store).stdout) == {"nodes": []}


# --------------------------------------------------------------------------- 3. stalled launch


def test_a_job_running_past_the_launch_grace_with_no_trial_is_cancelled_and_refired(cluster):
    model, dataset, script = cluster.model(1), "DCAgent/gracebench", idle_launch(cluster)

    def write(grace_minutes: float, backoff_minutes: float) -> None:
        cluster.write(models=[model], datasets=[dataset], script=script,
                      extra_run=f"  health: {{launchGraceMinutes: {grace_minutes}, refireBackoffMinutes: "
                                f"{backoff_minutes}, maxRefires: 2}}")

    write(30, 60)
    cluster.reconcile()
    [first] = cluster.submissions()
    wait_until(lambda: [j["state"] for j in cluster.queue(first["name"])] == ["RUNNING"], "the job to run")
    cluster.reconcile()
    [cell] = cluster.status()["cells"]
    assert cell["phase"] == "Running" and cell["health"]["state"] == "launching", cell
    assert re.search(r"launching \(\d+ min of 30 min\)", cell["health"]["note"]), cell

    write(0.05, 60)  # 3 s of grace: the running job is past it
    outputs: list[str] = []
    passes_until(cluster, outputs, lambda _: f"cancelled job {first['job_id']}" in outputs[-1], "the stalled job's cancel")
    assert "stalled launch: no trial started" in outputs[-1], outputs[-1]
    assert cluster.wait_job_final(first["job_id"]) == "CANCELLED"
    assert [j["state"] for j in one_job_each(cluster, [first["name"]])] == ["CANCELLED"]

    # ended, the refire waits for refireBackoffMinutes from the job's end
    waiting = cluster.reconcile().stdout
    assert "submitted job" not in waiting, waiting
    [cell] = cluster.status()["cells"]
    assert "refire after" in cell["reason"] and "health.refireBackoffMinutes" in cell["reason"], cell
    assert "stalled launch" in cell["reason"], cell
    assert len(cluster.submissions()) == 1

    write(0.05, 0)  # the back-off is over
    refired = cluster.reconcile().stdout
    assert refired.count("submitted job") == 1, refired
    subs = cluster.submissions()
    assert [s["name"] for s in subs] == [first["name"], f"{tag_stem(first['run_tag'])}2"], subs
    second = subs[1]
    assert second["attempt"] == 2 and second["job_id"] and second["job_id"] != first["job_id"], second
    assert [j["job_id"] for j in cluster.our_queued_jobs()] == [second["job_id"]]
    assert [j["job_id"] for j in one_job_each(cluster, [second["name"]])] == [second["job_id"]]


# --------------------------------------------------------------------------- 4. SIGKILL between refire steps


@pytest.mark.parametrize("step", ["after-intent", "after-find", "after-submit"])
def test_a_refire_pass_killed_between_protocol_steps_gives_one_job_per_attempt(cluster, step):
    line = "OSError: [Errno 98] Address already in use"
    cluster.write(models=[cluster.model(1)], datasets=["DCAgent/killbench"], script=failing_at_start(cluster, line),
                  extra_run=FAST_REFIRES)
    cluster.reconcile()
    [first] = cluster.submissions()
    assert cluster.wait_job_final(first["job_id"]) == "FAILED"

    killed = cluster.reconcile(kill_at=step)  # the refire pass: attempt 2's submission, killed at `step`
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr
    subs = cluster.submissions()
    assert [s["name"] for s in subs] == [first["name"], f"{tag_stem(first['run_tag'])}2"], subs
    assert subs[1]["job_id"] is None, "killed before the refire's job id was recorded"
    queued = cluster.queue(subs[1]["name"])
    assert len(queued) == (1 if step == "after-submit" else 0), queued

    outputs: list[str] = []
    cell = passes_until(cluster, outputs, held, "the cell to be held after its refires")

    text = "".join(outputs)
    subs = cluster.submissions()
    names = [s["name"] for s in subs]
    stem = tag_stem(first["run_tag"])
    assert names == [f"{stem}1", f"{stem}2", f"{stem}3"], text[-4000:]
    jobs = one_job_each(cluster, names)
    assert [j["job_id"] for j in jobs] == [s["job_id"] for s in subs], (jobs, subs)
    assert "not refired again: 2 refire(s) used" in cell["reason"], cell
    assert cluster.our_queued_jobs() == []

