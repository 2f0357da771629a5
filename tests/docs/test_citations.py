"""The project cites only itself: no planning notes from outside the repository (docs/RULES.md is the rulebook)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCANNED = ("controller", "docs", "bench", "scripts", "manifests", "crds", "specs", "eval", "tests", "README.md",
           "Makefile", "Dockerfile", ".ci")
SKIPPED_SUFFIXES = {".png", ".pyc", ".gz", ".db"}
# The citation forms of outside notes; SQL's `REFERENCES` and the REFERENCE_ERRORS constant are not citations.
OUTSIDE = re.compile("|".join((
    r"\bREFERENCE(?:\.md\b|\s*§)",
    r"\bDESIGN\.md\b",
    r"\.\./shared\b",
)))


def scanned_files() -> list[Path]:
    files: list[Path] = []
    for name in SCANNED:
        path = REPO / name
        if path.is_file():
            files.append(path)
        elif path.is_dir():
            files += sorted(p for p in path.rglob("*") if p.is_file() and p.suffix not in SKIPPED_SUFFIXES
                            and "__pycache__" not in p.parts)
    return files


def test_no_citation_of_files_outside_the_repository() -> None:
    this = Path(__file__).resolve()
    found = [f"{path.relative_to(REPO)}:{n}: {line.strip()[:100]}"
             for path in scanned_files() if path.resolve() != this
             for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
             if OUTSIDE.search(line)]
    assert not found, "cite docs/RULES.md §N or docs/DECISIONS.md instead of notes outside the repository:\n" + \
        "\n".join(found)


def test_the_pattern_finds_the_citation_forms_and_spares_sql() -> None:
    for cited in ("REFERENCE §4", "see REFERENCE.md", "DESIGN.md, 'Stores'", "../shared/notes"):
        assert OUTSIDE.search(cited), cited
    for fine in ("FOREIGN KEY (a) REFERENCES models(id)", "REFERENCE_ERRORS", "the reference run"):
        assert not OUTSIDE.search(fine), fine
