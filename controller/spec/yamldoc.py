"""Reading YAML with positions: every value keeps the line and column it came from.

ruamel.yaml's round-trip loader records positions on mappings and sequences (`.lc`), which is
what lets a validation error in a nested field point at `FILE:LINE:COL`. Rejected inputs are
never quoted back, because the input may be a secret.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.constructor import DuplicateKeyError
from ruamel.yaml.error import MarkedYAMLError, YAMLError

from controller.spec.errors import SpecError

Loc = tuple[str | int, ...]
KEY = "[key]"  # a location part meaning "the key just before, not its value" (pydantic's spelling)


@dataclass(frozen=True)
class Document:
    """One YAML document of a file, with its 1-based start position."""

    file: str
    data: Any
    line: int
    col: int

    def error(self, loc: Loc, message: str) -> SpecError:
        line, col = locate(self, loc)
        return SpecError(self.file, line, col, message)


def read_documents(path: Path, label: str) -> tuple[list[Document], list[SpecError]]:
    """All documents of `path` (reported as `label`).

    A syntax error ends the file (the parser cannot resync); a duplicate key loses only its document.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return [], [SpecError(label, 1, 1, f"cannot read file: {exc.__class__.__name__}")]
    yaml = YAML(typ="rt")
    documents: list[Document] = []
    errors: list[SpecError] = []
    nodes = yaml.compose_all(text)
    while True:
        try:
            node = next(nodes)
        except StopIteration:
            return documents, errors
        except YAMLError as exc:
            return documents, [*errors, _yaml_error(label, exc)]
        try:
            data = yaml.constructor.construct_document(node)
        except YAMLError as exc:
            errors.append(_yaml_error(label, exc))
            continue
        documents.append(Document(label, data, node.start_mark.line + 1, node.start_mark.column + 1))


def _yaml_error(label: str, exc: YAMLError) -> SpecError:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
    if isinstance(exc, DuplicateKeyError):
        key = re.match(r'found duplicate key "(.*?)" with value', exc.problem or "")
        name = f"`{key.group(1)}` " if key else ""
        return SpecError(label, line, col, f"duplicate key {name}in this mapping; keep only one of them")
    if isinstance(exc, MarkedYAMLError):
        problem = " ".join(part for part in (exc.problem, f"({exc.context})" if exc.context else "") if part)
        return SpecError(label, line, col, f"YAML syntax error: {problem}; check indentation, ':' and quoting")
    return SpecError(label, line, col, f"YAML error: {exc.__class__.__name__}")


def locate(document: Document, loc: Loc) -> tuple[int, int]:
    """1-based position of `loc` in the document: the deepest part that exists (keys with a trailing KEY)."""
    line, col = document.line, document.col
    node = document.data
    for index, part in enumerate(loc):
        want_key = index + 1 < len(loc) and loc[index + 1] == KEY
        if part == KEY:
            continue
        if isinstance(node, CommentedMap) and part in node:
            # an empty value has no position of its own: point at its key
            line, col = node.lc.key(part) if want_key or node[part] is None else node.lc.value(part)
            line, col = line + 1, col + 1
        elif isinstance(node, CommentedSeq) and isinstance(part, int) and 0 <= part < len(node):
            line, col = node.lc.item(part)
            line, col = line + 1, col + 1
        else:
            break
        node = node[part]
    return line, col


def iter_files(path: Path) -> Iterator[Path]:
    """`path` itself, or every *.yaml / *.yml below it, sorted."""
    if path.is_dir():
        yield from sorted(p for p in path.rglob("*") if p.suffix in (".yaml", ".yml") and p.is_file())
    else:
        yield path
