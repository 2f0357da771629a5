"""`evalctl docs`: write the field reference, or (`--check`) say whether the committed one is stale."""

from __future__ import annotations

import sys
from pathlib import Path

REFERENCE_OUT = Path("docs/reference.md")


def write_or_check(out: Path, *, check: bool) -> int:
    """0: written, or up to date; 1: stale (with --check), saying how to fix it."""
    from controller.api.reference import render_reference

    text = render_reference()
    if check:
        current = out.read_text(encoding="utf-8") if out.is_file() else None
        if current == text:
            return 0
        what = "missing" if current is None else "stale"
        print(f"{out}: {what}: the field reference no longer matches the spec models; run `evalctl docs`",
              file=sys.stderr)
        return 1
    if str(out) == "-":
        sys.stdout.write(text)
        return 0
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(out)
    print(f"wrote {out}")
    return 0
