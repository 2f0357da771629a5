"""Issue 15 under the operator: an EvalRun there always has a namespace, and its installed-agent cells share
the pinggy pairs of spec.pinggy. With one pair, the first cell's lease must be released under the same
`namespace/name` the plan knows the EvalRun by, or the second cell waits for a free pair forever."""

from __future__ import annotations

import pytest

from tests.kube.conftest import Lab

pytestmark = pytest.mark.kube

ONE_PAIR = """  agent: openhands
  pinggy:
    pairs: [{name: pair-1, url: "https://pair-1.a.pinggy.link", secretRef: {name: pinggy-1, key: token}}]
"""


def test_one_pinggy_pair_serves_two_installed_agent_cells_one_after_the_other(lab: Lab):
    lab.kube.kubectl("create", "secret", "generic", "pinggy-1", "-n", lab.namespace, "--from-literal=token=tok-pair-1")
    lab.start_operator()
    lab.apply(lab.cluster_yaml(), lab.run_yaml(["org/agent-a-8B", "org/agent-b-8B"], extra=ONE_PAIR))

    lab.wait_condition("Ready")

    summary = lab.evalrun()["status"]["summary"]
    assert {phase: n for phase, n in summary["phases"].items() if n} == {"Completed": 2}, summary
    assert summary["done"] == summary["total"] == 2, summary
    first, second = sorted(lab.jobs(), key=lambda job: job.submitted_at)
    assert sorted(job.name.split("__")[1] for job in (first, second)) == ["agent-a-8B", "agent-b-8B"]
    assert first.ended_at is not None and second.submitted_at is not None
    assert second.submitted_at >= first.ended_at, "one pair serves one job at a time"
