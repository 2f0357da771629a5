"""Structured, quiet-by-default logs on stderr: `time level logger message key=value …` for the CLI, one JSON
object per line for the operator (the keys of kopf's own JSON lines, so one log pipeline reads both)."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime

_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


class KeyValueFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        fields = {k: v for k, v in vars(record).items() if k not in _STANDARD}
        extra = " ".join(f"{k}={_quote(v)}" for k, v in fields.items())
        stamp = datetime.fromtimestamp(record.created, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        line = f"{stamp} {record.levelname.lower()} {record.name} {record.getMessage()}"
        return f"{line} {extra}" if extra else line


_SEVERITY = {logging.WARNING: "warn", logging.CRITICAL: "fatal"}  # as kopf writes them


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        fields = {k: v for k, v in vars(record).items() if k not in _STANDARD}
        line = {"message": record.getMessage(), "timestamp": datetime.fromtimestamp(record.created, UTC).isoformat(),
                "severity": _SEVERITY.get(record.levelno, record.levelname.lower()), "logger": record.name, **fields}
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


def configure_logging(verbosity: int, *, json_lines: bool = False) -> None:
    level = logging.WARNING if verbosity <= 0 else logging.INFO if verbosity == 1 else logging.DEBUG
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if json_lines else KeyValueFormatter())
    root = logging.getLogger("evalctl")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False


def _quote(value: object) -> str:
    text = str(value)
    return f'"{text}"' if " " in text or not text else text
