"""Quiet-dead launches end to end with REAL Harbor (RULES §14, the traffic check): a served model that is up, takes
every request, and never gives the agent one output token is never uploaded.

The harness of tests/e2e/test_launch_health_real_harbor.py (`evalctl reconcile --once` subprocesses, the local
scheduler, the SQLite store, a real `mlflow server`, tests/fixtures/terminus2_job.sh running Harbor 0.26's real
`terminus-2` over the three tasks of eval/harbor/agent-dataset), with the job's served model,
eval/harbor/fake_llm.py, in one of its quiet-dead modes (`FAKE_LLM_MODE` in the job's environment, which the job
script's fake_llm.py inherits):

- `empty`: every request is answered 200 with an empty completion (prompt tokens, 0 completion tokens). The job's
  output shows plenty of 200s (vLLM "works"); terminus-2 cannot parse "", asks again and again until its timeout,
  and the verifier grades the untouched workspace 0. Only the tokens tell that the model never answered.
- `silent`: every request is read and never answered; terminus-2's client waits until the agent times out. The
  job's output shows the server up and no request ever answered.

A dead launch must not reach the leaderboard either way: no Finished row with metrics, no MLflow run. The control,
the same spec against the scripted (default) fake_llm, is uploaded: the assertions can fail.

`timeoutMultiplier: 0.25` (the size rule's default for an unknown model is 2.0): the tasks' 120 s agent timeout is
30 s, so a trial of either mode ends in about half a minute; `health.maxRefires: 0`, so one attempt decides.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
import uuid
from pathlib import Path

import pytest

from tests.e2e.conftest import Cluster
from tests.e2e.test_launch_health_real_harbor import (
    TASKS,
    agent_marker,  # noqa: F401 - the fixture, used by name
    flat,
    memory,
    reconcile,
    status_cell,
    submissions,
    tracked_runs,
    write_spec,
)
from tests.fixtures.evalctl import wait_until
from tests.fixtures.harbor_agent import AGENT_DATASET, MODEL
from tests.fixtures.mlflow_server import MlflowServer

pytestmark = [pytest.mark.skipif(os.geteuid() != 0, reason="Harbor's host environment needs root (mount namespaces)"),
              pytest.mark.slow, pytest.mark.mlflow]

POST = '"POST /v1/chat/completions HTTP/1.1"'
SETTLE_TIMEOUT_S = 240.0


def run_cell(cluster: Cluster, eval_env: Path, marker: str, mlflow_url: str,
             mode: str | None) -> tuple[list[dict], list[str], str]:
    """One EvalRun of the agent dataset against the job's fake_llm in `mode` (None: the default), reconciled until
    the cell is out of flight with no job running; (the cell at every pass, the passes' output, `explain`)."""
    env = {"TERMINUS2_LLM": "fake", "TERMINUS2_MARKER": marker, **({"FAKE_LLM_MODE": mode} if mode else {})}
    write_spec(cluster, eval_env, env, f"""\
  timeoutMultiplier: 0.25
  health: {{maxRefires: 0, refireBackoffMinutes: 0, deadLaunchTrials: {TASKS}}}
  upload: {{db: true, mlflow: true, mlflowTrackingUri: '{mlflow_url}', mlflowExperiment: quiet-{uuid.uuid4().hex[:8]}}}""")
    outputs: list[str] = []
    seen: list[dict] = []

    def settled() -> bool:  # held, or uploaded: the assertions tell which
        reconcile(cluster, outputs)
        seen.append(status_cell(cluster))
        return seen[-1]["phase"] in ("Failed", "Completed") and \
            not any(j.state.active for j in cluster.scheduler.observe())

    started = time.monotonic()
    try:
        wait_until(settled, "the cell to settle with no job running", timeout_s=SETTLE_TIMEOUT_S, step_s=0.5)
    except AssertionError as timed_out:
        raise AssertionError(f"{timed_out}: phases {[(c['phase'], c['rule']) for c in seen][-5:]}\n"
                             + "".join(outputs)[-4000:]) from None
    reconcile(cluster, outputs)  # settled: one more pass changes nothing
    seen.append(status_cell(cluster))
    explained = flat(cluster.evalctl("explain", MODEL, str(AGENT_DATASET)).stdout)
    cell = seen[-1]
    print(f"\n[{mode or 'script'}] settled in {time.monotonic() - started:.0f}s after {len(outputs)} passes: "
          f"phase={cell['phase']} rule={cell['rule']}\n  reason: {cell['reason']}\n  phases: "
          f"{sorted({(c['phase'], c['rule']) for c in seen})}\n  explain: {explained[:1500]}")
    return seen, outputs, explained


def trial_results(cluster: Cluster, run_tag: str) -> dict[str, dict]:
    results = {p.parent.name: json.loads(p.read_text())
               for p in sorted((cluster.root / "jobs" / run_tag).glob("*/result.json"))}
    for name, result in results.items():
        print(f"  trial {name}: exception_info={json.dumps(result.get('exception_info'))[:300]} "
              f"agent_result={json.dumps(result.get('agent_result'))[:300]} "
              f"verifier_result={json.dumps(result.get('verifier_result'))}")
    return results


def job_output(cluster: Cluster) -> list[str]:
    """What the (single) job printed: the served model's uvicorn lines among them."""
    [log] = cluster.root.joinpath("logs").glob("*.out")
    return log.read_text(errors="replace").splitlines()


def results_rows(cluster: Cluster) -> list[tuple[str, str, str | None]]:
    with sqlite3.connect(cluster.root / "store.db") as conn:
        return conn.execute("SELECT job_name, job_status, metrics FROM sandbox_jobs").fetchall()


@pytest.mark.parametrize("mode", ["empty", "silent"])
def test_a_served_model_that_never_gives_one_output_token_is_never_uploaded(
        mode: str, cluster: Cluster, agent_marker: str, eval_env: Path,  # noqa: F811 - the fixture
        mlflow_server: MlflowServer) -> None:
    """Every trial times out (AgentTimeoutError after 30 s) with 0 output tokens, and the verifier grades the
    untouched workspace 0: held at once, with `empty` refused by the admission gate (NoModelTraffic: usage says 0
    output tokens although the job's output shows hundreds of 200s) and `silent` diagnosed by launch health (3
    instant failures: no request was ever answered). No row Finished with metrics, no MLflow run."""
    seen, outputs, explained = run_cell(cluster, eval_env, agent_marker, mlflow_server.url, mode)
    text = "".join(outputs)
    [(run_tag, _)] = submissions(cluster)
    results = trial_results(cluster, run_tag)
    rows = results_rows(cluster)
    runs = tracked_runs(mlflow_server, run_tag)
    output = job_output(cluster)
    posts = [line for line in output if POST in line]
    print(f"  results rows: {rows}\n  mlflow runs: {[(r.info.run_id, r.data.metrics) for r in runs]}\n"
          f"  job output: {len(posts)} chat-completions access lines, {sum(' 200 OK' in p for p in posts)} of them "
          f"200")

    # the launch really was quiet-dead: Harbor ran every task, the model took requests and never gave a token
    assert len(results) == TASKS, results
    for name, result in results.items():
        assert result["agent_info"]["name"] == "terminus-2", name
        assert result["agent_result"]["n_output_tokens"] in (None, 0), (name, result["agent_result"])
    assert "INFO:     Application startup complete." in output
    if mode == "empty":  # answered 200, again and again, with the prompt read and nothing written
        assert posts and all(line.endswith(" 200 OK") for line in posts), posts[:5]
        assert all(result["agent_result"]["n_input_tokens"] for result in results.values()), results
    else:  # taken and never answered: no access line at all
        assert posts == [], posts[:5]

    # nothing reached the leaderboard: no Finished row with metrics, no MLflow run, no pass on its way to upload
    assert all(status != "Finished" and metrics is None for _, status, metrics in rows), rows
    assert runs == [], [(r.info.run_id, r.data.metrics) for r in runs]
    assert {c["phase"] for c in seen}.isdisjoint({"Evaluated", "Completed"}), [(c["phase"], c["rule"]) for c in seen]
    assert "upload:" not in text and "track:" not in text, text[-4000:]
    # held at once (health.maxRefires 0), with the diagnosis that names the dead launch
    cell = seen[-1]
    assert cell["phase"] == "Failed" and cell["rule"] == "RefiresExhausted", cell
    assert seen[-2]["phase"] == "Failed" and seen[-2]["reason"] == cell["reason"], "settled"
    if mode == "empty":  # the trials ran their full 30 s and read prompts: only the admission gate's traffic check
        # tells (0 output tokens where usage is reported), whatever the job's output says of requests
        assert cell["reason"].startswith("refused (NoModelTraffic): no trial shows the model answering (0 of 3 "
                                         "trials reporting usage got model output, "), cell
        assert int(cell["reason"].split("got model output, ", 1)[1].split()[0]) > 0, cell  # the 200s were read
    else:  # the model never answered one request: launch health's instant failures
        assert cell["reason"].startswith("dead launch: 3 instant failures, 0 real trials"), cell
    assert "a dead launch" in cell["reason"] or cell["reason"].startswith("dead launch"), cell
    assert "not refired again: 0 refire(s) used (health.maxRefires)" in cell["reason"], cell
    assert "phase: Failed" in explained and "score: — (none uploaded)" in explained, explained
    assert f"reason: {flat(cell['reason'])}" in explained, explained
    remedies = memory(cluster)["remedies"]
    assert [(r["run_tag"], r["cause"], r["kind"]) for r in remedies] == [(run_tag, "dead-launch", "refire")], remedies


def test_the_same_run_against_the_scripted_model_is_uploaded(
        cluster: Cluster, agent_marker: str, eval_env: Path,  # noqa: F811 - the fixture
        mlflow_server: MlflowServer) -> None:
    """The control: the same spec and job, fake_llm in its default mode (quick and steps solve their task, wrong
    does not), is admitted and uploaded: 2 of 3."""
    seen, _, _ = run_cell(cluster, eval_env, agent_marker, mlflow_server.url, None)
    [(run_tag, _)] = submissions(cluster)
    results = trial_results(cluster, run_tag)
    rows = results_rows(cluster)
    runs = tracked_runs(mlflow_server, run_tag)
    print(f"  results rows: {rows}\n  mlflow runs: {[(r.info.run_id, r.data.metrics) for r in runs]}")

    assert len(results) == TASKS and all(r["agent_result"]["n_output_tokens"] for r in results.values()), results
    assert seen[-1]["phase"] == "Completed", seen[-1]
    [(name, status, metrics)] = rows
    assert name == run_tag and status == "Finished" and metrics is not None, rows
    assert {m["name"]: m["value"] for m in json.loads(metrics)}["accuracy"] == pytest.approx(2 / 3), metrics
    [tracked] = runs
    assert tracked.data.metrics["accuracy"] == pytest.approx(2 / 3), tracked.data.metrics
