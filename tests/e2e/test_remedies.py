"""Remedies that never do harm (issue 26), end to end on the local scheduler: a back-off that ends, a catalog match
that cannot hide a zombie, benign text that cancels nothing, a GPU-hour budget that holds for a benchmark with no
history.

Real parts: `evalctl` as a subprocess, real local-scheduler jobs running specs/demo/fake_harbor.py (FAKE_HARBOR_PRINT
puts a line in the job's output; FAKE_HARBOR_EXIT_CODE fails it at start; FAKE_HARBOR_HANG_AFTER keeps it running),
the SQLite store read back. Synchronisation on observable state only; the back-off test runs its one real minute
(`backoffMinutes` has minute resolution) inside `reconcile --loop --until-done`.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta

from controller.core.observed import JobState
from tests.e2e.conftest import FAKE_HARBOR, Cluster
from tests.e2e.test_launch_health import (
    DATASET,
    FAST,
    MODEL,
    TRIALS,
    converge,
    ended,
    first_submission,
    job_output,
    once,
    sql,
    submissions,
)
from tests.fixtures.evalctl import wait_until

RATE_LIMITED = "SiteProxyError: 429 rate limited by the site proxy"
SITE_CATALOG = """  failureCatalog:
    - name: site-proxy-rate-limit
      when: start
      patterns: ["^SiteProxyError: 429 "]
      remedy: back-off
      backoffMinutes: 1
      advice: the site's proxy sheds load; launches pause, then the job is refired"""
UNAUTHORIZED = "DaytonaError: Failed to create sandbox: Bearer token is invalid"


def two_evalruns(cluster: Cluster, env: dict[str, str], *, other: bool) -> None:
    """The victim EvalRun, and (when `other`) a second EvalRun of another model on the same cluster."""
    cluster.write(models=[MODEL], datasets=[DATASET], env=env, name="victim", extra_cluster=SITE_CATALOG,
                  extra_run="  health: {refireBackoffMinutes: 0}")
    if other:
        with cluster.spec.open("a") as spec:
            spec.write(f"""---
apiVersion: evalrun.io/v1alpha1
kind: EvalRun
metadata: {{name: other}}
spec:
  cluster: local
  models: [org/other-8B]
  datasets: [{DATASET}]
""")


def quarantines(cluster: Cluster) -> list[tuple[str, str, str]]:
    return sql(cluster, "SELECT kind, name, owner FROM evalrun_quarantine ORDER BY kind, name")


def test_a_back_off_ends_and_both_its_refire_and_another_evalrun_launch(cluster: Cluster) -> None:
    two_evalruns(cluster, {**FAST, "FAKE_HARBOR_PRINT": RATE_LIMITED, "FAKE_HARBOR_EXIT_CODE": "1"}, other=False)
    once(cluster)
    a1 = first_submission(cluster)
    assert wait_until(lambda: ended(cluster, a1), "the job to fail at start") == JobState.FAILED
    two_evalruns(cluster, FAST, other=True)  # the site's proxy answers again; a second EvalRun arrives

    paused = once(cluster)

    assert "quarantine: cluster local quarantined" in paused and "site-proxy-rate-limit" in paused, paused
    [(until,)] = sql(cluster, "SELECT until FROM evalrun_quarantine WHERE kind = 'cluster'")
    assert [name for name, _, _ in submissions(cluster)] == [a1], "nothing launches while the cluster backs off"

    converge(cluster)

    runs = {run["name"]: run for run in json.loads(cluster.evalctl("status", "-o", "json").stdout)["evalruns"]}
    assert runs["victim"]["counts"] == {"Completed": 1} and runs["other"]["counts"] == {"Completed": 1}, runs
    launched = sql(cluster, "SELECT name, created_at FROM evalrun_submissions ORDER BY created_at")
    assert launched[0][0] == a1 and len(launched) == 3, launched
    # A launch is stamped with its pass's clock, read a moment before the store finds the pause over; the pause is
    # 60 s, so a launch during it would be tens of seconds early, not within a pass's planning time.
    pass_slack = timedelta(seconds=2)
    assert all(datetime.fromisoformat(at) >= datetime.fromisoformat(until) - pass_slack for _, at in launched[1:]), (
        "both the refire and the other EvalRun launched once the pause ended", launched, until)
    assert quarantines(cluster) == [("cluster", "local", "victim")], "one pause, never renewed by its own match"


def test_a_zombie_is_cancelled_and_uploaded_despite_a_401_line(cluster: Cluster) -> None:
    cluster.write(models=[MODEL], datasets=[DATASET],
                  env={**FAST, "FAKE_HARBOR_PRINT": UNAUTHORIZED, "FAKE_HARBOR_HANG_AFTER": str(TRIALS)},
                  extra_run="  monitor: {zombieGraceMinutes: 0, settleMinutes: 0}")
    once(cluster)
    a1 = first_submission(cluster)
    wait_until(lambda: len(list((cluster.root / "jobs" / a1).glob("*__*/result.json"))) == TRIALS,
               "every trial to have a result")
    wait_until(lambda: UNAUTHORIZED in job_output(cluster, a1), "the 401 line in the job's output")

    decided = once(cluster)

    assert "zombie job" in decided and f"cancelled job {cluster.jobs_named(a1)[0].job_id}" in decided, decided
    assert "daytona-load-shedding" in decided, "the match's advice and back-off ride along"
    assert wait_until(lambda: ended(cluster, a1), "the zombie to end") == JobState.CANCELLED
    converge(cluster)
    [run] = json.loads(cluster.evalctl("status", "-o", "json").stdout)["evalruns"]
    assert run["counts"] == {"Completed": 1}, run
    assert [(e["kind"], e["subject"]) for e in run["effects"]] == [("back-off", "local")], run["effects"]


def test_a_stalled_launch_is_cancelled_despite_a_401_line(cluster: Cluster) -> None:
    cluster.write(models=[MODEL], datasets=[DATASET],
                  env={**FAST, "FAKE_HARBOR_PRINT": UNAUTHORIZED, "FAKE_HARBOR_HANG_AFTER": "0"},
                  extra_run="  health: {launchGraceMinutes: 0}")
    once(cluster)
    a1 = first_submission(cluster)
    wait_until(lambda: UNAUTHORIZED in job_output(cluster, a1), "the 401 line in the job's output")

    decided = once(cluster)

    assert "stalled launch: no trial started" in decided and "daytona-load-shedding" in decided, decided
    assert wait_until(lambda: ended(cluster, a1), "the launch to end") == JobState.CANCELLED
    assert quarantines(cluster) == [("cluster", "local", "e2e")], "the match's back-off started all the same"


def test_a_healthy_job_that_mentions_nccl_timeout_runs_on_unquarantined(cluster: Cluster) -> None:
    cluster.write(models=[MODEL], datasets=[DATASET],
                  env={**FAST, "FAKE_HARBOR_PRINT": "export NCCL_TIMEOUT=1800 NCCL_DEBUG=INFO  # watchdog timeout"})

    converge(cluster)

    [run] = json.loads(cluster.evalctl("status", "-o", "json").stdout)["evalruns"]
    assert run["counts"] == {"Completed": 1} and run["effects"] == [], run
    assert len(submissions(cluster)) == 1 and quarantines(cluster) == []


def test_a_budget_holds_for_a_benchmark_with_no_history(cluster: Cluster) -> None:
    models = [f"org/probe{i}-8B" for i in range(4)]
    cluster.write(models=models, datasets=[DATASET], env=FAST, max_per_pass=4, extra_run="  budget: {maxGpuHours: 0.05}",
                  extra_cluster="  gpusPerJob: 1", script=FAKE_HARBOR)

    [planned] = json.loads(cluster.evalctl("plan", "-o", "json").stdout)["evalruns"]
    once(cluster)

    launches = [c for c in planned["cells"] if [a["kind"] for a in c["actions"]] == ["submit"]]
    held = [a["reason"] for c in planned["cells"] for a in c["actions"] if a["kind"] == "hold"]
    assert len(launches) == 1 and "GPU-hour probe for" in launches[0]["reason"], launches
    assert len(held) == 3 and all("a probe job of it is measuring the cost" in h for h in held), held
    assert len(submissions(cluster)) == 1
    converge(cluster)
    [run] = json.loads(cluster.evalctl("status", "-o", "json").stdout)["evalruns"]
    assert run["gpu_hours"]["spent"] <= 0.05, run["gpu_hours"]
