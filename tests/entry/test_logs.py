"""The operator's own loggers write JSON lines like kopf's (docs/KUBERNETES.md promises JSON logs; they were plain text)."""

from __future__ import annotations

import io
import json
import logging

from controller.entry.logs import configure_logging


def _emitted(json_lines: bool) -> str:
    configure_logging(1, json_lines=json_lines)
    stream = io.StringIO()
    handler = logging.getLogger("evalctl").handlers[0]
    assert isinstance(handler, logging.StreamHandler)
    handler.setStream(stream)
    log = logging.getLogger("evalctl.ssh")
    log.warning("host %s refused", "login-1", extra={"cluster": "team-a/hpc"})
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("pass failed")
    return stream.getvalue()


def test_operator_logs_are_one_json_object_per_line_with_kopfs_keys() -> None:
    first, second = [json.loads(line) for line in _emitted(json_lines=True).splitlines()]
    assert first["message"] == "host login-1 refused" and first["severity"] == "warn"
    assert first["logger"] == "evalctl.ssh" and first["cluster"] == "team-a/hpc" and "timestamp" in first
    assert second["severity"] == "error" and "ValueError: boom" in second["exception"]


def test_cli_logs_stay_key_value_lines() -> None:
    line = _emitted(json_lines=False).splitlines()[0]
    assert line.endswith("warning evalctl.ssh host login-1 refused cluster=team-a/hpc"), line
