"""Reading YAML with positions: every value keeps the line and column it came from.

ruamel.yaml's round-trip loader records positions on mappings and sequences (`.lc`), which is
what lets a validation error in a nested field point at `FILE:LINE:COL`. Rejected inputs are
never quoted back, because the input may be a secret.

Input is bounded before it is parsed (size, text encoding) and while it is composed (nesting depth, alias
expansion), so a hostile file is refused with a position instead of exhausting the stack, memory or time.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.composer import Composer
from ruamel.yaml.constructor import DuplicateKeyError
from ruamel.yaml.error import MarkedYAMLError, StreamMark, YAMLError
from ruamel.yaml.events import AliasEvent
from ruamel.yaml.nodes import CollectionNode, MappingNode, Node
from ruamel.yaml.reader import ReaderError

from controller.api.errors import SpecError

Loc = tuple[str | int, ...]
KEY = "[key]"  # a location part meaning "the key just before, not its value" (pydantic's spelling)

MAX_FILE_BYTES = 1024 * 1024  # ruamel's pure-Python parser reads ~200 KB/s; real specs are a few KB
MAX_DEPTH = 64  # nesting levels, aliases expanded; a real spec nests 4 deep
MAX_ALIAS_VALUES = 10_000  # values aliases may add to one document: merge keys yes, "billion laughs" no


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
    text = read_text(path, label)
    if isinstance(text, SpecError):
        return [], [text]
    yaml = YAML(typ="rt")
    yaml.Composer = BoundedComposer
    documents: list[Document] = []
    errors: list[SpecError] = []
    nodes = yaml.compose_all(text)
    while True:
        try:
            node = next(nodes)
        except StopIteration:
            return documents, errors
        except YAMLError as exc:
            return documents, [*errors, _yaml_error(label, text, exc)]
        try:
            data = yaml.constructor.construct_document(node)
        except YAMLError as exc:
            errors.append(_yaml_error(label, text, exc))
            continue
        document = Document(label, data, node.start_mark.line + 1, node.start_mark.column + 1)
        bad_key = _non_string_key(document)
        if bad_key is not None:
            errors.append(bad_key)
            continue
        documents.append(document)


def read_text(path: Path, label: str) -> str | SpecError:
    """The file's text, or why it is not a spec file: not a regular file, too big, binary, not UTF-8.

    Reads at most MAX_FILE_BYTES + 1 bytes, so a device or a file that keeps growing cannot exhaust memory.
    """
    if not path.is_file():
        return SpecError(label, 1, 1, "not a regular file (a device, FIFO or socket?); name a .yaml file or a directory")
    try:
        with path.open("rb") as stream:
            data = stream.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        return SpecError(label, 1, 1, f"cannot read file: {exc.strerror or exc.__class__.__name__}")
    if len(data) > MAX_FILE_BYTES:
        return SpecError(label, 1, 1, f"file is larger than {MAX_FILE_BYTES // 1024} KiB, too big for a spec file; "
                                      "split it into several files (-f takes a directory)")
    if b"\0" in data:
        return SpecError(label, 1, 1, "not a text file (it holds NUL bytes); spec files are UTF-8 YAML")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        return SpecError(label, 1, 1, f"not a text file (invalid UTF-8 at byte {exc.start}); save it as UTF-8")


class SpecLimit(MarkedYAMLError):
    """A document beyond what a spec needs (too deep, aliases that expand too far); refused before it is built."""

    def __init__(self, message: str, mark: StreamMark) -> None:
        super().__init__(problem=message, problem_mark=mark)


class BoundedComposer(Composer):
    """Refuses nesting deeper than MAX_DEPTH and aliases adding more than MAX_ALIAS_VALUES values.

    Checked while composing, before anything recursive (composer, constructor, validation) goes deeper,
    and without expanding aliases: each anchored node's size and height are computed once.
    """

    def __init__(self, loader: YAML | None = None) -> None:
        super().__init__(loader)
        self.warn_double_anchors = False  # re-defining an anchor is valid YAML: the later one wins
        self._measured: dict[int, tuple[int, int]] = {}
        self._aliased = 0

    def compose_document(self) -> Node:
        self._measured, self._aliased = {}, 0
        node: Node = super().compose_document()
        return node

    def compose_node(self, parent: Node | None, index: object) -> Node:
        event = self.parser.peek_event()
        if isinstance(event, AliasEvent):
            if event.anchor in self.anchors:
                self._count_alias(self.anchors[event.anchor], event.start_mark)
        elif self.depth >= MAX_DEPTH:
            raise SpecLimit(f"nested more than {MAX_DEPTH} levels deep; a spec needs a handful", event.start_mark)
        node: Node = super().compose_node(parent, index)
        return node

    def _count_alias(self, node: Node, mark: StreamMark) -> None:
        size, height = self._measure(node, mark)
        if self.depth + height > MAX_DEPTH:
            raise SpecLimit(f"this alias nests the document more than {MAX_DEPTH} levels deep; write the value out",
                            mark)
        self._aliased += size
        if self._aliased > MAX_ALIAS_VALUES:
            raise SpecLimit(f"aliases in this document expand to more than {MAX_ALIAS_VALUES} values; "
                            "write the values out instead of nesting aliases", mark)

    def _measure(self, node: Node, mark: StreamMark) -> tuple[int, int]:
        """(values, levels) of `node` with aliases expanded; memoised, so nested aliases cost nothing extra."""
        if id(node) in self._measured:
            return self._measured[id(node)]
        if isinstance(node, CollectionNode) and node.end_mark is None:
            raise SpecLimit("this alias refers to a collection that contains it (a cycle); write the value out", mark)
        children = [part for pair in node.value for part in pair] if isinstance(node, MappingNode) else (
            node.value if isinstance(node, CollectionNode) else [])
        measured = [self._measure(child, mark) for child in children]
        result = (1 + sum(size for size, _ in measured), 1 + max((height for _, height in measured), default=0))
        self._measured[id(node)] = result
        return result


def _non_string_key(document: Document) -> SpecError | None:
    """The first mapping key that is not a string (`1:`, `true:`, `? [a, b]`): no resource field is named so."""
    pending, seen = [document.data], set()
    while pending:
        node = pending.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, CommentedMap):
            for key in node:
                if not isinstance(key, str):
                    line, col = node.lc.key(key)
                    return SpecError(document.file, line + 1, col + 1,
                                     f"this key is {_kind(key)}, but keys must be strings; quote it or fix it")
            pending.extend(node.values())
        elif isinstance(node, CommentedSeq):
            pending.extend(node)
    return None


def _kind(key: object) -> str:
    """What a non-string key is, without quoting it (a misplaced value may be a secret)."""
    if key is None:
        return "empty"
    if isinstance(key, tuple | Mapping):
        return "a list or mapping"
    if isinstance(key, bool):
        return "a boolean"
    return "a number" if isinstance(key, int | float) else f"a {type(key).__name__}"  # e.g. a date


def _yaml_error(label: str, text: str, exc: YAMLError) -> SpecError:
    if isinstance(exc, ReaderError):
        line, col = _position(text, exc.position)
        return SpecError(label, line, col, f"character U+{exc.character:04X} is not allowed in YAML; remove it "
                                           "(or write it as an escape in a double-quoted string)")
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
    if isinstance(exc, SpecLimit):
        return SpecError(label, line, col, exc.problem)
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


def _position(text: str, index: int) -> tuple[int, int]:
    """1-based line and column of character `index` of `text`."""
    return text.count("\n", 0, index) + 1, index - text.rfind("\n", 0, index)


def iter_files(path: Path) -> Iterator[Path]:
    """`path` itself, or every *.yaml / *.yml below it, sorted."""
    if path.is_dir():
        yield from sorted(p for p in path.rglob("*") if p.suffix in (".yaml", ".yml") and p.is_file())
    else:
        yield path
