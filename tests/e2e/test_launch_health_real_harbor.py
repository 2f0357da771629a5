"""Launch health (issue 16, first acceptance point) end to end with REAL Harbor: a dead launch is never uploaded,
and a running job whose model answers 400 to a third of its requests is reported Stalled.

Real parts: `evalctl reconcile --once` as a subprocess, the local scheduler, the SQLite store, a real `mlflow
server`, and the job script tests/fixtures/terminus2_job.sh, which runs Harbor 0.26's real `terminus-2` agent
(litellm, tmux, eval/harbor/host_env.py) over the three tasks of eval/harbor/agent-dataset. The only fake is the
served model: nothing at all (a loopback port nobody listens on), or eval/harbor/fake_llm.py started in the job
the way the real sbatch starts vLLM, printing uvicorn's access lines into the job's output.

What real terminus-2 does against an unreachable server (measured here): Harbor's `LiteLLM.call` retries three
times with 4-15 s exponential waits, and terminus-2's `_query_llm` retries that three times, so each trial raises
`InternalServerError` ("Connection error") with 0 output tokens after about 36 s of agent time, and the verifier
then grades the empty workspace 0.0. That is not "instant" by agent time (over the default 10 s of
`health.instantFailSeconds`): what tells it is that the model never answered one request (no input or output
tokens). Before that second condition, this very launch was uploaded as the model's 0.0 (a Finished row, an MLflow
run; seen on this machine). The EvalRun here keeps the default threshold.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from mlflow import MlflowClient

from tests.e2e.conftest import Cluster
from tests.fixtures.evalctl import wait_until
from tests.fixtures.harbor_agent import AGENT_DATASET, MODEL, ensure_tmux, kill_marked
from tests.fixtures.mlflow_server import MlflowServer

pytestmark = [pytest.mark.skipif(os.geteuid() != 0, reason="Harbor's host environment needs root (mount namespaces)"),
              pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
JOB_SCRIPT = REPO / "tests" / "fixtures" / "terminus2_job.sh"
TASKS = 3  # eval/harbor/agent-dataset: quick, steps, wrong


@pytest.fixture
def agent_marker(cluster: Cluster, eval_env: Path) -> Iterator[str]:
    """Tags the tmux servers terminus-2 leaves on the host; after the test, every job is cancelled and has
    ended, then those servers are ended too."""
    ensure_tmux()
    tag = uuid.uuid4().hex
    yield tag
    cluster.cancel_all()
    wait_until(lambda: not any(j.state.active for j in cluster.scheduler.observe()), "the test's jobs to end",
               timeout_s=60, step_s=0.2)
    kill_marked(tag)


@contextlib.contextmanager
def dead_port() -> Iterator[int]:
    """A loopback port nothing listens on: bound (so nobody else gets it) but never listening, so every connect
    is refused, as with a vLLM that never came up."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield int(sock.getsockname()[1])


def write_spec(cluster: Cluster, eval_env: Path, env: dict[str, str], run: str, n_attempts: int = 1,
               max_concurrent: int = 4) -> None:
    cluster.write(models=[MODEL], datasets=[str(AGENT_DATASET)], env={"EVAL_ENV": str(eval_env), **env},
                  script=JOB_SCRIPT, name="launch-health", max_concurrent=max_concurrent,
                  extra_run=f"  agent: terminus-2\n  nAttempts: {n_attempts}\n{run}")
    cluster.evalctl("validate", "-f", str(cluster.spec))


def status_cell(cluster: Cluster) -> dict:
    [cell] = json.loads(cluster.evalctl("status", "-o", "json").stdout)["evalruns"][0]["cells"]
    return cell


def flat(text: str) -> str:
    """Rich wraps long lines at the terminal width: compare with whitespace collapsed."""
    return " ".join(text.split())


def reconcile(cluster: Cluster, outputs: list[str]) -> None:
    result = cluster.evalctl("reconcile", "--once", check=False)
    outputs.append(f"--- rc={result.returncode}\n{result.stdout}{result.stderr}")
    assert "Traceback" not in result.stdout + result.stderr, outputs[-1]


def submissions(cluster: Cluster) -> list[tuple[str, int]]:
    with sqlite3.connect(cluster.root / "store.db") as conn:
        return conn.execute("SELECT run_tag, attempt FROM evalrun_submissions ORDER BY attempt").fetchall()


def memory(cluster: Cluster) -> dict:
    """What the controller remembers of the (single) cell between passes."""
    with sqlite3.connect(cluster.root / "store.db") as conn:
        [(doc,)] = conn.execute("SELECT memory FROM evalrun_cell_memory").fetchall()
    return dict(json.loads(doc))


def tracked_runs(server: MlflowServer, run_tag: str) -> list:
    """Every MLflow run, in any experiment, tagged with the run tag (how the tracker finds a cell's run again)."""
    client = MlflowClient(server.url)
    experiments = [e.experiment_id for e in client.search_experiments()]
    return client.search_runs(experiments, filter_string=f"tags.`evalrun.run_tag` = '{run_tag}'") if experiments else []


@pytest.mark.mlflow
def test_a_launch_whose_llm_server_is_down_is_refired_then_held_and_never_uploaded(
        cluster: Cluster, agent_marker: str, eval_env: Path, mlflow_server: MlflowServer) -> None:
    """Nothing listens where the agent calls: every trial of both attempts raises with no output token. The cell is
    refired once (health.maxRefires 1), then held with the dead-launch diagnosis, and at no pass planned to analyse
    or upload: no Finished row with metrics in the results DB, no MLflow run for either attempt's run tag."""
    experiment = f"dead-launch-{uuid.uuid4().hex[:8]}"
    with dead_port() as port:
        write_spec(cluster, eval_env, {"TERMINUS2_LLM": f"down:{port}", "TERMINUS2_MARKER": agent_marker}, f"""\
  health: {{maxRefires: 1, refireBackoffMinutes: 0, deadLaunchTrials: {TASKS}}}
  upload: {{db: true, mlflow: true, mlflowTrackingUri: '{mlflow_server.url}', mlflowExperiment: {experiment}}}""")
        outputs: list[str] = []
        seen: list[dict] = []

        def settled() -> bool:  # held, or (what must not happen) uploaded: the assertions below tell which
            reconcile(cluster, outputs)
            seen.append(status_cell(cluster))
            return seen[-1]["phase"] in ("Failed", "Completed") and \
                not any(j.state.active for j in cluster.scheduler.observe())

        wait_until(settled, "the cell to settle with no job running", timeout_s=420, step_s=0.5)
        reconcile(cluster, outputs)  # settled: one more pass changes nothing
        seen.append(status_cell(cluster))
        explained = flat(cluster.evalctl("explain", MODEL, str(AGENT_DATASET)).stdout)
    text = "".join(outputs)

    # the cell: held with the diagnosis, never Completed, never even on its way to an upload
    cell = seen[-1]
    assert cell["phase"] == "Failed" and cell["rule"] in ("RefiresExhausted", "DeadLaunch"), cell
    assert "dead launch" in cell["reason"] and "instant failures, 0 real trials" in cell["reason"], cell
    assert seen[-2]["phase"] == "Failed" and seen[-2]["reason"] == cell["reason"], "settled"
    assert {c["phase"] for c in seen}.isdisjoint({"Evaluated", "Completed"}), [(c["phase"], c["rule"]) for c in seen]
    assert "upload:" not in text and "track:" not in text and "analyze:" not in text, text[-4000:]
    assert "phase: Failed" in explained and "reason: dead launch: 3 instant failures" in explained, explained
    # one refire (health.maxRefires 1): two attempts, each remembered as a dead launch, each a real Harbor run dir
    # of instant failures
    tags = submissions(cluster)
    assert [attempt for _, attempt in tags] == [1, 2], tags
    remedies = memory(cluster)["remedies"]
    assert [(r["run_tag"], r["cause"], r["kind"]) for r in remedies] == [(t, "dead-launch", "refire") for t, _ in tags]
    for run_tag, _ in tags:
        trials = sorted((cluster.root / "jobs" / run_tag).glob("*/result.json"))
        assert len(trials) == TASKS, (run_tag, trials)
        for path in trials:
            result = json.loads(path.read_text())
            config = json.loads((path.parent / "config.json").read_text())
            assert result["agent_info"]["name"] == "terminus-2" and result["exception_info"] is not None, path
            assert result["agent_result"]["n_output_tokens"] in (None, 0), (path, result["agent_result"])
            assert config["agent"]["kwargs"]["api_base"] == f"http://127.0.0.1:{port}/v1", path
    # nothing reached the leaderboard: no Finished row with metrics, no MLflow run for either attempt
    with sqlite3.connect(cluster.root / "store.db") as conn:
        rows = conn.execute("SELECT job_name, job_status, metrics FROM sandbox_jobs").fetchall()
    assert rows and {name for name, _, _ in rows} <= {tag for tag, _ in tags}, rows
    assert all(status != "Finished" and metrics is None for _, status, metrics in rows), rows
    for run_tag, _ in tags:
        assert tracked_runs(mlflow_server, run_tag) == [], run_tag


def test_a_third_of_requests_answered_400_makes_the_running_cell_stalled(cluster: Cluster, agent_marker: str,
                                                                         eval_env: Path) -> None:
    """The job starts the served model (fake_llm.py, every third request answered 400) and then real Harbor over
    the 3 tasks × 10 attempts, 4 at a time: about 160 requests over a minute or more of Harbor, so the job is
    still RUNNING, trials still landing, when the reconciler has read the 50 requests the rule needs (at about a
    third of the way). terminus-2 retries a 400 after a few seconds, so trials still score: only the job's output
    shows what is wrong."""
    write_spec(cluster, eval_env, {"TERMINUS2_LLM": "fake", "TERMINUS2_BAD_REQUEST_EVERY": "3",
                                   "TERMINUS2_MARKER": agent_marker}, "  health: {deadLaunchTrials: 100}", n_attempts=10)
    outputs: list[str] = []

    def diagnosed() -> dict | None:
        """The reading an acting pass remembered, once that pass decided the cell is Stalled on the 400s."""
        reconcile(cluster, outputs)
        if "requests answered 400" in flat(outputs[-1]):
            return dict(memory(cluster)["output"])
        jobs = cluster.scheduler.observe()
        assert not jobs or any(j.state.active for j in jobs), \
            "the job ended before a pass found the 400s:\n" + "".join(outputs)[-4000:]
        return None

    reading = wait_until(diagnosed, "a pass to find the 400 share", timeout_s=240, step_s=0.5)
    assert isinstance(reading, dict)
    cell = status_cell(cluster)  # status plans afresh: it reads the output on from the remembered offset
    [job] = cluster.scheduler.observe()
    explained = flat(cluster.evalctl("explain", MODEL, str(AGENT_DATASET)).stdout)

    assert job.state.value == "Running", "reported, not cancelled: the job goes on"
    assert "max_input_tokens" in flat(outputs[-1]) and "cancel:" not in outputs[-1], outputs[-1]
    assert cell["phase"] == "Stalled" and cell["rule"] == "BadRequests", cell
    assert "max_input_tokens" in cell["reason"] and "answered 400" in cell["reason"], cell
    assert int(cell["reason"].split(" of ", 1)[1].split()[0]) >= reading["requests"] >= 50, (cell, reading)
    assert cell["health"]["state"] == "stalled" and [a["kind"] for a in cell["actions"]] == ["wait"], cell
    assert "400 share above health.badRequestFraction" in explained and "max_input_tokens" in explained, explained
    # what the pass read is what the job printed, up to the offset it remembers: the served model's uvicorn lines
    [log] = (cluster.root / "logs").glob(f"{job.name}_{job.job_id}.out")
    read = log.read_bytes()[: reading["offset"]].decode().splitlines()
    lines = [line for line in read if '"POST /v1/chat/completions HTTP/1.1"' in line]
    assert reading["job_id"] == job.job_id and "INFO:     Application startup complete." in read
    assert len(lines) == reading["requests"], (len(lines), reading)
    assert sum(line.endswith(" 400 Bad Request") for line in lines) == reading["bad_requests"], reading
    assert abs(reading["bad_requests"] - reading["requests"] // 3) <= 2, reading  # lines print a bit out of order
