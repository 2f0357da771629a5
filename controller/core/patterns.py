"""Failure-catalog patterns, matched in time linear in the text (RE2), whoever wrote them. Pure.

A cluster's `failureCatalog` is a tenant's regex run by the operator on its job's output: with Python's
backtracking engine, `(x+x+)+y` on one 64 KiB line holds the GIL for hours, and every namespace, kopf's event loop
and the liveness endpoint with it. RE2 (google-re2) has no backtracking, so no pattern it accepts can do that; the
price is its syntax: no backreferences, no lookaround, `\\z` for Python's `\\Z`. Every pattern, the shipped catalog's
too, is compiled and matched by RE2: one engine, one meaning. Lines are `^`/`$` anchors (`(?m)`), as they were.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import re2

UNSUPPORTED = {  # what RE2 says, and how a pattern says it without
    "invalid perl operator: (?<": "lookbehind: match the text before as part of the pattern",
    "invalid perl operator: (?=": "lookahead: match the text after as part of the pattern",
    "invalid perl operator: (?!": "negative lookahead: use a character class, e.g. [^x], or two catalog entries",
    "invalid escape sequence: \\Z": "\\Z: write \\z (RE2's end of text)",
    "invalid escape sequence: \\": "backreferences (\\1): repeat the text itself, e.g. (?:foo|bar) twice",
}
RE2_SYNTAX = "https://github.com/google/re2/wiki/Syntax"


def _options() -> Any:
    options = re2.Options()
    options.log_errors = False  # a refused pattern is a spec error, not a line on stderr
    return options


@dataclass(frozen=True)
class Found:
    """Where a pattern matched, and the line that holds it."""

    start: int
    line: str


def refusal(pattern: str) -> str | None:
    """Why RE2 refuses `pattern`, with how to write it instead; None when it compiles."""
    try:
        _compiled(pattern)
    except re2.error as exc:
        said = exc.args[0].decode("utf-8", "replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        fix = next((how for prefix, how in UNSUPPORTED.items() if said.startswith(prefix)), None)
        if fix is None:
            return said
        return f"{said} (the operator matches with RE2, which runs in linear time and has no {fix}; see {RE2_SYNTAX})"
    return None


def search(pattern: str, text: bytes) -> Found | None:
    """The first match of `pattern` in `text` (UTF-8), with its line decoded; raises ValueError if RE2 refuses it."""
    try:
        found = _compiled(pattern).search(text)
    except re2.error as exc:
        raise ValueError(f"{pattern!r}: {refusal(pattern)}") from exc
    if found is None:
        return None
    start = int(found.start())
    begin = text.rfind(b"\n", 0, start) + 1
    end = text.find(b"\n", start)
    return Found(start=start, line=text[begin : end if end >= 0 else len(text)].decode("utf-8", "replace").strip())


@functools.lru_cache(maxsize=1024)
def _compiled(pattern: str) -> Any:
    return re2.compile(f"(?m){pattern}", _options())
