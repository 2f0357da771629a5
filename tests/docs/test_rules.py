"""Every rule `explain` cites has its section in docs/RULES.md, and every `RULES §N` in the project exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from controller.core.vocabulary import Rule

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "docs" / "RULES.md"
CITED_IN = ("controller", "docs", "tests", "bench", "eval", "scripts", "specs", "manifests", "README.md")
TEXT_FILES = {".py", ".md", ".yaml", ".yml", ".sh", ".sbatch", ".lua", ".txt"}
# `RULES §2`, `RULES.md §14`, and the sections listed after it: `RULES §2, §5`, `(RULES §8 and §5)`
CITATION = re.compile(r"RULES(?:\.md)?\s*§\s*\d+(?:(?:\s*(?:,|and|or|/)\s*|\s+)§\s*\d+)*")


def sections() -> dict[str, str]:
    """Section number → its text, from the `## §N Title` headings."""
    parts = re.split(r"^## §(\d+)\b", RULES.read_text(encoding="utf-8"), flags=re.MULTILINE)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts), 2)}


def cited_section(rule: Rule) -> str:
    match = re.match(r"RULES §(\d+):", rule.citation)
    assert match, f"{rule.name}: its citation must start 'RULES §N: ' (explain prints it): {rule.citation!r}"
    return match.group(1)


@pytest.mark.parametrize("rule", list(Rule), ids=lambda r: r.value)
def test_every_rule_explain_cites_is_defined_in_its_section(rule: Rule) -> None:
    """`explain` prints `rule.citation`; `plan -o json` its id: the cited section must exist and name the id."""
    found = sections()
    number = cited_section(rule)
    assert number in found, f"{rule.value} cites RULES §{number}, which docs/RULES.md does not have"
    assert re.search(rf"`{re.escape(rule.value)}`", found[number]), (
        f"{rule.value} cites RULES §{number}, but that section of docs/RULES.md does not define `{rule.value}`")


def project_files() -> list[Path]:
    files: list[Path] = []
    for name in CITED_IN:
        path = REPO / name
        files += [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.suffix in TEXT_FILES)
    return files


def test_every_rules_citation_names_a_section_that_exists() -> None:
    found = sections()
    dangling = []
    for path in project_files():
        for line_no, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            for citation in CITATION.findall(line):
                dangling += [f"{path.relative_to(REPO)}:{line_no}: §{n}"
                             for n in re.findall(r"§\s*(\d+)", citation) if n not in found]
    assert not dangling, f"citations of sections docs/RULES.md does not have: {dangling}"


def test_the_citation_pattern_reads_lists() -> None:
    """The scan above is only as good as its pattern: a list after RULES counts, a bare § elsewhere does not."""
    assert CITATION.findall("see RULES §8 and §5; RULES.md §14, §2") == ["RULES §8 and §5", "RULES.md §14, §2"]
    assert CITATION.findall("§3 of something else") == []
