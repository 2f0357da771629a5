"""Webhooks end to end: `evalctl reconcile --loop` on the local demo cluster, killed with SIGKILL at each step of the
outbox protocol and in the middle of a run, then restarted; the loopback webhook gets exactly one message per
transition, and its URL (a secret) appears in no output, status or store."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator

import pytest

from tests.e2e.conftest import Cluster
from tests.fixtures.evalctl import wait_until
from tests.fixtures.webhook import SECRET_PATH, Webhook, webhook_server

MODELS = ["org/a-8B", "org/b-8B"]
FAST = {"FAKE_HARBOR_TASKS": "4", "FAKE_HARBOR_TRIAL_SECONDS": "0.01"}
NOTIFY = """  notify:
    webhooks:
    - name: team
      secretRef: {name: slack, key: url}
      events: [Stalled, Failed, Completed, Ready]
"""


@pytest.fixture
def hook(monkeypatch: pytest.MonkeyPatch) -> Iterator[Webhook]:
    with webhook_server() as server:
        monkeypatch.setenv("EVALCTL_SECRET_SLACK_URL", server.url)
        yield server


def outbox(cluster: Cluster) -> list[tuple[str, str, str | None]]:
    """(event, state, claimed_by) of every queued message."""
    with sqlite3.connect(cluster.root / "store.db") as conn:
        return conn.execute("SELECT event, state, claimed_by FROM evalrun_notifications ORDER BY id").fetchall()


def test_one_message_per_transition_across_kill_9_and_restarts(cluster: Cluster, hook: Webhook) -> None:
    cluster.write(models=MODELS, datasets=["DCAgent/tiny_a"], env=FAST, extra_run=NOTIFY)
    outputs = []

    # killed right after a pass queued its first messages, before any sender had them
    died = cluster.evalctl("reconcile", "--loop", "--interval", "0.3", kill_at="notify-recorded")
    assert died.returncode == -signal.SIGKILL, died.stderr
    assert any(state == "pending" for _, state, _ in outbox(cluster))
    outputs.append(died)

    # killed right after its sender claimed a message, before it was posted: the claim of a dead process is left
    died = cluster.evalctl("reconcile", "--loop", "--interval", "0.3", kill_at="notify-claimed")
    assert died.returncode == -signal.SIGKILL, died.stderr
    assert any(claimer for _, state, claimer in outbox(cluster) if state == "pending")
    outputs.append(died)

    # kill -9 from outside in the middle of a run, once a message is recorded delivered
    command = [sys.executable, "-m", "controller.entry.cli", "reconcile", "--loop", "--interval", "0.3", "-v",
               "-f", str(cluster.spec), "--store", cluster.store]
    loop = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL, env={**os.environ, "COLUMNS": "200"})
    try:
        wait_until(lambda: any(state == "delivered" for _, state, _ in outbox(cluster)), "a delivered message",
                   timeout_s=120)
    finally:
        loop.kill()
        stdout, stderr = loop.communicate(timeout=60)
    outputs.append(subprocess.CompletedProcess(command, loop.returncode, stdout, stderr))

    done = cluster.evalctl("reconcile", "--loop", "--interval", "0.3", "--until-done", "-v")
    assert "converged after" in done.stdout
    outputs.append(done)

    # one message per transition, by its id: the outside kill -9 may land between the endpoint taking a POST and
    # the commit that records it, and that one message is posted again with the same id (docs/DECISIONS.md,
    # "Exactly once, and the remaining window"), which a receiver drops
    by_id = {m.id: (m.event, _subject(m.body["text"])) for m in hook.messages()}
    assert Counter(by_id.values()) == Counter({("Completed", "org/a-8B × DCAgent/tiny_a"): 1,
                                               ("Completed", "org/b-8B × DCAgent/tiny_a"): 1,
                                               ("Ready", "EvalRun e2e"): 1}), [m.body["text"] for m in hook.messages()]
    assert len(hook.attempts()) - len(by_id) <= 1, "at most the one message in flight at the kill is posted again"
    assert {state for _, state, _ in outbox(cluster)} == {"delivered"}

    status = cluster.evalctl("status", "-o", "json")
    stored = b"".join(p.read_bytes() for p in cluster.root.glob("store.db*"))
    for result in [*outputs, status]:
        assert SECRET_PATH not in result.stdout + result.stderr
    assert "webhook message delivered" in done.stderr + outputs[2].stderr, "-v logs say what went out"
    assert SECRET_PATH.encode() not in stored


def _subject(text: str) -> str:
    """Who the message is about: 'org/a-8B × tb' of 'org/a-8B × tb (EvalRun e2e) Completed: …', 'EvalRun e2e'."""
    return text.partition(" (EvalRun ")[0] if " (EvalRun " in text else text.partition(" is ")[0]
