"""`MlflowTracker` against a real `mlflow server` (sqlite backend), and a proxy that drops or fails writes.

Each test logs to its own experiment, so they share the session's server without seeing each other's runs.
What matters most: re-analysis never makes a second run, an unreachable server is a one-line error without
credentials, and a write the server never got shows up in `read_back` (the core's verification step).
"""

from __future__ import annotations

import base64
import logging
import os
import threading
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from mlflow import MlflowClient

from controller.adapters.tracker.mlflow import RUN_TAG, MlflowTracker, tag_filter
from controller.core.ports import ObservationError, StoreUnavailable, TrackerRecord

if TYPE_CHECKING:  # the root conftest loads it as a plugin (so pytest rewrites its asserts)
    from tests.fixtures.mlflow_server import MlflowProxy, MlflowServer

pytestmark = pytest.mark.mlflow

PASSWORD = "hunter2-not-for-logs"
OWNER = "alice"


def record(run_tag: str = "ev_qwen3_8b__swebench__0a1b2c3d__a1", **changes: object) -> TrackerRecord:
    base = TrackerRecord(
        run_tag=run_tag,
        owner=OWNER,
        tags={"cell_key": "qwen3-8b|swebench|0a1b2c3d", "model": "qwen3-8b", "benchmark": "swebench",
              "cluster": "lab", "evalrun": "nightly"},
        params={"max_retries": "5", "browser_backend": "playwright"},
        metrics={"mean_score": 0.42, "error.timeout": 3.0, "error.none": 0.0, "steps.mean": 17.5},
        report="mean score 0.42 over 300 trials\ntimeout: 3\n",
    )
    return base.model_copy(update=changes)


@pytest.fixture
def experiment() -> str:
    return f"evalrun-test-{uuid.uuid4().hex[:8]}"


def runs_tagged(server_url: str, experiment: str, run_tag: str) -> list[str]:
    """Run ids with this run tag, straight from the server (independent of the adapter's own lookup)."""
    client = MlflowClient(tracking_uri=server_url)
    found = client.get_experiment_by_name(experiment)
    assert found is not None
    return [run.info.run_id for run in client.search_runs([found.experiment_id], tag_filter(RUN_TAG, run_tag))]


def test_log_then_read_back_returns_what_was_logged(mlflow_server: MlflowServer, experiment: str, tmp_path: Path) -> None:
    tracker = MlflowTracker(mlflow_server.url)
    logged = record()

    run_id = tracker.log(experiment, logged)
    tracked = tracker.read_back(experiment, logged.run_tag, OWNER)

    assert tracked is not None
    assert tracked.run_id == run_id
    assert tracked.metrics == logged.metrics
    assert tracked.params == logged.params
    assert tracked.tags == logged.tags
    assert tracked.artifacts == ("post_eval_report.txt",)
    client = MlflowClient(tracking_uri=mlflow_server.url)
    run = client.get_run(run_id)
    assert (run.info.status, run.info.run_name) == ("FINISHED", logged.run_tag)
    assert run.data.tags[RUN_TAG] == logged.run_tag and run.data.tags["evalrun.cell_key"] == logged.tags["cell_key"]
    report = Path(client.download_artifacts(run_id, "post_eval_report.txt", str(tmp_path)))
    assert report.read_text() == logged.report


def test_read_back_of_an_unknown_run_or_experiment_is_none(mlflow_server: MlflowServer, experiment: str) -> None:
    tracker = MlflowTracker(mlflow_server.url)
    assert tracker.read_back(experiment, "ev_never_logged__a1", OWNER) is None  # no such experiment
    tracker.log(experiment, record())
    assert tracker.read_back(experiment, "ev_never_logged__a1", OWNER) is None


def test_a_deleted_experiment_is_refused_not_recreated(mlflow_server: MlflowServer, experiment: str) -> None:
    tracker = MlflowTracker(mlflow_server.url)
    tracker.log(experiment, record())
    client = MlflowClient(tracking_uri=mlflow_server.url)
    found = client.get_experiment_by_name(experiment)
    assert found is not None
    client.delete_experiment(found.experiment_id)

    with pytest.raises(StoreUnavailable, match="is deleted on the server; restore it"):
        tracker.log(experiment, record())
    assert tracker.read_back(experiment, record().run_tag, OWNER) is None


def test_reanalysis_logs_to_the_same_run(mlflow_server: MlflowServer, experiment: str) -> None:
    """RULES §5: re-analysis attaches to the original run; a changed param is immutable in MLflow."""
    tracker = MlflowTracker(mlflow_server.url)
    first = record()
    again = record(metrics={**first.metrics, "mean_score": 0.55, "error.timeout": 1.0},
                   params={"max_retries": "10", "browser_backend": "playwright", "retry_pass": "blocked"},
                   report="mean score 0.55 after the retry pass\n")

    run_id = tracker.log(experiment, first)
    assert tracker.log(experiment, again) == run_id
    assert tracker.log(experiment, again) == run_id  # the same analysis twice: still a no-op on params

    assert runs_tagged(mlflow_server.url, experiment, first.run_tag) == [run_id]
    tracked = tracker.read_back(experiment, first.run_tag, OWNER)
    assert tracked is not None
    assert tracked.metrics == again.metrics
    assert tracked.params == again.params  # the latest analysis' values …
    stored = MlflowClient(tracking_uri=mlflow_server.url).get_run(run_id).data
    assert stored.params["max_retries"] == "5"  # … while the param itself keeps its first value
    assert stored.tags["evalrun.param.max_retries"] == "10"

    tracker.log(experiment, first)  # back to the first settings: the override follows
    tracked = tracker.read_back(experiment, first.run_tag, OWNER)
    assert tracked is not None and tracked.params["max_retries"] == "5"


def test_two_run_tags_are_two_runs(mlflow_server: MlflowServer, experiment: str) -> None:
    tracker = MlflowTracker(mlflow_server.url)
    attempt1, attempt2 = record("ev_m__b__0a1b2c3d__a1"), record("ev_m__b__0a1b2c3d__a2", metrics={"mean_score": 0.9})

    ids = {tracker.log(experiment, attempt1), tracker.log(experiment, attempt2)}

    assert len(ids) == 2
    tracked1, tracked2 = (tracker.read_back(experiment, attempt.run_tag, OWNER) for attempt in (attempt1, attempt2))
    assert tracked1 is not None and tracked1.metrics == attempt1.metrics
    assert tracked2 is not None and tracked2.metrics == {"mean_score": 0.9}


def test_two_users_runs_of_one_cell_stay_apart_and_an_ownerless_run_is_claimed_once(
        mlflow_server: MlflowServer, experiment: str) -> None:
    """The run tag names no user: two researchers with their own results DBs who run the same cell into one
    experiment each log to, and read back, their own run. A run written before runs carried an owner is the first
    logger's, then no one else's."""
    client = MlflowClient(tracking_uri=mlflow_server.url)
    experiment_id = client.create_experiment(experiment)
    alices = record(metrics={"mean_score": 0.42})
    legacy = client.create_run(experiment_id, tags={RUN_TAG: alices.run_tag}).info.run_id
    tracker = MlflowTracker(mlflow_server.url)

    assert tracker.log(experiment, alices) == legacy
    bobs = record(owner="bob", metrics={"mean_score": 0.9})
    assert tracker.log(experiment, bobs) != legacy

    mine, theirs = tracker.read_back(experiment, alices.run_tag, OWNER), tracker.read_back(experiment, bobs.run_tag, "bob")
    assert mine is not None and mine.run_id == legacy and mine.metrics == {"mean_score": 0.42}
    assert theirs is not None and theirs.metrics == {"mean_score": 0.9}
    assert tracker.read_back(experiment, alices.run_tag, "carol") is None
    assert len(runs_tagged(mlflow_server.url, experiment, alices.run_tag)) == 2


def test_duplicates_from_an_earlier_race_resolve_to_the_oldest(mlflow_server: MlflowServer, experiment: str,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    client = MlflowClient(tracking_uri=mlflow_server.url)
    experiment_id = client.create_experiment(experiment)
    logged = record()
    oldest = client.create_run(experiment_id, start_time=1_000, tags={RUN_TAG: logged.run_tag}).info.run_id
    client.create_run(experiment_id, start_time=2_000, tags={RUN_TAG: logged.run_tag})

    with caplog.at_level(logging.WARNING, logger="evalctl.tracker"):
        assert MlflowTracker(mlflow_server.url).log(experiment, logged) == oldest

    assert "2 MLflow runs carry run tag" in caplog.text and oldest in caplog.text
    assert len(runs_tagged(mlflow_server.url, experiment, logged.run_tag)) == 2  # nothing deleted


def test_run_tags_with_quotes_are_found_exactly(mlflow_server: MlflowServer, experiment: str) -> None:
    """MLflow's filter grammar has no escapes; a tag holding both quotes is searched with LIKE, then re-checked."""
    tracker = MlflowTracker(mlflow_server.url)
    quoted, lookalike = record("it's \"quoted\""), record("it_s _quoted_", metrics={"mean_score": 0.1})

    ids = {tracker.log(experiment, quoted), tracker.log(experiment, lookalike), tracker.log(experiment, quoted)}

    assert len(ids) == 2
    tracked = tracker.read_back(experiment, quoted.run_tag, OWNER)
    assert tracked is not None and tracked.metrics == quoted.metrics


def test_stopped_server_is_unavailable_then_recovers(mlflow_server: MlflowServer, experiment: str) -> None:
    tracker = MlflowTracker(mlflow_server.url)
    logged = record()
    tracker.log(experiment, logged)

    mlflow_server.stop()
    try:
        with pytest.raises(StoreUnavailable) as logging_failed:
            tracker.log(experiment, logged)
        with pytest.raises(ObservationError) as reading_failed:
            tracker.read_back(experiment, logged.run_tag, OWNER)
    finally:
        mlflow_server.start()

    for error in (logging_failed.value, reading_failed.value):
        message = str(error)
        assert "\n" not in message and mlflow_server.url in message and "connection refused" in message
    restarted = record(metrics={"mean_score": 0.6})
    run_id = tracker.log(experiment, restarted)
    tracked = tracker.read_back(experiment, logged.run_tag, OWNER)
    assert tracked is not None and tracked.run_id == run_id and tracked.metrics["mean_score"] == 0.6


def test_swallowed_writes_return_but_read_back_tells(mlflow_server: MlflowServer, mlflow_proxy: MlflowProxy,
                                                    experiment: str) -> None:
    """A proxy answers 200 and drops the push: `log` cannot tell (RULES §5), `read_back` can."""
    through_proxy, direct = MlflowTracker(mlflow_proxy.url), MlflowTracker(mlflow_server.url)
    logged = record()
    run_id = through_proxy.log(experiment, logged)

    mlflow_proxy.mode = "swallow_writes"
    reanalysis = record(metrics={"mean_score": 0.77, "error.browser_crash": 4.0}, params={"max_retries": "10"})
    assert through_proxy.log(experiment, reanalysis) == run_id  # no error

    assert mlflow_proxy.swallowed
    tracked = direct.read_back(experiment, logged.run_tag, OWNER)
    assert tracked is not None
    assert tracked.metrics == logged.metrics
    assert "error.browser_crash" not in tracked.metrics and tracked.params["max_retries"] == "5"


def test_swallowed_create_is_noticed(mlflow_server: MlflowServer, mlflow_proxy: MlflowProxy, experiment: str) -> None:
    """A run the server never created has no id: that much `log` can see for itself."""
    through_proxy = MlflowTracker(mlflow_proxy.url)
    through_proxy.log(experiment, record())  # the experiment exists; only the new run is swallowed
    mlflow_proxy.mode = "swallow_writes"
    fresh = record("ev_m__b__0a1b2c3d__a2")

    with pytest.raises(StoreUnavailable, match="without a run id"):
        through_proxy.log(experiment, fresh)

    assert MlflowTracker(mlflow_server.url).read_back(experiment, fresh.run_tag, OWNER) is None


def test_writes_answered_500_are_unavailable(mlflow_proxy: MlflowProxy, experiment: str) -> None:
    tracker = MlflowTracker(mlflow_proxy.url)
    logged = record()
    tracker.log(experiment, logged)
    mlflow_proxy.mode = "fail_writes_500"

    with pytest.raises(StoreUnavailable, match="answered HTTP 500") as failed:
        tracker.log(experiment, record(metrics={"mean_score": 0.99}))

    assert "\n" not in str(failed.value)
    tracked = tracker.read_back(experiment, logged.run_tag, OWNER)  # reads still pass through
    assert tracked is not None and tracked.metrics["mean_score"] == logged.metrics["mean_score"]


def test_credentials_never_reach_a_message(mlflow_server: MlflowServer, mlflow_proxy: MlflowProxy, experiment: str,
                                           monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.fixtures.mlflow_server import free_port

    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", "tok-" + PASSWORD)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # failing fast is all this test needs
    with_password = mlflow_proxy.url.replace("http://", f"http://alice:{PASSWORD}@")
    MlflowTracker(with_password).log(experiment, record())  # the server ignores credentials; mlflow still sends them
    mlflow_proxy.mode = "fail_writes_500"
    nobody_listening = f"http://alice:{PASSWORD}@127.0.0.1:{free_port()}"

    messages = []
    for uri in (with_password, nobody_listening):
        with pytest.raises(StoreUnavailable) as failed:
            MlflowTracker(uri).log(experiment, record(metrics={"mean_score": 0.1}))
        messages.append(str(failed.value))
    with pytest.raises(ObservationError) as unreadable:
        MlflowTracker(nobody_listening).read_back(experiment, record().run_tag, OWNER)
    messages.append(str(unreadable.value))
    with pytest.raises(StoreUnavailable) as bad_scheme:
        MlflowTracker(f"nosuchscheme://alice:{PASSWORD}@example.invalid")
    messages.append(str(bad_scheme.value))

    printed = capsys.readouterr()
    for text in [*messages, printed.out, printed.err]:
        assert PASSWORD not in text and "alice" not in text
    assert "127.0.0.1" in messages[1]


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_own_credentials_sign_every_call_and_leave_the_environment_as_it_was(
        mlflow_server: MlflowServer, mlflow_proxy: MlflowProxy, experiment: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "env-user")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "env-password-xyz")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.delenv("MLFLOW_TRACKING_TOKEN", raising=False)
    mlflow_proxy.require_auth = _basic("alice", PASSWORD)
    own = MlflowTracker(mlflow_proxy.url, credentials={"MLFLOW_TRACKING_USERNAME": "alice",
                                                       "MLFLOW_TRACKING_PASSWORD": PASSWORD})

    own.log(experiment, record())
    tracked = own.read_back(experiment, record().run_tag, OWNER)

    assert tracked is not None and "post_eval_report.txt" in tracked.artifacts, "artifact calls are signed too"
    assert any("/artifacts/" in call for call in mlflow_proxy.authorized)
    assert (os.environ["MLFLOW_TRACKING_USERNAME"], os.environ["MLFLOW_TRACKING_PASSWORD"]) == (
        "env-user", "env-password-xyz"), "the environment is restored after each call"
    assert "MLFLOW_TRACKING_TOKEN" not in os.environ
    with pytest.raises(StoreUnavailable) as with_env:  # a tracker without its own uses the environment's: refused
        MlflowTracker(mlflow_proxy.url).log(experiment, record())
    wrong = MlflowTracker(mlflow_proxy.url, credentials={"MLFLOW_TRACKING_TOKEN": "tok-wrong-" + PASSWORD})
    with pytest.raises(ObservationError) as with_wrong:
        wrong.read_back(experiment, record().run_tag, OWNER)
    for message in (str(with_env.value), str(with_wrong.value)):
        assert "401" in message or "credentials" in message.lower() or "unauthorized" in message.lower(), message
        assert PASSWORD not in message and "env-password-xyz" not in message


def test_credentials_are_only_mlflow_tracking_names() -> None:
    with pytest.raises(ValueError, match="unknown names"):
        MlflowTracker("http://127.0.0.1:9", credentials={"AWS_SECRET_ACCESS_KEY": "x"})


def test_two_tenants_trackers_call_at_once_each_with_its_own_login(
        mlflow_server: MlflowServer, experiment: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A lane per server and namespace: tenant A's server holds A's call while tenant B logs in full, and each
    request carries its own tracker's login (they are read per calling thread, never from a shared environment)."""
    from tests.fixtures.mlflow_server import MlflowProxy

    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "operator")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "operator-password-xyz")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    slow, fast = MlflowProxy(mlflow_server.url), MlflowProxy(mlflow_server.url)
    slow.require_auth, fast.require_auth = _basic("alice", PASSWORD), _basic("bob", "bob-" + PASSWORD)
    slow.held = threading.Event()
    a = MlflowTracker(slow.url, credentials={"MLFLOW_TRACKING_USERNAME": "alice", "MLFLOW_TRACKING_PASSWORD": PASSWORD},
                      lane=f"team-a {slow.url}", deadline_s=20)
    b = MlflowTracker(fast.url, credentials={"MLFLOW_TRACKING_USERNAME": "bob",
                                             "MLFLOW_TRACKING_PASSWORD": "bob-" + PASSWORD},
                      lane=f"team-b {fast.url}", deadline_s=20)
    results: list[object] = []
    try:
        in_flight = threading.Thread(target=lambda: results.append(a.read_back(experiment, record().run_tag, OWNER)))
        in_flight.start()
        assert slow.arrived.wait(10), "tenant A's call is at its server"
        b.log(experiment, record())
        assert b.read_back(experiment, record().run_tag, OWNER) is not None, "B logged while A's call was held"
        slow.held.set()
        in_flight.join(20)
    finally:
        slow.held.set()
        slow.close()
        fast.close()

    assert len(results) == 1 and results[0] is not None, "A's call, signed with A's login, read the run once released"
    assert slow.authorized and fast.authorized, "every request passed its own server's login check"
    assert os.environ["MLFLOW_TRACKING_USERNAME"] == "operator", "the environment is never written"


def test_a_tenants_tracking_server_is_connected_to_only_at_an_address_checked_when_dialled(
        mlflow_server: MlflowServer, mlflow_proxy: MlflowProxy, experiment: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """DNS rebinding: `localhost` passed no check of the pass (it is refused as written, but a public name may
    resolve to 127.0.0.1 just as well once the pass's check is done); the connection resolves it and refuses."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    named = mlflow_proxy.url.replace("127.0.0.1", "localhost")

    with pytest.raises(StoreUnavailable) as refused:
        MlflowTracker(named, public_only=True).log(experiment, record())
    MlflowTracker(named).log(experiment, record())  # the admin's (or the CLI's) server: no check

    assert not mlflow_proxy.authorized and mlflow_proxy.arrived.is_set()
    assert runs_tagged(mlflow_server.url, experiment, record().run_tag), "the unchecked tracker logged"
    assert "not dialled: localhost reaches 127.0.0.1, a loopback address when dialled" in str(refused.value), \
        str(refused.value)
