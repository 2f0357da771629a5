"""Bench: the failure catalog's patterns on adversarial long lines.

Usage: python bench/catalog_patterns.py [--kib 256] [--runs 3] [--old-kib 32]
A running job's output is read up to 256 KiB per pass (OUTPUT_READ_CAP), and one line may be all of it (a progress
bar that never prints a newline). Each shipped pattern is timed on lines of that size built to make it work: every
literal run of every pattern repeated (each repeat a start that fails late), each pattern's runs but its last
joined and repeated (a near miss through its bounded gaps), 'NCCL ' repeated, and filler. Prints the worst time per
pattern and the line it took with Python's `re` and with RE2 (what `diagnose` uses: core/patterns.py), `diagnose`
per stage on its worst line, and for scale the old nccl-timeout pattern (`NCCL.*(?i:timeout|timed out)`) and a
tenant's catastrophic `(x+x+)+y` with both engines, `re` on shorter lines since it is quadratic and exponential.
Asserts nothing about time.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from re import _parser as sre

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from controller.api.catalog import load_catalog  # noqa: E402
from controller.core.health import diagnose  # noqa: E402
from controller.core.patterns import search as re2_search  # noqa: E402
from controller.core.ports import OUTPUT_READ_CAP  # noqa: E402
from controller.core.remedies import FailureStage  # noqa: E402

OLD_NCCL = "NCCL.*(?i:timeout|timed out)"
CATASTROPHIC = "(x+x+)+y"  # a tenant's: exponential in the run of x for a backtracking engine


def literal_runs(tree: sre.SubPattern) -> Iterator[str]:
    """The runs of literal characters in a parsed pattern, groups and alternatives included."""
    run: list[str] = []
    for op, arg in tree:
        if op == sre.LITERAL:
            run.append(chr(arg))
            continue
        if run:
            yield "".join(run)
            run = []
        for child in _subpatterns(arg):
            yield from literal_runs(child)
    if run:
        yield "".join(run)


def _subpatterns(arg: object) -> Iterator[sre.SubPattern]:
    if isinstance(arg, sre.SubPattern):
        yield arg
    elif isinstance(arg, tuple | list):
        for item in arg:
            yield from _subpatterns(item)


def adversarial(patterns: list[str], size: int) -> dict[str, str]:
    """Lines of `size` characters, no newline, by what they repeat."""
    pieces = {"'NCCL '": "NCCL ", "'a'": "a", "' '": " "}
    for pattern in patterns:
        runs = [r for r in literal_runs(sre.parse(pattern)) if r.strip()]
        pieces |= {repr(r[:40]): r + " " for r in runs}
        if len(runs) > 1:
            pieces[f"near miss of {pattern[:40]!r}"] = " ".join(runs[:-1]) + " "
    return {what: (piece * (size // len(piece) + 1))[:size] for what, piece in pieces.items()}


def timed(call: Callable[[], object], runs: int) -> float:
    """The best of `runs` calls, in ms."""
    best = float("inf")
    for _ in range(runs):
        started = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - started)
    return best * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kib", type=int, default=OUTPUT_READ_CAP >> 10, help="the adversarial lines' size")
    parser.add_argument("--runs", type=int, default=3, help="timings per (pattern, line); the best is kept")
    parser.add_argument("--old-kib", type=int, default=32, help="the line size for the old nccl-timeout pattern")
    parser.add_argument("--x-run", type=int, default=24, help="the run of x for the catastrophic pattern with re")
    args = parser.parse_args()
    modes = load_catalog().failures.modes_for([])
    patterns = sorted({p for mode in modes for p in mode.patterns})
    lines = adversarial(patterns, args.kib << 10)
    print(f"{len(patterns)} shipped patterns × {len(lines)} adversarial lines of {args.kib} KiB, best of {args.runs}")
    encoded = {what: text.encode() for what, text in lines.items()}
    print(f"{'re ms':>9} {'RE2 ms':>8}  {'entry':<31} {'pattern':<62} worst line (re)")
    for mode in modes:
        for pattern in mode.patterns:
            compiled = re.compile(pattern, re.MULTILINE)
            worst = max((timed(lambda c=compiled, t=text: c.search(t), args.runs), what) for what, text in lines.items())
            linear = max(timed(lambda p=pattern, t=data: re2_search(p, t), args.runs) for data in encoded.values())
            print(f"{worst[0]:9.2f} {linear:8.2f}  {mode.name + ' (' + mode.when.value + ')':<31} {pattern[:60]:<62} "
                  f"{worst[1]}")
    for stage in FailureStage:
        worst = max((timed(lambda t=text, s=stage: diagnose(t, modes, s), args.runs), what)
                    for what, text in lines.items())
        print(f"diagnose, every {stage.value} entry: worst {worst[0]:.2f} ms ({worst[1]})")
    old_line = ("NCCL " * (args.old_kib << 10))[: args.old_kib << 10]
    old_ms = timed(lambda: re.compile(OLD_NCCL, re.MULTILINE).search(old_line), 1)
    print(f"for scale, the old {OLD_NCCL!r} on {args.old_kib} KiB of 'NCCL ': {old_ms:.0f} ms with re (quadratic in "
          f"the line), {timed(lambda: re2_search(OLD_NCCL, old_line.encode()), 1):.2f} ms with RE2")
    x_ms = timed(lambda: re.compile(CATASTROPHIC).search("x" * args.x_run), 1)
    long_x = ("x" * (args.kib << 10)).encode()
    print(f"a tenant's {CATASTROPHIC!r}: {x_ms:.0f} ms with re on {args.x_run} x (doubling per x), "
          f"{timed(lambda: re2_search(CATASTROPHIC, long_x), 1):.2f} ms with RE2 on {args.kib} KiB of x")


if __name__ == "__main__":
    main()
