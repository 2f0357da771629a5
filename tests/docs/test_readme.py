"""The README gets a newcomer from a clone to a report on its first screen, lists every command, and every link
of the project's docs leads somewhere."""

from __future__ import annotations

import re
from pathlib import Path

import typer.main

from controller.entry.cli import app

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
FIRST_SCREEN = 50  # lines
LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_first_screen_goes_from_clone_to_a_report_and_says_what_the_tests_need() -> None:
    screen = "\n".join(README.read_text(encoding="utf-8").splitlines()[:FIRST_SCREEN])
    for needed in ("make demo", "evalctl report -f specs/demo.yaml", "make test", "root", "minutes"):
        assert needed in screen, f"the README's first {FIRST_SCREEN} lines must show {needed!r}"


def test_every_command_is_in_the_readme() -> None:
    text = README.read_text(encoding="utf-8")
    group = typer.main.get_command(app)
    wanted = {}  # the command as a person reads it → where the README must show it
    for name, command in group.commands.items():  # type: ignore[attr-defined]
        wanted[name] = rf"evalctl +{name}\b"
        for sub in getattr(command, "commands", {}):  # `evalctl db check`, `evalctl nodes list | release …`
            wanted[f"{name} {sub}"] = rf"evalctl +{name} [^\n]*\b{sub}\b"
    missing = [name for name, pattern in wanted.items() if not re.search(pattern, text)]
    assert not missing, f"commands the README does not show (add them to 'Everyday commands'): {missing}"


def test_links_of_the_docs_lead_somewhere() -> None:
    broken = []
    for page in [README, *sorted((REPO / "docs").glob("*.md"))]:
        for target in LINK.findall(page.read_text(encoding="utf-8")):
            path = target.split("#", 1)[0]
            if path and not re.match(r"[a-z]+://", path) and not (page.parent / path).exists():
                broken.append(f"{page.relative_to(REPO)}: {target}")
    assert not broken, f"links to files that do not exist: {broken}"
