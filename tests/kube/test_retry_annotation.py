"""The `evalrun.io/retry` annotation on the real API server (issue 29, RULES §13): a cell held because its job
script failed is released by annotating the EvalRun, and completes with one new job; status and an Event say so."""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

import pytest

from tests.kube.conftest import FAKE_HARBOR, Lab, eventually

pytestmark = pytest.mark.kube


def test_the_retry_annotation_releases_a_held_cell_once(lab: Lab):
    script = lab.root / "run.sh"
    script.write_text("#!/bin/sh\nexec /nonexistent/eval_harbor.py \"$@\"\n")
    script.chmod(0o755)
    lab.start_operator()
    lab.apply(lab.cluster_yaml().replace(str(FAKE_HARBOR), str(script)), lab.run_yaml(["org/a-8B"]))
    eventually(lambda: (lab.evalrun().get("status") or {}).get("summary", {}).get("failed") == 1, "the cell held")
    assert [j.state.value for j in lab.jobs()] == ["Failed"]
    [item] = lab.evalrun()["status"]["attention"]
    assert item["release"].startswith(f"kubectl annotate evalrun/demo -n {lab.namespace} --overwrite "
                                      "evalrun.io/retry=<new token> 'evalrun.io/retry-cells=model=org/a-8B,"), item
    script.write_text(f"#!/bin/sh\nexec {sys.executable} {FAKE_HARBOR} \"$@\"\n")

    lab.kube.kubectl("annotate", "evalrun/demo", "-n", lab.namespace, "evalrun.io/retry=fix-1",
                     "evalrun.io/retry-reason=job script fixed")

    lab.wait_condition("Ready")
    retry = lab.evalrun()["status"]["retry"]
    assert retry["token"] == "fix-1" and len(retry["cells"]) == 1 and retry["cells"][0].startswith("org/a-8B ×")
    events = [e for e in lab.events() if e["involvedObject"]["name"] == "demo" and e["reason"] == "RetryRequested"]
    assert len(events) == 1 and "job script fixed" in events[0]["message"], events
    assert sorted(j.state.value for j in lab.jobs()) == ["Completed", "Failed"], "one new job, the old one kept"
    with sqlite3.connect(Path(lab.store.removeprefix("sqlite:///"))) as conn:
        [(by, consumed)] = conn.execute("SELECT requested_by, consumed_attempt FROM evalrun_retry_requests")
    assert (by, consumed) == (f"annotation evalrun.io/retry=fix-1 on {lab.namespace}/demo", 2)
