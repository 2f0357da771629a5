"""Catalog patterns are matched by RE2: a tenant's catastrophic regex returns, one RE2 refuses is a spec error.

The matches that would backtrack run in a child process with a generous deadline: a backtracking engine would not
return for hours, and a hung test must fail, never hang the suite. No timing is asserted (see `make bench-catalog`).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from controller.api.catalog import load_catalog
from controller.core.health import diagnose
from controller.core.patterns import refusal, search
from controller.core.remedies import FailureMode, FailureStage, RemedyKind

DEADLINE_S = 20  # generous: RE2 takes milliseconds; Python's re would take hours


def finishes(code: str) -> str:
    """Run `code` in a fresh interpreter; its stdout, or fail if it has not returned by the deadline."""
    try:
        done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                              timeout=DEADLINE_S, check=True)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the match did not return within {DEADLINE_S} s: it backtracks")
    return done.stdout.strip()


@pytest.mark.parametrize("pattern", ["(a+)+$", "(x+x+)+y", "(x|x)*y", "NCCL.*(?i:timeout|timed out)"])
def test_a_catastrophic_tenant_pattern_returns_on_a_64_kib_line(pattern: str):
    said = finishes(f"""
        from controller.core.health import diagnose
        from controller.core.remedies import FailureMode, FailureStage, RemedyKind
        mode = FailureMode(name="hostile", patterns=({pattern!r},), when=FailureStage.RUNNING,
                           remedy=RemedyKind.HOLD, advice="-")
        for line in ("x" * (64 << 10) + "!", "a" * (64 << 10) + "!", "NCCL " * (16 << 10)):
            print(diagnose(line, [mode], FailureStage.RUNNING) is not None)
    """)

    assert said.split() == ["False", "False", "False"]


def test_every_shipped_pattern_returns_on_megabyte_lines():
    said = finishes("""
        from controller.core.health import diagnose
        from controller.core.remedies import FailureStage
        from controller.api.catalog import load_catalog
        modes = load_catalog().failures.modes_for([])
        size = 4 << 20
        for piece in ("NCCL ", "x", "Timeout at NCCL work: ", "429 ", "[Errno 98] ", "Daytona"):
            line = (piece * (size // len(piece) + 1))[:size]
            for stage in FailureStage:
                assert diagnose(line, modes, stage) is None, (piece, stage)
        print("done")
    """)

    assert said == "done"


def test_every_shipped_pattern_is_one_re2_accepts():
    modes = load_catalog().failures.modes_for([])

    assert {pattern: refusal(pattern) for mode in modes for pattern in mode.patterns} == {
        pattern: None for mode in modes for pattern in mode.patterns}


@pytest.mark.parametrize(("pattern", "says"), [
    (r"(foo) \1", "no backreferences"),
    (r"foo(?=bar)", "no lookahead"),
    (r"foo(?!bar)", "no negative lookahead"),
    (r"(?<!x)foo", "no lookbehind"),
    (r"foo\Z", r"write \z"),
    ("(unbalanced", "missing )"),
])
def test_a_pattern_re2_refuses_says_why_and_how_to_write_it(pattern: str, says: str):
    why = refusal(pattern)

    assert why is not None and says in why, why


def test_a_match_names_its_line_and_lines_are_anchors():
    text = "first\nsecond: CUDA error: out of memory\nthird é\n".encode()

    found = search("^second: CUDA error", text)

    assert found is not None and found.line == "second: CUDA error: out of memory"
    assert search("memory$", text) is not None and search("^memory", text) is None


def test_diagnose_keeps_the_catalog_order_and_the_line_with_non_ascii_before_it():
    first = FailureMode(name="a", patterns=("b+oom",), when=FailureStage.START, remedy=RemedyKind.HOLD, advice="-")
    second = FailureMode(name="b", patterns=("oom",), when=FailureStage.START, remedy=RemedyKind.HOLD, advice="-")

    found = diagnose("été\n  ça bboom  \n", [first, second], FailureStage.START)

    assert found is not None and (found.mode.name, found.line) == ("a", "ça bboom")
