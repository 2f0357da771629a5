"""Every string field a tenant writes is classified (issue 27): a new field of an EvalCluster or EvalRun fails
here until controller/api/capabilities.py says what it names and what the operator policy grants, and the
table in docs/MULTI_TENANT.md is that module's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from controller.api.capabilities import CAPABILITIES, PLAIN, render_table
from controller.api.crds import render_crds

ROOT = Path(__file__).resolve().parents[2]


def string_fields(node: dict[str, Any], path: str) -> Iterator[str]:
    """Every string a schema admits, closed enums aside; a map of strings is one field (its keys and values)."""
    if "enum" in node:
        return
    untyped = "type" not in node and node.get("x-kubernetes-preserve-unknown-fields")  # a string among others
    if node.get("type") == "string" or untyped or isinstance(node.get("additionalProperties"), dict):
        yield path
    for name, child in (node.get("properties") or {}).items():
        yield from string_fields(child, f"{path}.{name}")
    if node.get("type") == "array":
        yield from string_fields(node["items"], path + "[]")


def schema_fields() -> set[str]:
    found = set()
    for crd in yaml.safe_load_all(render_crds()):
        kind = crd["spec"]["names"]["kind"]
        if kind == "ClusterEvalCluster":  # the admin's: unchecked
            continue
        schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
        found |= set(string_fields(schema, f"{kind}.spec"))
    return found


def test_every_string_field_of_a_tenants_objects_is_classified():
    fields = schema_fields()

    assert fields - set(CAPABILITIES) - PLAIN == set(), "classify it in controller/api/capabilities.py"
    assert set(CAPABILITIES) | PLAIN <= fields, "a classified field the schema no longer has"
    assert not set(CAPABILITIES) & PLAIN


def test_the_docs_table_is_the_modules():
    assert render_table() in (ROOT / "docs" / "MULTI_TENANT.md").read_text(), \
        "regenerate: python -m controller.api.capabilities"
