"""Secrets in job text, end to end on the local scheduler: masked where the text is read, and never inherited.

The reconciler's environment holds tokens (HF_TOKEN, OPENAI_API_KEY, a site key) that no cluster declares; one
cluster declares its own HF_TOKEN in `secretEnv`. Each job prints its environment, the HF_TOKEN it sees, a site
key and token-shaped values it was never given (hard-coded, as a job that found them in a file would), then fails at
start. Real parts: `evalctl` as a subprocess, local-scheduler jobs, the SQLite store, a loopback webhook, the HTML
report. No token may appear in any output, the report, the webhook's messages or any row of the store; a job sees
an HF_TOKEN only where its cluster declares one. A completed cell whose run dir names a token (a trial's exception
class) uploads it masked: the store's rows and the MLflow run (a real `mlflow server`) hold no token.
"""

from __future__ import annotations

import json
import os
import secrets
import sqlite3
import string
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from mlflow import MlflowClient

from controller.adapters.scheduler.local import LocalScheduler
from tests.e2e.conftest import FAKE_HARBOR, Cluster
from tests.fixtures.evalctl import cancel_live_jobs, run_evalctl, wait_until
from tests.fixtures.mlflow_server import MlflowServer
from tests.fixtures.webhook import Webhook, webhook_server

ALNUM = string.ascii_letters + string.digits


def _random(n: int, alphabet: str = ALNUM) -> str:
    return "".join(secrets.choice(alphabet) for _ in range(n))


AMBIENT_HF = f"hf_{_random(36)}"  # the reconciler's own: declared nowhere
AMBIENT_OPENAI = f"sk-proj-{_random(40)}9"
AMBIENT_SITE = f"site-{secrets.token_hex(16)}"  # no known shape: only its variable's name says it is a secret
DECLARED_HF = f"hf_{_random(36)}"  # the `declared` cluster's secretEnv HF_TOKEN
HARD_CODED = {  # token shapes a job prints without being given them
    "github": f"ghp_{_random(36)}",
    "aws": f"AKIA{_random(16, string.ascii_uppercase + string.digits)}",
    "slack": f"xoxb-{_random(12, string.digits)}-{_random(24)}",
    "jwt": f"eyJ{_random(16)}.eyJ{_random(24)}.{_random(32)}",
}
TOKENS = {"ambient HF_TOKEN": AMBIENT_HF, "ambient OPENAI_API_KEY": AMBIENT_OPENAI, "ambient site key": AMBIENT_SITE,
          "declared HF_TOKEN": DECLARED_HF, **HARD_CODED}
MODELS = {"bare": "org/bare-8B", "declared": "org/declared-8B"}
DATASET = "DCAgent/tiny"


def job_script(root: Path) -> Path:
    """Prints its environment, then five lines a failed job's reason shows, and fails before any trial."""
    script = root / "leaky.sh"
    script.write_text(f"""#!/bin/sh
mkdir -p "$EVAL_JOBS_DIR"
echo "== environment"
env | sort
echo "== end of environment"
echo "hub login with ${{HF_TOKEN:-no HF_TOKEN}} refused"
echo "site key {AMBIENT_SITE} from ~/.config/site"
echo "keys found: {HARD_CODED['github']} {HARD_CODED['aws']}"
echo "webhook bot {HARD_CODED['slack']}"
echo "session {HARD_CODED['jwt']} expired"
exit 3
""")
    script.chmod(0o755)
    return script


def spec_text(root: Path, script: Path) -> str:
    notify = """  notify:
    webhooks: [{name: team, secretRef: {name: slack, key: url}, events: [Failed]}]"""
    documents = []
    for name, model in MODELS.items():
        secret_env = "  secretEnv: [{name: HF_TOKEN, secretRef: {name: hf, key: token}}]" if name == "declared" else ""
        documents.append(f"""apiVersion: evalrun.io/v1alpha1
kind: EvalCluster
metadata: {{name: {name}}}
spec:
  scheduler: {{type: local}}
  jobsDir: {root}/{name}/jobs
  logsDir: {root}/{name}/logs
  jobScript: {script}
{secret_env}
---
apiVersion: evalrun.io/v1alpha1
kind: EvalRun
metadata: {{name: {name}}}
spec:
  cluster: {name}
  models: [{model}]
  datasets: [{DATASET}]
{notify}
""")
    return "---\n".join(documents)


@pytest.fixture
def hook(monkeypatch: pytest.MonkeyPatch) -> Iterator[Webhook]:
    with webhook_server() as server:
        monkeypatch.setenv("EVALCTL_SECRET_SLACK_URL", server.url)
        yield server


@pytest.fixture
def spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("HF_TOKEN", AMBIENT_HF)
    monkeypatch.setenv("OPENAI_API_KEY", AMBIENT_OPENAI)
    monkeypatch.setenv("SITE_API_KEY", AMBIENT_SITE)
    monkeypatch.setenv("EVALCTL_SECRET_HF_TOKEN", DECLARED_HF)
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")  # a setting named like a secret: jobs keep it
    monkeypatch.setenv("SITE_SETTING", "kept")
    path = tmp_path / "spec.yaml"
    path.write_text(spec_text(tmp_path, job_script(tmp_path)))
    yield path
    for name in MODELS:
        cancel_live_jobs(scheduler(tmp_path, name))


def scheduler(root: Path, cluster: str) -> LocalScheduler:
    return LocalScheduler(root / cluster / "logs" / ".local-scheduler")


def job_log(root: Path, cluster: str) -> str:
    [log] = (root / cluster / "logs").glob("*.out")
    return log.read_text()


def environment_of(log: str) -> dict[str, str]:
    """What `env` printed in the job, before its own lines."""
    block = log.split("== environment\n", 1)[1].split("== end of environment\n", 1)[0]
    return dict(line.split("=", 1) for line in block.splitlines() if "=" in line)


def store_dump(root: Path) -> str:
    """Every row of every table of the store, as text."""
    with sqlite3.connect(root / "store.db") as conn:
        tables = [name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return "\n".join(f"{table}: {conn.execute(f'SELECT * FROM {table}').fetchall()!r}" for table in tables)


def test_no_token_reaches_any_output_and_jobs_inherit_only_declared_secrets(spec: Path, hook: Webhook) -> None:
    root = spec.parent
    store = f"sqlite:///{root}/store.db"
    evalctl = lambda *args: run_evalctl(args, spec=spec, store=store, env={**os.environ, "COLUMNS": "200"})  # noqa: E731
    outputs = [evalctl("reconcile", "--once")]
    wait_until(lambda: all(not job.state.active for name in MODELS for job in scheduler(root, name).observe())
               and all(len(scheduler(root, name).observe()) == 1 for name in MODELS), "both jobs to fail")

    # what each job saw and printed: the declared HF_TOKEN only where declared, no ambient secret anywhere
    bare, declared = environment_of(job_log(root, "bare")), environment_of(job_log(root, "declared"))
    assert "HF_TOKEN" not in bare and declared["HF_TOKEN"] == DECLARED_HF
    for seen in (bare, declared):
        assert not {"OPENAI_API_KEY", "SITE_API_KEY", "EVALCTL_SECRET_HF_TOKEN", "EVALCTL_SECRET_SLACK_URL"} & set(seen)
        assert seen["TOKENIZERS_PARALLELISM"] == "false" and seen["SITE_SETTING"] == "kept" and seen["PATH"]
    printed = job_log(root, "bare") + job_log(root, "declared")
    assert all(token in printed for token in (DECLARED_HF, AMBIENT_SITE, *HARD_CODED.values()))
    assert AMBIENT_HF not in printed and AMBIENT_OPENAI not in printed

    outputs.append(evalctl("reconcile", "--once"))  # observes the failures: holds, Events, webhook messages
    wait_until(lambda: len(hook.messages()) == len(MODELS), "a Failed message per cell")
    status = evalctl("status", "-o", "json")
    outputs += [status, evalctl("plan", "-o", "json"), evalctl("report", "--out", str(root / "report.html"))]
    outputs += [evalctl("explain", model, DATASET) for model in MODELS.values()]

    cells = {c["model"]: c for run in json.loads(status.stdout)["evalruns"] for c in run["cells"]}
    for model in MODELS.values():
        reason = cells[model]["reason"]
        assert cells[model]["phase"] == "Failed" and "session *** expired" in reason, reason
        assert all(f"{kind}***" in reason for kind in ("ghp_", "AKIA", "xoxb-")), reason
        assert "site key *** from" in reason, reason
    assert "hub login with *** refused" in cells[MODELS["declared"]]["reason"]
    assert "hub login with no HF_TOKEN refused" in cells[MODELS["bare"]]["reason"]

    report = (root / "report.html").read_text()
    sent = json.dumps([message.body for message in hook.messages()])
    stored = store_dump(root)
    raw = b"".join(p.read_bytes() for p in root.glob("store.db*")).decode(errors="replace")
    texts = {"report.html": report, "webhook": sent, "store rows": stored, "store files": raw,
             **{f"evalctl {' '.join(o.args[3:5])} #{i}": o.stdout + o.stderr for i, o in enumerate(outputs)}}
    leaks = [(where, what) for where, text in texts.items() for what, token in TOKENS.items() if token in text]
    assert not leaks, leaks
    assert all("ghp_***" in text for text in (report, sent, stored)), "the masked text did go out"


# --------------------------------------------------------------------------- what a completed cell uploads


def patching_script(root: Path, token: str) -> Path:
    """The fake Harbor, printing `token` as it starts and, once it is done, naming it as a trial's exception class
    (what the post-eval report, the DB row and the MLflow run then count). It runs in a staging dir the reconciler
    does not list and moves the patched run dir into place at once, so no pass reads it finished but unpatched."""
    script = root / "patching.sh"
    script.write_text(f"""#!/bin/sh
echo "pulling weights with {token}"
jobs="$EVAL_JOBS_DIR"
mkdir -p "$jobs/.staging"
EVAL_JOBS_DIR="$jobs/.staging" "{FAKE_HARBOR}" "$@"
status=$?
"{sys.executable}" - "$jobs/.staging/$4" <<'PY'
import json, pathlib, sys
first = sorted(pathlib.Path(sys.argv[1]).glob("*__*/result.json"))[0]
doc = json.loads(first.read_text())
doc["verifier_result"] = None
doc["exception_info"] = {{"exception_type": "{token}", "exception_message": "auth failed for {token}",
                         "exception_traceback": "{token}", "occurred_at": doc["started_at"]}}
first.write_text(json.dumps(doc))
PY
mv "$jobs/.staging/$4" "$jobs/$4"
exit $status
""")
    script.chmod(0o755)
    return script


@pytest.mark.mlflow
def test_a_token_in_a_run_dir_reaches_neither_the_db_nor_mlflow(cluster: Cluster, mlflow_server: MlflowServer,
                                                                tmp_path: Path) -> None:
    token = HARD_CODED["github"]
    experiment = f"e2e-{secrets.token_hex(4)}"
    cluster.write(models=["org/patched-8B"], datasets=[DATASET], script=patching_script(tmp_path, token),
                  env={"FAKE_HARBOR_TASKS": "4", "FAKE_HARBOR_INFRA_ERRORS": "0"},
                  extra_run=f"  upload: {{mlflow: true, mlflowTrackingUri: '{mlflow_server.url}', "
                            f"mlflowExperiment: {experiment}}}")

    converged = cluster.evalctl("reconcile", "--loop", "--interval", "0.5", "--until-done")

    assert token in next((cluster.root / "logs").glob("*.out")).read_text(), "the job did print it"
    status = cluster.evalctl("status", "-o", "json")
    [cell] = json.loads(status.stdout)["evalruns"][0]["cells"]
    assert cell["phase"] == "Completed", cell
    client = MlflowClient(mlflow_server.url)
    [run] = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    artifacts = tmp_path / "artifacts"
    client.download_artifacts(run.info.run_id, "", str(artifacts))
    report = "".join(p.read_text() for p in artifacts.rglob("*") if p.is_file())
    assert "ghp_***" in report, "the run dir's class name went out, masked"
    tracked = json.dumps([run.data.params, run.data.tags, sorted(run.data.metrics)])
    texts = {"MLflow run": tracked, "MLflow artifacts": report, "store rows": store_dump(cluster.root),
             "reconcile": converged.stdout + converged.stderr, "status": status.stdout}
    assert not [where for where, text in texts.items() if token in text]
