"""No tenant slows the others (issue 27), on the real API server: while a hostile namespace's failure-catalog regex
runs on a job printing a 20 MB line of the very text that makes it backtrack, its tracking server and its webhook
answer a byte a second, the victim namespace's EvalRun uploads to its own MLflow server, is notified on its own
webhook and becomes Ready — with the hostile servers' calls asked and never answered.

How long the victim takes beside the hostile namespace, against alone, is a figure, not an assertion:
`make bench-fairness HOSTILE=egress`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.fixtures.mlflow_server import MlflowServer
from tests.fixtures.trickle import Server, http_server
from tests.fixtures.webhook import Webhook, webhook_server
from tests.kube.conftest import FAKE_HARBOR, TENANT_MANIFESTS, Lab, eventually
from tests.kube.test_tenancy import other_namespace, release

pytestmark = [pytest.mark.kube, pytest.mark.mlflow]

HOOK_EVENTS = "events: [Stalled, Failed, Ready, Completed]"


@pytest.fixture
def slow_tracking() -> Iterator[Server]:
    with http_server(trickle_every_s=1) as server:
        yield server


@pytest.fixture
def slow_hook() -> Iterator[Server]:
    with http_server(trickle_every_s=1) as server:
        yield server


@pytest.fixture
def hook() -> Iterator[Webhook]:
    with webhook_server() as server:
        yield server


def hostile_documents(lab: Lab, namespace: str, tracking: str, webhook: str) -> list[str]:
    script = lab.root / "hostile-job.sh"
    script.write_text(f"#!/bin/sh\nhead -c 20000000 /dev/zero | tr '\\0' x\necho\nexec {FAKE_HARBOR} \"$@\"\n")
    script.chmod(0o755)
    cluster = f"""
apiVersion: evalrun.io/v1alpha1
kind: EvalCluster
metadata: {{name: local, namespace: {namespace}}}
spec:
  scheduler: {{type: local}}
  jobsDir: jobs
  logsDir: logs
  jobScript: {script}
  timeLimit: "01:00:00"
  env: {{FAKE_HARBOR_TASKS: "4", FAKE_HARBOR_TRIAL_SECONDS: "1", FAKE_HARBOR_INFRA_ERRORS: "0"}}
  failureCatalog:
    - {{name: backtrack, patterns: ["(x+x+)+y"], when: running, remedy: hold, advice: "a regex that backtracks"}}"""
    secret = (f"apiVersion: v1\nkind: Secret\nmetadata: {{name: alerts, namespace: {namespace}}}\n"
              f"stringData: {{url: '{webhook}/hook'}}")
    uploads = lab.run_yaml(["org/upload-8B"], name="slow-mlflow", namespace=namespace,
                           extra=f"  upload: {{mlflow: true, mlflowTrackingUri: '{tracking}'}}")
    notifies = lab.run_yaml(["org/notify-8B"], name="slow-hook", namespace=namespace,
                            extra=f"  notify: {{webhooks: [{{name: alerts, secretRef: {{name: alerts, key: url}}, "
                                  f"{HOOK_EVENTS}}}]}}")
    return [cluster, secret, uploads, notifies]


def test_a_hostile_namespace_s_regex_output_tracking_server_and_webhook_do_not_hold_the_victim(
        lab: Lab, mlflow_server: MlflowServer, slow_tracking: Server, slow_hook: Server, hook: Webhook) -> None:
    hostile = other_namespace(lab)
    lab.kube.kubectl("apply", "-n", hostile, "-k", str(TENANT_MANIFESTS))  # its webhook Secret may be read
    lab.start_operator("-n", hostile, "--allowed-mlflow-uri", slow_tracking.url, "--allowed-mlflow-uri",
                       mlflow_server.url, "--allowed-webhook-url", slow_hook.url, "--allowed-webhook-url",
                       f"http://127.0.0.1:{hook.port}")
    try:
        lab.apply(*hostile_documents(lab, hostile, slow_tracking.url, slow_hook.url))
        eventually(slow_tracking.requested.is_set, "the hostile tracking server is called (and answers nothing)")
        eventually(slow_hook.requested.is_set, "the hostile webhook is called (and answers nothing)")

        lab.apply(lab.cluster_yaml(),
                  "apiVersion: v1\nkind: Secret\nmetadata: {name: alerts, namespace: " + lab.namespace + "}\n"
                  f"stringData: {{url: '{hook.url}'}}",
                  lab.run_yaml(["org/victim-8B"], extra=f"  upload: {{mlflow: true, mlflowTrackingUri: "
                                                        f"'{mlflow_server.url}', mlflowExperiment: victim}}\n"
                                                        f"  notify: {{webhooks: [{{name: alerts, secretRef: {{name: "
                                                        f"alerts, key: url}}, {HOOK_EVENTS}}}]}}"))
        lab.wait_condition("Ready")

        eventually(lambda: any(m.event == "Ready" for m in hook.messages()), "the victim's Ready message delivered")
        assert not slow_tracking.served.is_set() and not slow_hook.served.is_set(), "the hostile servers never answer"
        assert lab.evalrun()["status"]["summary"]["done"] == 1
        hostile_runs = lab.kube.json("get", "evalruns", "-n", hostile)["items"]
        assert {run["metadata"]["name"] for run in hostile_runs} == {"slow-mlflow", "slow-hook"}
        assert hostile not in json.dumps(lab.evalrun()), "nothing of the hostile namespace in the victim's status"
    finally:
        release(lab, lab.namespace, hostile)
