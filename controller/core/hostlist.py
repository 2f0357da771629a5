"""SLURM hostlist expressions (`gpu[01-03,07],cpu1`) as node names, the way `scontrol show hostnames` prints them.

A quarantine names one node: the expression a multi-node job's NodeList holds is not a node, and excluding it
literally would take a whole rack out for a day. Pure, so the planner can expand what the scheduler reported.
"""

from __future__ import annotations

import re

MAX_NODES = 4096  # an expression naming more is not a job's NodeList: refuse rather than build a huge list
_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


class HostlistError(ValueError):
    """Not a hostlist expression this parser understands (unbalanced brackets, a range backwards, too many)."""


def expand(expression: str) -> tuple[str, ...]:
    """Every node an expression names, in its order, without repeats; `()` for an empty one."""
    names: list[str] = []
    for part in _top_level_parts(expression.strip()):
        names.extend(_expand_part(part))
        if len(names) > MAX_NODES:
            raise HostlistError(f"{expression[:80]!r} names more than {MAX_NODES} nodes")
    return tuple(dict.fromkeys(names))


def _top_level_parts(expression: str) -> list[str]:
    """Split at the commas outside brackets."""
    parts, depth, start = [], 0, 0
    for index, char in enumerate(expression):
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise HostlistError(f"unbalanced ']' in {expression[:80]!r}")
        elif char == "," and depth == 0:
            parts.append(expression[start:index])
            start = index + 1
    if depth != 0:
        raise HostlistError(f"unbalanced '[' in {expression[:80]!r}")
    parts.append(expression[start:])
    return [part.strip() for part in parts if part.strip()]


def _expand_part(part: str) -> list[str]:
    """One name, possibly with bracketed ranges (several brackets multiply: `r[1-2]n[1-2]` is 4 names)."""
    open_at = part.find("[")
    if open_at < 0:
        return [part]
    close_at = part.find("]", open_at)
    prefix, ranges, rest = part[:open_at], part[open_at + 1 : close_at], part[close_at + 1 :]
    tails = _expand_part(rest) if rest else [""]
    return [f"{prefix}{number}{tail}" for number in _numbers(ranges, part) for tail in tails]


def _numbers(ranges: str, part: str) -> list[str]:
    """`01-03,07` → 01 02 03 07, keeping each range's zero padding."""
    found: list[str] = []
    for item in ranges.split(","):
        matched = _RANGE.match(item.strip())
        if matched is None:
            raise HostlistError(f"{item!r} in {part[:80]!r} is not a number or a range")
        low, high = matched.group(1), matched.group(2) or matched.group(1)
        if int(high) < int(low):
            raise HostlistError(f"range {item!r} in {part[:80]!r} runs backwards")
        if int(high) - int(low) > MAX_NODES:
            raise HostlistError(f"range {item!r} in {part[:80]!r} names more than {MAX_NODES} nodes")
        width = len(low) if low.startswith("0") else 0
        found.extend(str(n).zfill(width) for n in range(int(low), int(high) + 1))
    return found
