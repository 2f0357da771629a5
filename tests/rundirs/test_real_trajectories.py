"""Step and token statistics from REAL Harbor trajectories: Harbor 0.26.0's `terminus-2` agent runs the three
tasks of eval/harbor/agent-dataset on this machine against eval/harbor/fake_llm.py (the only fake: no LLM can
run here), and Harbor's own code writes each trial's `agent/trajectory.json` (ATIF).

What the reconciler computes (`step_stats`, `write_post_eval_report`, on this Python) is checked against what
Harbor's own `Trajectory` model reads from the same files (in the eval env's Python), and both against the fake
LLM's scripts: quick → 3 steps, steps → 5, wrong → 6 (one unparsable answer, reward 0).
"""

from __future__ import annotations

import os
import statistics
from collections import defaultdict
from pathlib import Path

import pytest
from fsspec.implementations.local import LocalFileSystem

from controller.adapters.rundirs.harbor import HarborRunDirs
from controller.adapters.rundirs.harbor_format import trial_outcome
from controller.adapters.rundirs.post_eval import REPORT_NAME, TokenStats, step_stats, write_post_eval_report
from tests.core.builders import metrics_of
from tests.fixtures.harbor_agent import MODEL, AgentRun, fake_llm, run_terminus2
from tests.fixtures.harbor_dirs import REFERENCE_ERRORS

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="Harbor's host environment needs root (mount namespaces)")

TASKS = {"quick": 1.0, "steps": 1.0, "wrong": 0.0}  # task -> reward


@pytest.fixture(scope="module")
def agent_run(eval_env: Path, tmp_path_factory: pytest.TempPathFactory) -> AgentRun:
    return run_terminus2(eval_env, tmp_path_factory.mktemp("terminus2") / "jobs")


def _task(run: AgentRun, trial: str) -> str:
    return str(run.trial_results[trial]["task_name"])


def test_terminus2_ran_every_task_against_the_fake_llm(agent_run: AgentRun) -> None:
    assert agent_run.llm_errors == []
    results = agent_run.trial_results
    assert sorted(_task(agent_run, t) for t in results) == sorted(TASKS)
    for trial, result in results.items():
        task = _task(agent_run, trial)
        assert result["exception_info"] is None, (trial, result["exception_info"])
        assert result["agent_info"]["name"] == "terminus-2"
        assert result["verifier_result"]["rewards"]["reward"] == TASKS[task], trial  # the shell really ran
        assert (result["agent_result"]["n_input_tokens"], result["agent_result"]["n_output_tokens"]) == \
            fake_llm.expected_tokens(task)
    # every trial has a trajectory, and the server saw each task's conversation turn by turn, each turn once
    assert set(agent_run.trajectories) == set(results)
    by_script: dict[str, list[fake_llm.Call]] = defaultdict(list)
    for call in agent_run.calls:
        by_script[call.script].append(call)
    assert set(by_script) == set(TASKS)
    for trial, trajectory in agent_run.trajectories.items():
        task = _task(agent_run, trial)
        calls = by_script[task]
        assert [c.turn for c in calls] == list(range(len(fake_llm.SCRIPTS[task])))
        assert {c.model for c in calls} == {MODEL.split("/", 1)[1]}  # litellm strips the provider prefix
        assert len(calls) == trajectory.n_steps - 1  # one agent step per LLM reply, after the user's prompt


def test_harbor_validates_each_trajectory_as_scripted(agent_run: AgentRun) -> None:
    for trial, trajectory in agent_run.trajectories.items():
        task = _task(agent_run, trial)
        replies = fake_llm.SCRIPTS[task]
        assert (trajectory.agent, trajectory.model_name) == ("terminus-2", MODEL)
        assert trajectory.sources == ["user"] + ["agent"] * len(replies)
        assert trajectory.n_steps == fake_llm.expected_steps(task)
        # per-step metrics are the usage blocks the server sent, final_metrics their sums
        assert trajectory.step_tokens == [None] + [[r.prompt_tokens, r.completion_tokens] for r in replies]
        assert (trajectory.total_prompt_tokens, trajectory.total_completion_tokens) == fake_llm.expected_tokens(task)
    assert sorted(t.n_steps for t in agent_run.trajectories.values()) == [3, 5, 6]


def test_step_stats_of_real_trajectories(agent_run: AgentRun) -> None:
    counts = [t.n_steps for t in agent_run.trajectories.values()]
    with_trajectory = [d for d in agent_run.run_dir.iterdir() if (d / "agent" / "trajectory.json").is_file()]

    stats = step_stats(agent_run.run_dir, REFERENCE_ERRORS)

    assert stats is not None
    assert stats.n_trajectories == len(with_trajectory) == len(agent_run.trial_results) == 3
    assert stats.mean == pytest.approx(statistics.fmean(counts)) and stats.mean == pytest.approx(14 / 3)
    assert (stats.median, stats.max) == (statistics.median(counts), max(counts)) == (5, 6)
    # the fsspec (login-node) reader agrees
    assert step_stats(str(agent_run.run_dir), REFERENCE_ERRORS, LocalFileSystem()) == stats


def test_token_stats_of_real_trajectories(agent_run: AgentRun) -> None:
    trajectories = list(agent_run.trajectories.values())
    prompts = [t.total_prompt_tokens or 0 for t in trajectories]
    completions = [t.total_completion_tokens or 0 for t in trajectories]
    totals = [p + c for p, c in zip(prompts, completions, strict=True)]
    assert sorted(totals) == [1893, 5480, 6640]  # 1815+78, 5303+177, 6515+125 from the scripts

    stats = step_stats(agent_run.run_dir, REFERENCE_ERRORS)

    assert stats is not None and isinstance(stats.tokens, TokenStats)
    assert stats.tokens.model_dump() == {
        "n_trajectories": 3, "prompt_mean": pytest.approx(statistics.fmean(prompts)),
        "completion_mean": pytest.approx(statistics.fmean(completions)),
        "total_mean": pytest.approx(statistics.fmean(totals)), "total_median": statistics.median(totals),
        "total_max": max(totals)}


def test_post_eval_report_of_a_real_run(agent_run: AgentRun) -> None:
    run_dir = agent_run.run_dir
    (facts,) = HarborRunDirs(str(run_dir.parent), REFERENCE_ERRORS).observe()

    path, summary = write_post_eval_report(run_dir, facts, REFERENCE_ERRORS, metrics_of(facts, REFERENCE_ERRORS))

    assert path == run_dir / REPORT_NAME
    assert summary.mean_score == pytest.approx(2 / 3) and (summary.n_valid, summary.n_total) == (3, 3)
    assert summary.steps == step_stats(run_dir, REFERENCE_ERRORS)
    text = path.read_text()
    assert "steps per trial (n=3): mean 4.67  median 5  max 6\n" in text
    assert "tokens per trial (n=3): mean 4671.0 (prompt 4544.3, completion 126.7)  median 5480  max 6640\n" in text


def test_launch_facts_of_a_real_run(agent_run: AgentRun) -> None:
    """What launch health reads, from Harbor's own files: the trials' endpoint, no quiet failure, all started."""
    (facts,) = HarborRunDirs(str(agent_run.run_dir.parent), REFERENCE_ERRORS).observe()
    api_base = next(arg.removeprefix("api_base=") for arg in agent_run.command if arg.startswith("api_base="))
    assert (facts.api_base, facts.quiet_failures, facts.n_started_trials) == (api_base, (), 3)
    outcomes = [trial_outcome((agent_run.run_dir / name / "result.json").read_bytes()) for name in agent_run.trial_results]
    assert [o.n_output_tokens for o in outcomes] == [r["agent_result"]["n_output_tokens"]
                                                      for r in agent_run.trial_results.values()]
    assert all(o.agent_seconds is not None and o.agent_seconds > 0 for o in outcomes)
