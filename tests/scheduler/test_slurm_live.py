"""The SLURM backend against the real single-node cluster: submit, find, observe, cancel, secrets, output, nodes."""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from controller.adapters.scheduler.commands import LocalCommands
from controller.adapters.scheduler.slurm import SlurmOptions, SlurmScheduler
from controller.adapters.secrets import SecretMask
from controller.core.observed import JobOutput, JobState
from controller.core.ports import OutputCursor, SubmitRequest
from tests.fixtures.evalctl import wait_until

pytestmark = pytest.mark.slurm
SECRET = f"tok-{uuid.uuid4().hex}"
RUN = uuid.uuid4().hex[:8]  # job names unique to this run: accounting remembers every earlier one
READY_STATES = {"idle", "mixed", "allocated", "completing"}  # sinfo %T of a node that answers and takes jobs


@pytest.fixture
def slurm(slurm_env: dict[str, str], tmp_path: Path) -> Iterator[SlurmScheduler]:
    scheduler = SlurmScheduler(LocalCommands({"SLURM_CONF": slurm_env["SLURM_CONF"]}),
                               SlurmOptions(partition="debug"), logs_dir=str(tmp_path / "logs"),
                               mask=SecretMask([SECRET]))
    yield scheduler
    for job in scheduler.observe():
        if job.name.startswith(f"ev_live_{RUN}") and job.state.active:
            scheduler.cancel(job.job_id)


def request(tmp_path: Path, name: str, body: str) -> SubmitRequest:
    script = tmp_path / "job.sh"
    script.write_text(f"#!/bin/bash\n{body}\n")
    return SubmitRequest(name=f"ev_live_{RUN}_{name}", comment="model|dataset|fp", script=str(script),
                         args=("first arg", "second"), env={"EVAL_PINGGY_TOKEN": SECRET}, logs_dir="unused",
                         time_limit="5")


def wait_for(slurm: SlurmScheduler, name: str, states: set[JobState], timeout_s: float = 120) -> None:
    """Poll the adapter itself (bounded) until the job named `name` is in one of `states`."""
    deadline = time.monotonic() + timeout_s
    while (job := slurm.find(name)) is None or job.state not in states:
        assert time.monotonic() < deadline, f"{name} never reached {states}: {job}"
        time.sleep(0.2)


def test_secret_reaches_the_job_through_its_environment_only(slurm: SlurmScheduler, slurm_env: dict[str, str],
                                                             tmp_path: Path) -> None:
    req = request(tmp_path, "secret", '[ "$EVAL_PINGGY_TOKEN" = "$EXPECTED" ] && echo token-ok\necho "args: $1|$2"')
    job_id = slurm.submit(req.model_copy(update={"env": {**req.env, "EXPECTED": SECRET}}))
    wait_for(slurm, req.name, {JobState.COMPLETED})
    output = (tmp_path / "logs" / f"{req.name}_{job_id}.out").read_text()
    assert "token-ok" in output and "args: first arg|second" in output
    assert SECRET not in output
    def submit_line() -> str:  # accounting lags the queue: poll until the job's record has landed
        return subprocess.run(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "SubmitLine"], env=slurm_env,
                              capture_output=True, text=True, check=True).stdout.strip()

    deadline = time.monotonic() + 60
    while not (line := submit_line()):
        assert time.monotonic() < deadline, f"sacct never showed job {job_id}"
        time.sleep(0.2)
    assert req.name in line and SECRET not in line, "sbatch's argv must not carry the secret"
    assert not any(SECRET in p.read_text(errors="ignore") for p in tmp_path.rglob("*") if p.is_file())


def test_find_sees_a_pending_job_and_cancel_is_idempotent(slurm: SlurmScheduler, tmp_path: Path) -> None:
    req = request(tmp_path, "held", "sleep 300")
    job_id = slurm.submit(req.model_copy(update={"time_limit": "5"}))
    found = slurm.find(req.name)
    assert found is not None and found.job_id == job_id and found.state.active
    observed = {job.job_id: job for job in slurm.observe()}
    assert observed[job_id].name == req.name and observed[job_id].state.active
    slurm.cancel(job_id)
    wait_for(slurm, req.name, {JobState.CANCELLED})
    slurm.cancel(job_id)  # again, after it ended: a no-op, not an error
    assert slurm.find(req.name).job_id == job_id, "an ended job is still found by its name (sacct)"


def test_a_running_job_reports_time_left_within_its_limit(slurm: SlurmScheduler, tmp_path: Path) -> None:
    req = request(tmp_path, "running", "sleep 300")
    job_id = slurm.submit(req)
    wait_for(slurm, req.name, {JobState.RUNNING})
    job = next(j for j in slurm.observe() if j.job_id == job_id)
    assert job.started_at is not None and job.time_left_s is not None and 0 < job.time_left_s <= 5 * 60


def test_a_job_waiting_for_its_begin_time_is_queued_with_that_start_expected(
        slurm: SlurmScheduler, slurm_env: dict[str, str], tmp_path: Path) -> None:
    name, script = f"ev_live_{RUN}_later", tmp_path / "later.sh"
    script.write_text("#!/bin/bash\ntrue\n")
    begin = (datetime.now(UTC) + timedelta(hours=3)).replace(microsecond=0)
    subprocess.run(["sbatch", "--parsable", "--partition", "debug", "--job-name", name, "--time", "5",
                    "--output", "/dev/null", f"--begin={begin:%Y-%m-%dT%H:%M:%S}", str(script)],
                   env={**slurm_env, "TZ": "UTC"}, capture_output=True, text=True, check=True)

    job = slurm.find(name)

    assert job is not None and job.state == JobState.QUEUED and job.started_at is None
    assert job.expected_start == begin


def node_names(slurm_env: dict[str, str]) -> list[str]:
    out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N"], env=slurm_env, capture_output=True, text=True, check=True)
    return sorted(set(out.stdout.split()))


def node_states(slurm_env: dict[str, str]) -> str:
    """Each node's long state and reason, as the lab shows them (`vm idle none`)."""
    return subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T %E"], env=slurm_env, capture_output=True, text=True,
                          check=True).stdout.strip()


def nodes_up(slurm_env: dict[str, str]) -> bool:
    """Every node takes jobs: a slurmd slow to answer on this loaded 2-core machine shows `idle*` a while."""
    return all(line.split()[1] in READY_STATES for line in node_states(slurm_env).splitlines())


def test_a_running_jobs_output_is_read_on_across_passes_masked_and_its_node_is_known(
        slurm: SlurmScheduler, slurm_env: dict[str, str], tmp_path: Path) -> None:
    go = tmp_path / "go"  # the job runs on this host (the lab's one node): it waits for the test's file
    req = request(tmp_path, "output", f'echo "vllm ready, key $EVAL_PINGGY_TOKEN"\nprintf \'\\377 binary\\n\'\n'
                                      f'while [ ! -e {go} ]; do sleep 0.1; done\necho "second pass line"\nsleep 300')
    job_id = slurm.submit(req)
    cursor = OutputCursor(job_id=job_id, name=req.name)

    def read_on(offset: int, wanted: str) -> JobOutput | None:
        """This pass's read from `offset`, once it holds `wanted` (the job may not run or have printed yet)."""
        outputs = slurm.read_output([cursor.model_copy(update={"offset": offset})])
        return next((out for out in outputs if wanted in out.text), None)

    first = wait_until(lambda: read_on(0, "binary"), "the job's first lines", timeout_s=120)
    assert isinstance(first, JobOutput)
    assert (first.offset, first.text) == (0, "vllm ready, key ***\n\ufffd binary\n")
    assert first.end == len(f"vllm ready, key {SECRET}\n".encode()) + len(b"\xff binary\n"), "raw bytes, not text"
    go.touch()
    second = wait_until(lambda: read_on(first.end, "second"), "the job's next line", timeout_s=120)
    assert isinstance(second, JobOutput)
    assert (second.offset, second.text) == (first.end, "second pass line\n")
    job = next(j for j in slurm.observe() if j.job_id == job_id)
    assert job.state == JobState.RUNNING and job.nodes in node_names(slurm_env)


def test_excluded_nodes_reach_the_job(slurm: SlurmScheduler, slurm_env: dict[str, str], tmp_path: Path) -> None:
    """Held, so excluding the lab's only node is accepted (SLURM refuses it for a job that could start now)."""
    nodes = node_names(slurm_env)
    req = request(tmp_path, "exclude", "#SBATCH --hold\nexit 0")
    job_id = slurm.submit(req.model_copy(update={"exclude_nodes": tuple(nodes)}))
    shown = subprocess.run(["scontrol", "show", "job", job_id], env=slurm_env, capture_output=True, text=True,
                           check=True).stdout
    assert f"ExcNodeList={','.join(nodes)}" in shown.split(), shown


def test_the_partitions_nodes_are_usable_and_a_legacy_expression_excludes_only_nodes_it_has(
        slurm: SlurmScheduler, slurm_env: dict[str, str], tmp_path: Path) -> None:
    """A hostlist expression an older store holds (`vm,gone[01-03]`) is expanded; sbatch gets the node the lab has."""
    nodes = node_names(slurm_env)
    wait_until(lambda: nodes_up(slurm_env), "the lab's nodes to take jobs", timeout_s=120, step_s=1.0)
    assert sorted(slurm.usable_nodes() or ()) == nodes, node_states(slurm_env)
    req = request(tmp_path, "legacy", "#SBATCH --hold\nexit 0")
    job_id = slurm.submit(req.model_copy(update={"exclude_nodes": (f"{nodes[0]},gone[01-03]",)}))
    shown = subprocess.run(["scontrol", "show", "job", job_id], env=slurm_env, capture_output=True, text=True,
                           check=True).stdout
    assert f"ExcNodeList={nodes[0]}" in shown.split(), shown


def test_a_failed_job_carries_its_last_lines_masked_and_the_node_it_ran_on(
        slurm: SlurmScheduler, slurm_env: dict[str, str], tmp_path: Path) -> None:
    req = request(tmp_path, "fails", 'for i in $(seq 1 100); do echo "step $i"; done\n'
                                     'echo "RuntimeError: token $EVAL_PINGGY_TOKEN refused" >&2\nexit 3')
    slurm.submit(req)
    wait_for(slurm, req.name, {JobState.FAILED})
    [job] = [j for j in slurm.observe() if j.name == req.name]
    assert job.log_tail.splitlines() == [*(f"step {i}" for i in range(38, 101)), "RuntimeError: token *** refused"]
    assert job.reason == "step 97 | step 98 | step 99 | step 100 | RuntimeError: token *** refused"
    assert job.nodes in node_names(slurm_env)
