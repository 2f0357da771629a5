"""The field reference (docs/reference.md), rendered from the CRDs' OpenAPI schemas.

The schema the API server enforces is the one documented: every field's path, type, default, bounds and
description come from the pydantic models through `crd_documents()`, so the reference cannot disagree with
`validate` or `kubectl explain`. Deterministic: the same models give the same bytes (a test compares).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, NamedTuple

from controller.api.crds import Schema, crd_documents
from controller.api.fields import API_VERSION

HEADER = f"""\
# Field reference

Generated from the spec models (`controller/api/`) by `evalctl docs`; do not edit by hand. A test fails when this
file is stale: run `evalctl docs` and commit it.

Every resource is `apiVersion: {API_VERSION}`, with its `kind`, a `metadata.name` (lowercase letters, digits, `-`,
`.`) and, except a ClusterEvalCluster, an optional `metadata.namespace` (an EvalRun is known as `namespace/name`).
Fields are camelCase; `evalctl validate` refuses an unknown one at its `FILE:LINE:COL`. The `status` of each
resource is written by the operator. The rules these fields tune are in [RULES.md](RULES.md), cited as `RULES §N`.

Annotations the operator reads: `evalrun.io/requestedAt` on an EvalRun (setting or changing it runs a pass at once),
and `evalrun.io/release-nodes: gpu03,gpu04` on an EvalCluster (releases those quarantined nodes of that cluster; the
operator then removes the annotation).

A row's path uses `[]` for the items of a list and `{{}}` for the values of a map. "yes" under *required*: the
field must be set whenever its parent is.
"""


class Row(NamedTuple):
    path: str
    type: str
    default: str
    required: bool
    description: str


def render_reference() -> str:
    """docs/reference.md, as text."""
    documents = {doc["spec"]["names"]["kind"]: doc for doc in crd_documents()}
    cluster_rows = rows(spec_schema(documents["EvalCluster"]))
    sections = [HEADER]
    for kind in ("EvalRun", "EvalCluster", "ClusterEvalCluster"):
        doc = documents[kind]
        found = rows(spec_schema(doc))
        intro = _intro(doc)
        if kind == "ClusterEvalCluster":  # an EvalCluster's spec plus its grant: list only what it adds
            found = [row for row in found if row not in cluster_rows]
            intro += " Its `spec` takes every field of an EvalCluster's `spec`, and:"
        sections.append(f"## {kind}\n\n{intro}\n\n{table(found)}")
    return "\n".join(sections)


def spec_schema(doc: Schema) -> Schema:
    schema: Schema = doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return schema


def _intro(doc: Schema) -> str:
    names = doc["spec"]["names"]
    schema = doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    scope = "cluster-scoped" if doc["spec"]["scope"] == "Cluster" else "namespaced"
    return (f"{_sentence(schema['description'])} {scope.capitalize()}; `kubectl get {names['plural']}` "
            f"(short name `{names['shortNames'][0]}`).")


def rows(schema: Schema, path: str = "spec") -> list[Row]:
    """Every field under `schema`, depth first in the models' order."""
    return list(_walk(schema, path))


def _walk(schema: Schema, path: str) -> Iterator[Row]:
    required = set(schema.get("required", ()))
    for name, prop in schema.get("properties", {}).items():
        child = f"{path}.{name}"
        yield Row(child, type_of(prop), default_of(prop), name in required, _text(prop.get("description", "")))
        yield from _nested(prop, child)


def _nested(prop: Schema, path: str) -> Iterator[Row]:
    """The fields of an object, of a list's object items or of a map's object values."""
    if "properties" in prop:
        yield from _walk(prop, path)
    for suffix, inner in (("[]", prop.get("items")), ("{}", prop.get("additionalProperties"))):
        if isinstance(inner, dict) and "properties" in inner:
            yield from _walk(inner, path + suffix)


def type_of(prop: Schema) -> str:
    """`string (1–64 chars)`, `integer (1–100)`, `` `hold` \\| `upload` ``, `list of string, ≤ 32 items`, …"""
    if "enum" in prop:
        return " \\| ".join(f"`{value}`" for value in prop["enum"])
    if "type" not in prop and prop.get("x-kubernetes-preserve-unknown-fields"):
        return "string or object"  # e.g. a cluster: NAME or {kind, name}; the loader validates which
    kind = prop.get("type", "object")
    if kind == "array":
        items = _bounds(prop, "minItems", "maxItems")
        return f"list of {type_of(prop.get('items', {}))}" + (f", {items} items" if items else "")
    if kind == "object" and isinstance(prop.get("additionalProperties"), dict):
        return f"map of {type_of(prop['additionalProperties'])}"
    bounds = _bounds(prop, "minimum", "maximum") or _bounds(prop, "minLength", "maxLength")
    unit = " chars" if "minLength" in prop or "maxLength" in prop else ""
    return f"{kind} ({bounds}{unit})" if bounds else kind


def _bounds(prop: Schema, low: str, high: str) -> str:
    """`1–100`, `≥ 0`, `> 0, ≤ 1`: an integer's exclusive minimum is its successor."""
    lo, hi = prop.get(low), prop.get(high)
    lo_strict = low == "minimum" and prop.get("exclusiveMinimum") is True
    hi_strict = high == "maximum" and prop.get("exclusiveMaximum") is True
    if lo is not None and lo_strict and prop.get("type") == "integer":
        lo, lo_strict = lo + 1, False
    if lo is not None and hi is not None and not (lo_strict or hi_strict):
        return f"{_number(lo)}–{_number(hi)}"
    parts = ([f"{'>' if lo_strict else '≥'} {_number(lo)}"] if lo is not None else []) + \
            ([f"{'<' if hi_strict else '≤'} {_number(hi)}"] if hi is not None else [])
    return ", ".join(parts)


def _number(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) and abs(value) >= 10_000 else str(value)


def default_of(prop: Schema) -> str:
    if "default" not in prop:
        return ""
    value = prop["default"]
    return f"`{value}`" if isinstance(value, str) else f"`{json.dumps(value, ensure_ascii=False)}`"


def table(found: list[Row]) -> str:
    lines = ["| field | type | default | required | description |", "|---|---|---|---|---|"]
    lines += [f"| `{r.path}` | {r.type} | {r.default} | {'yes' if r.required else ''} | {r.description} |"
              for r in found]
    return "\n".join(lines) + "\n"


def _text(description: str) -> str:
    """One table cell: one line, pipes escaped."""
    return " ".join(description.split()).replace("|", "\\|")


def _sentence(text: str) -> str:
    text = " ".join(text.split())
    return text if text.endswith(".") else text + "."
