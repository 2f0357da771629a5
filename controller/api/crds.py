"""CustomResourceDefinitions generated from the pydantic models, so the CRDs and the loader never disagree.

Kubernetes wants a *structural* OpenAPI v3 schema: every node typed, no `$ref`, no `anyOf` for
nullability, no `const`, boolean `exclusiveMinimum`. `structural()` rewrites pydantic's JSON
Schema into that dialect; the committed `crds/evalrun.io_crds.yaml` is its output
(regenerate: `python -m controller.api.crds > crds/evalrun.io_crds.yaml`).
"""

from __future__ import annotations

import io
import re
from typing import Any

from pydantic import BaseModel
from ruamel.yaml import YAML
from ruamel.yaml.nodes import ScalarNode
from ruamel.yaml.representer import SafeRepresenter

from controller.api.evalcluster import ClusterEvalCluster, ClusterEvalClusterSpec, EvalCluster, EvalClusterSpec
from controller.api.evalrun import EvalRun, EvalRunSpec
from controller.api.fields import API_VERSION

GROUP, VERSION = API_VERSION.split("/")
Schema = dict[str, Any]

EVALRUN_COLUMNS: list[Schema] = [
    {"name": "Ready", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].status'},
    {"name": "Done", "type": "integer", "jsonPath": ".status.summary.done"},
    {"name": "Total", "type": "integer", "jsonPath": ".status.summary.total"},
    {"name": "Running", "type": "integer", "jsonPath": ".status.summary.running"},
    {"name": "Failed", "type": "integer", "jsonPath": ".status.summary.failed"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    # -o wide
    {"name": "Reason", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].reason', "priority": 1},
    {"name": "Cluster", "type": "string", "jsonPath": ".spec.cluster", "priority": 1},
    {"name": "Cluster-Ref", "type": "string", "jsonPath": ".spec.clusterRef.name", "priority": 1},
    {"name": "Clusters", "type": "string", "jsonPath": ".spec.clusters", "priority": 1},  # as JSON: ["a","b"]
    {"name": "Suspended", "type": "boolean", "jsonPath": ".spec.suspend", "priority": 1},
    {"name": "Last-Pass", "type": "date", "jsonPath": ".status.lastPass.at", "priority": 1},
]
EVALCLUSTER_COLUMNS = [
    {"name": "Scheduler", "type": "string", "jsonPath": ".spec.scheduler.type"},
    {"name": "Partition", "type": "string", "jsonPath": ".spec.partition"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def crd_documents() -> list[Schema]:
    """The CRDs, one per kind: what `render_crds` writes and the field reference (`evalctl docs`) reads."""
    return [
        crd(EvalCluster, EvalClusterSpec, plural="evalclusters", short_names=["ec"], columns=EVALCLUSTER_COLUMNS),
        crd(ClusterEvalCluster, ClusterEvalClusterSpec, plural="clusterevalclusters", short_names=["cec"],
            columns=EVALCLUSTER_COLUMNS, scope="Cluster"),
        crd(EvalRun, EvalRunSpec, plural="evalruns", short_names=["er"], columns=EVALRUN_COLUMNS),
    ]


def render_crds() -> str:
    """The CRDs as one multi-document YAML string."""
    documents = crd_documents()
    yaml = YAML(typ="safe", pure=True)
    yaml.default_flow_style = False
    yaml.sort_base_mapping_type_on_output = False  # type: ignore[assignment]
    yaml.allow_unicode = True
    yaml.width = 120
    yaml.representer.add_representer(str, _represent_str)
    out = io.StringIO()
    out.write("# Generated from controller/api/evalcluster.py and evalrun.py by controller/api/crds.py; do not edit.\n")
    yaml.dump_all(documents, out)
    return out.getvalue()


def crd(
    resource: type[BaseModel], spec: type[BaseModel], *, plural: str, short_names: list[str], columns: list[Schema],
    scope: str = "Namespaced",
) -> Schema:
    kind = resource.__name__
    schema = {
        "type": "object",
        "description": resource.__doc__ or kind,
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string", "description": API_VERSION},
            "kind": {"type": "string", "description": kind},
            "metadata": {"type": "object"},
            "spec": structural(spec.model_json_schema(by_alias=True, mode="validation")),
            "status": {
                "type": "object",
                "description": "Written by the controller: conditions, counts per phase, cells needing attention.",
                "x-kubernetes-preserve-unknown-fields": True,
            },
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": scope,
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
                "shortNames": short_names,
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": columns,
                    "schema": {"openAPIV3Schema": schema},
                }
            ],
        },
    }


def structural(schema: Schema) -> Schema:
    """Pydantic JSON Schema → Kubernetes structural schema (refs inlined, nullability as `nullable`)."""
    return _convert(schema, schema.get("$defs", {}))


def _convert(node: Schema, defs: dict[str, Schema]) -> Schema:
    node = {k: v for k, v in node.items() if k not in ("title", "$defs")}
    if "$ref" in node:
        target = _convert(defs[node.pop("$ref").rsplit("/", 1)[-1]], defs)
        node = {**target, **node}
    if "anyOf" in node:
        options = [o for o in node.pop("anyOf") if o.get("type") != "null"]
        if len(options) != 1:
            raise ValueError(f"cannot express anyOf with {len(options)} non-null options structurally")
        node = {**_convert(options[0], defs), **node, "nullable": True}
    if node.get("default", 0) is None:
        del node["default"]
    if "const" in node:
        node["enum"] = [node.pop("const")]
    for bound, keyword in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if isinstance(node.get(bound), int | float) and not isinstance(node[bound], bool):
            node[keyword] = node[bound]
            node[bound] = True
    if node.get("additionalProperties") is False:
        del node["additionalProperties"]
    elif isinstance(node.get("additionalProperties"), dict):
        node["additionalProperties"] = _convert(node["additionalProperties"], defs)
    if "items" in node:
        node["items"] = _convert(node["items"], defs)
    if "properties" in node:
        node["properties"] = {name: _with_default(_convert(prop, defs)) for name, prop in node["properties"].items()}
    return {key: node[key] for key in sorted(node, key=_key_rank)}


KEY_ORDER = ["type", "description", "nullable", "default", "enum", "minimum", "exclusiveMinimum", "maximum"]


def _key_rank(key: str) -> int:
    """Readable key order: type and description first, required last; the rest as pydantic wrote them."""
    if key == "required":
        return len(KEY_ORDER) + 1
    return KEY_ORDER.index(key) if key in KEY_ORDER else len(KEY_ORDER)


def _with_default(prop: Schema) -> Schema:
    """An optional sub-object without required fields defaults to `{}`, so the API server fills in its defaults."""
    optional_object = prop.get("type") == "object" and "properties" in prop and "required" not in prop
    if optional_object and "default" not in prop and not prop.get("nullable"):
        return {**prop, "default": {}}
    return prop


def _represent_str(representer: SafeRepresenter, value: str) -> ScalarNode:
    """Quote strings a YAML 1.1 reader (kubectl's) would take for a number or boolean, e.g. 24:00:00."""
    style = '"' if YAML11_NON_STRING.fullmatch(value) else None
    return representer.represent_scalar("tag:yaml.org,2002:str", value, style=style)


YAML11_NON_STRING = re.compile(r"[-+0-9.:_eE]+|(?i:y|n|yes|no|on|off|true|false|null|~)")


if __name__ == "__main__":
    print(render_crds(), end="")
