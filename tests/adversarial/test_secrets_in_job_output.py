"""A job that prints its own key: the key must not travel on through reasons, JSON, events or the store."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from controller.adapters.scheduler.local import LocalScheduler
from controller.adapters.secrets import SecretMask
from tests.fixtures.evalctl import cancel_live_jobs, run_evalctl, wait_until

SECRET = "dtn-9f8e7d6c5b4a-live"
VARIABLE = "EVALCTL_SECRET_DAYTONA_API_KEY"


def test_the_mask_replaces_longest_first_and_withholds_what_it_cannot_mask() -> None:
    mask = SecretMask(values=["abcd", "abcdefgh"])
    assert mask("key=abcdefgh; other=abcd") == "key=***; other=***"
    withheld = SecretMask(values=["abcd"], unavailable=[VARIABLE])("key=abcd")
    assert "abcd" not in withheld and VARIABLE in withheld
    assert SecretMask(values=["abc"])("abc") == "abc", "too short to be a secret: ordinary words stay"


@pytest.fixture
def leaky(tmp_path: Path):
    script = tmp_path / "leaky.sh"
    script.write_text('#!/bin/sh\nmkdir -p "$EVAL_JOBS_DIR"\necho "auth with $DAYTONA_API_KEY failed"\nexit 3\n')
    script.chmod(0o755)
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"""
apiVersion: evalrun.io/v1alpha1
kind: EvalCluster
metadata: {{name: local}}
spec:
  scheduler: {{type: local}}
  jobsDir: {tmp_path}/jobs
  logsDir: {tmp_path}/logs
  jobScript: {script}
  secretEnv: [{{name: DAYTONA_API_KEY, secretRef: {{name: daytona, key: api-key}}}}]
---
apiVersion: evalrun.io/v1alpha1
kind: EvalRun
metadata: {{name: leaky}}
spec:
  cluster: local
  models: [org/leaky-8B]
  datasets: [DCAgent/tiny]
""")
    yield spec
    cancel_live_jobs(LocalScheduler(tmp_path / "logs" / ".local-scheduler"))


def test_a_printed_key_is_masked_with_it_and_withheld_without_it(leaky: Path) -> None:
    store = f"sqlite:///{leaky.parent}/store.db"
    with_key = {**os.environ, VARIABLE: SECRET}
    without_key = {k: v for k, v in os.environ.items() if k != VARIABLE}
    run_evalctl(("reconcile", "--once"), spec=leaky, store=store, env=with_key)
    scheduler = LocalScheduler(leaky.parent / "logs" / ".local-scheduler")
    wait_until(lambda: all(not j.state.active for j in scheduler.observe()), "the leaky job to fail")
    assert SECRET in next((leaky.parent / "logs").glob("*.out")).read_text(), "the job did print its key"

    masked = run_evalctl(("plan", "-o", "json"), spec=leaky, store=store, env=with_key)
    [cell] = json.loads(masked.stdout)["evalruns"][0]["cells"]
    assert cell["phase"] == "Failed" and "auth with *** failed" in cell["reason"]

    outputs = [run_evalctl((command, "-o", "json"), spec=leaky, store=store, env=without_key).stdout
               for command in ("plan", "status")]
    outputs.append(run_evalctl(("reconcile", "--once"), spec=leaky, store=store, env=with_key, check=False).stdout)
    outputs.append(run_evalctl(("explain", "org/leaky-8B", "DCAgent/tiny"), spec=leaky, store=store,
                               env=without_key).stdout)
    assert all(SECRET not in text for text in outputs)
    assert "withheld" in outputs[0], "without the key the tail cannot be masked, so it is not shown"
    stored = b"".join(p.read_bytes() for p in leaky.parent.glob("store.db*"))
    assert SECRET.encode() not in stored
