"""How `reconcile --loop --until-done` ends: every cell settled (0), only cells held for a human left (4: Failed
ones, and launches a hold keeps Pending), or out of `--timeout` (5) — never a loop that waits for ever on cells
only a human can move."""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Sequence

from controller.core.reconcile import PassResult
from controller.core.vocabulary import Phase
from controller.entry.exit_codes import HELD, OK, TIMED_OUT

_DURATION = re.compile(r"(?:\d+[smhd])+")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}
SETTLED = frozenset({Phase.COMPLETED, Phase.FAILED})


def duration_s(text: str) -> float:
    """`90s`, `30m`, `2h`, `1h30m`, `2d`; ValueError, saying what is expected, for anything else (or zero)."""
    compact = text.strip()
    seconds = sum(int(n) * _UNIT_S[unit] for n, unit in re.findall(r"(\d+)([smhd])", compact)) \
        if _DURATION.fullmatch(compact) else 0
    if seconds <= 0:
        raise ValueError(f"--timeout {text!r}: expected a duration above zero such as 90s, 30m, 2h or 1h30m")
    return float(seconds)


class Deadline:
    """`--timeout`: the moment the loop gives up, on this process's monotonic clock."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.at = time.monotonic() + duration_s(text)

    def passed(self) -> bool:
        return time.monotonic() >= self.at

    def cap(self, delay: float) -> float:
        """A wait that does not outlast the deadline."""
        return max(min(delay, self.at - time.monotonic()), 0.0)


def settled_end(results: Sequence[PassResult]) -> tuple[int, str]:
    """Every cell Completed, Failed or held: 0, or HELD with how many wait for a human."""
    held = _held(results)
    return (HELD, f"evalctl: {held_line(results)}") if held else (OK, "")


def _held(results: Sequence[PassResult]) -> int:
    """Failed cells (each holds) and cells held in another phase."""
    return sum(r.status.failed + r.status.held_unsettled for r in results)


def held_line(results: Sequence[PassResult]) -> str:
    """`2 held — see `evalctl retry``, or, where some are held by what a retry does not release (the GPU budget, a
    failed preflight, the spec), where to read what releases each."""
    held = _held(results)
    if not any(r.status.held_unsettled for r in results):
        return f"{held} held — see `evalctl retry`"
    return f"{held} held — `evalctl status` says what releases each"


def timed_out(results: Sequence[PassResult] | None, deadline: Deadline) -> tuple[int, str]:
    """TIMED_OUT, with what is still not settled (by phase; held cells apart), or that no pass completed."""
    if not results:
        return TIMED_OUT, f"evalctl: timed out after {deadline.text}: no pass completed"
    waiting = Counter(c.phase for r in results for c in r.plan.cells if c.phase not in SETTLED and not c.holds)
    breakdown = ", ".join(f"{n} {phase.value}" for phase, n in waiting.most_common())
    also = f"; {held_line(results)}" if _held(results) else ""
    return TIMED_OUT, (f"evalctl: timed out after {deadline.text}: {sum(waiting.values())} cell(s) not settled "
                       f"({breakdown}){also}")
