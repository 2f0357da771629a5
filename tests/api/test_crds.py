"""The generated CRDs: committed file in sync, structural schema, names, columns, and the example fits."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML

from controller.api.crds import render_crds

REPO = Path(__file__).resolve().parents[2]
COMMITTED = REPO / "crds" / "evalrun.io_crds.yaml"
EXAMPLE = REPO / "specs" / "examples" / "leonardo.yaml"
FORBIDDEN = {"$ref", "$defs", "anyOf", "oneOf", "allOf", "not", "const", "title", "definitions"}
TYPES = {"object", "array", "string", "integer", "number", "boolean"}


def crds() -> dict[str, dict[str, Any]]:
    documents = YAML(typ="safe").load_all(render_crds())
    return {doc["spec"]["names"]["kind"]: doc for doc in documents}


def schema_of(kind: str) -> dict[str, Any]:
    return crds()[kind]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def test_committed_file_matches_the_models() -> None:
    assert COMMITTED.read_text() == render_crds(), (
        "crds/ drifted from controller/api: python -m controller.api.crds > crds/evalrun.io_crds.yaml"
    )


def test_names_group_version_scope() -> None:
    found = crds()
    assert set(found) == {"EvalRun", "EvalCluster", "ClusterEvalCluster"}
    run, cluster = found["EvalRun"], found["EvalCluster"]
    assert found["ClusterEvalCluster"]["spec"]["scope"] == "Cluster", "the admin's, for every namespace"
    assert run["apiVersion"] == "apiextensions.k8s.io/v1"
    assert run["metadata"]["name"] == "evalruns.evalrun.io"
    assert cluster["metadata"]["name"] == "evalclusters.evalrun.io"
    assert run["spec"]["names"]["shortNames"] == ["er"]
    assert cluster["spec"]["names"]["plural"] == "evalclusters"
    for crd in found.values():
        assert crd["spec"]["group"] == "evalrun.io"
        assert crd["spec"]["scope"] == ("Cluster" if crd is found["ClusterEvalCluster"] else "Namespaced")
        [version] = crd["spec"]["versions"]
        assert (version["name"], version["served"], version["storage"]) == ("v1alpha1", True, True)
        assert version["subresources"] == {"status": {}}
        status = version["schema"]["openAPIV3Schema"]["properties"]["status"]
        assert status["x-kubernetes-preserve-unknown-fields"] is True


def test_evalrun_printer_columns() -> None:
    columns = crds()["EvalRun"]["spec"]["versions"][0]["additionalPrinterColumns"]
    default = [(c["name"], c["jsonPath"]) for c in columns if not c.get("priority")]
    assert default == [
        ("Ready", '.status.conditions[?(@.type=="Ready")].status'),
        ("Done", ".status.summary.done"),
        ("Total", ".status.summary.total"),
        ("Running", ".status.summary.running"),
        ("Failed", ".status.summary.failed"),
        ("Age", ".metadata.creationTimestamp"),
    ]
    wide = [(c["name"], c["jsonPath"]) for c in columns if c.get("priority") == 1]
    assert [name for name, _ in wide] == ["Reason", "Cluster", "Cluster-Ref", "Clusters", "Suspended", "Last-Pass"]
    assert ("Clusters", ".spec.clusters") in wide, "a multi-cluster EvalRun shows its clusters (-o wide)"


def walk(node: dict[str, Any], path: str = "") -> list[str]:
    """Violations of Kubernetes' structural-schema rules (and of ours: every spec field described)."""
    problems = [f"{path}: {key}" for key in FORBIDDEN & set(node)]
    if node.get("x-kubernetes-preserve-unknown-fields"):
        return problems
    if node.get("type") not in TYPES:
        problems.append(f"{path}: type {node.get('type')!r}")
    if "properties" in node and "additionalProperties" in node:
        problems.append(f"{path}: properties and additionalProperties")
    if node.get("additionalProperties") is False:
        problems.append(f"{path}: additionalProperties false")
    for bound in ("exclusiveMinimum", "exclusiveMaximum"):
        if bound in node and not isinstance(node[bound], bool):
            problems.append(f"{path}: numeric {bound}")
    if "default" in node:
        problems += check_value(node["default"], node, f"{path}.default")
    problems += [
        f"{path}: required {name} not a property"
        for name in set(node.get("required", ())) - set(node.get("properties", {}))
    ]
    for name, child in node.get("properties", {}).items():
        if path.startswith("spec") and "description" not in child:
            problems.append(f"{path}.{name}: no description")
        problems += walk(child, f"{path}.{name}" if path else name)
    if isinstance(node.get("items"), dict):
        problems += walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        problems += walk(node["additionalProperties"], f"{path}{{}}")
    return problems


def check_value(value: Any, schema: dict[str, Any], path: str) -> list[str]:
    """What an API server would prune or reject in `value` under `schema` (the subset the CRDs use)."""
    if value is None:
        return [] if schema.get("nullable") else [f"{path}: null"]
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    expected = {"object": dict, "array": list, "string": str, "boolean": bool, "integer": int, "number": (int, float)}[
        schema["type"]
    ]
    if not isinstance(value, expected) or (schema["type"] in ("integer", "number") and isinstance(value, bool)):
        return [f"{path}: {value!r} is not {schema['type']}"]
    if "enum" in schema and value not in schema["enum"]:
        return [f"{path}: {value!r} not in enum"]
    if isinstance(value, dict):
        problems = [f"{path}.{k}: would be pruned" for k in value if k not in schema.get("properties", {})]
        if "additionalProperties" in schema:
            problems = [p for v in value.values() for p in check_value(v, schema["additionalProperties"], path)]
        for key, child in value.items():
            if key in schema.get("properties", {}):
                problems += check_value(child, schema["properties"][key], f"{path}.{key}")
        return problems + [f"{path}.{r}: required" for r in schema.get("required", ()) if r not in value]
    if isinstance(value, list):
        return [p for i, item in enumerate(value) for p in check_value(item, schema["items"], f"{path}[{i}]")]
    return []


@pytest.mark.parametrize("kind", ["EvalRun", "EvalCluster"])
def test_schema_is_structural(kind: str) -> None:
    assert walk(schema_of(kind)) == []


def test_nullability_and_bounds_survive_the_rewrite() -> None:
    spec = schema_of("EvalRun")["properties"]["spec"]
    assert spec["properties"]["harborConfig"] == {
        "type": "string",
        "description": "Explicit Harbor config; overrides registry and size rule.",
        "nullable": True,
        "minLength": 1,
        "maxLength": 4096,
    }
    assert spec["properties"]["staleStartedHours"]["maximum"] == 8760
    fraction = spec["properties"]["monitor"]["properties"]["nearCompleteFraction"]
    assert (fraction["minimum"], fraction["exclusiveMinimum"], fraction["maximum"], fraction["default"]) == (
        0,
        True,
        1,
        0.97,
    )
    assert spec["properties"]["resume"]["default"] == {}
    assert "required" not in spec, "cluster or clusterRef, models or modelSelector: the loader checks them"
    cluster_spec = schema_of("EvalCluster")["properties"]["spec"]
    assert cluster_spec["properties"]["env"]["additionalProperties"] == {"type": "string", "maxLength": 32 * 1024}
    assert cluster_spec["properties"]["scheduler"]["properties"]["type"]["enum"] == ["local", "slurm"]


def test_walltime_default_is_quoted_for_yaml_1_1_readers() -> None:
    assert 'default: "24:00:00"' in render_crds()


def test_example_fits_the_schema_unpruned() -> None:
    for document in YAML(typ="safe").load_all(EXAMPLE.read_text()):
        spec_schema = schema_of(document["kind"])["properties"]["spec"]
        assert check_value(document["spec"], spec_schema, "spec") == []


def test_checker_catches_what_it_should() -> None:
    bad = {"cluster": 3, "extra": 1, "resume": {"maxTotalFires": None}, "modelSelector": {}}
    assert check_value(bad, schema_of("EvalRun")["properties"]["spec"], "spec") == [
        "spec.extra: would be pruned",
        "spec.cluster: 3 is not string",
        "spec.resume.maxTotalFires: null",
        "spec.modelSelector.limit: required",
    ]
    assert walk({"type": "object", "properties": {"x": {"anyOf": []}}}) == ["x: anyOf", "x: type None"]


def test_an_unset_grant_selector_has_no_default() -> None:
    """The API server fills in defaults: a `selector: {}` default would grant every namespace."""
    grant = schema_of("ClusterEvalCluster")["properties"]["spec"]["properties"]["allowedNamespaces"]
    assert "default" not in grant and "default" not in grant["properties"]["selector"]
    assert "allowedNamespaces" not in schema_of("EvalCluster")["properties"]["spec"]["properties"]
