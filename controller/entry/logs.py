"""Structured, quiet-by-default logs: `time level logger message key=value …` on stderr."""

from __future__ import annotations

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


def configure_logging(verbosity: int) -> None:
    level = logging.WARNING if verbosity <= 0 else logging.INFO if verbosity == 1 else logging.DEBUG
    handler = logging.StreamHandler()
    handler.setFormatter(KeyValueFormatter())
    root = logging.getLogger("evalctl")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False


def _quote(value: object) -> str:
    text = str(value)
    return f'"{text}"' if " " in text or not text else text
