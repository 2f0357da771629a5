"""What a tracking server answers is never quoted in a message (issue 27): the URI may be a tenant's, pointing at
a metadata service or an internal API, and the message lands in `.status.attention`. Only its status and the
exception's class are said. A real loopback HTTP server answers every call with an error and a distinctive body."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from controller.adapters.tracker.mlflow import MlflowTracker
from controller.core.ports import ObservationError, StoreUnavailable, TrackerRecord

SECRET = "internal-metadata-4f1c"
ANSWERS = {  # status, content type, body
    "json-403": (403, "application/json", json.dumps({"error_code": "PERMISSION_DENIED", "message": SECRET})),
    "json-unknown-code": (400, "application/json", json.dumps({"error_code": SECRET, "message": "x"})),
    "text-404": (404, "text/plain", f"role: admin {SECRET}"),
    "text-500": (500, "text/plain", f"role: admin {SECRET}"),
}


def serving(status: int, content_type: str, body: str) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = _answer

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture(params=sorted(ANSWERS))
def uri(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, int]]:
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    status, content_type, body = ANSWERS[request.param]
    server = serving(status, content_type, body)
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", status
    finally:
        server.shutdown()
        server.server_close()


def test_an_error_answer_is_said_by_status_and_class_never_by_its_body(
        uri: tuple[str, int], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)  # the adapter's own log says no more than the message (the body: DEBUG only)
    where, status = uri
    tracker = MlflowTracker(where)
    record = TrackerRecord(run_tag="ev_m__b__0a1b2c3d__a1", owner="alice", tags={}, params={}, metrics={"mean_score": 0.5},
                           report="")

    with pytest.raises(StoreUnavailable) as logging_failed:
        tracker.log("exp", record)
    with pytest.raises(ObservationError) as reading_failed:
        tracker.read_back("exp", record.run_tag, record.owner)

    for message in (str(logging_failed.value), str(reading_failed.value)):
        assert message.startswith(f"MLflow at {where}: "), message
        assert SECRET not in message and "admin" not in message, message
        assert str(status) in message or "RestException" in message, message
    assert all(SECRET not in r.getMessage() for r in caplog.records if r.name.startswith("evalctl"))
