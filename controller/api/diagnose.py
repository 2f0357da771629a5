"""Pydantic validation errors → `SpecError`s that point at the offending YAML node and say how to fix it.

Placement rule: an unknown field points at its key, a missing field at the mapping that lacks it,
anything else at the value (list entries at the entry). Messages never contain the rejected
input: it may be a secret.
"""

from __future__ import annotations

import difflib
import re
import types
from collections.abc import Mapping
from typing import Annotated, Any, TypeVar, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails

from controller.api.errors import SpecError, clip
from controller.api.fields import SECRET_LOOKING_ENV
from controller.api.yamldoc import KEY, Document, Loc

M = TypeVar("M", bound=BaseModel)
PYTHON_TYPE = re.compile(r"a valid dictionary or instance of \w+")  # users write YAML, not Python classes


def validate(
    model: type[M], document: Document, *, by_alias: bool, ignore: tuple[str, ...] = ()
) -> M | list[SpecError]:
    """The validated model, or one error per problem.

    `by_alias` rejects snake_case keys in camelCase resources; `ignore` drops top-level keys that
    are not ours to validate (a custom resource's `status`).
    """
    data = document.data
    if ignore and isinstance(data, Mapping):
        data = {key: value for key, value in data.items() if key not in ignore}
    try:
        if by_alias:
            return model.model_validate(data, by_alias=True, by_name=False)
        return model.model_validate(data)
    except ValidationError as exc:
        return [_spec_error(model, document, error) for error in exc.errors(include_url=False, include_input=False)]


def _spec_error(model: type[BaseModel], document: Document, error: ErrorDetails) -> SpecError:
    loc: Loc = tuple(error["loc"]) + tuple(error.get("ctx", {}).get("at", ()))
    kind = error["type"]
    if kind == "extra_forbidden":
        return document.error((*loc, KEY), _unknown_field(model, loc))
    if kind == "missing":
        return document.error(loc[:-1], _missing_field(model, loc))
    message = PYTHON_TYPE.sub("a mapping", error["msg"].removeprefix("Value error, "))
    field = _field_at(model, loc)
    explained = kind in ("value_error", "literal_error", "enum") or "at" in error.get("ctx", {})
    hint = f" ({field.description})" if field and field.description and not explained else ""
    return document.error(loc, f"{dotted(loc) or 'document'}: {message}{hint}")


def _unknown_field(model: type[BaseModel], loc: Loc) -> str:
    name = clip(str(loc[-1]))
    owner = _model_at(model, loc[:-1])
    where = dotted(loc[:-1]) or "the document"
    valid = [_alias(n, f) for n, f in owner.model_fields.items()] if owner else []
    if SECRET_LOOKING_ENV.search(name) or (owner and "secret_ref" in owner.model_fields and name.lower() == "value"):
        return (
            f"`{name}` in {where} looks like a secret written inline; secrets never go in a spec: "
            f"store it in a Kubernetes Secret (or env var EVALCTL_SECRET_<NAME>_<KEY> for the CLI) and "
            f"reference it with secretRef: {{name: <secret>, key: {name}}}"
        )
    message = f"unknown field `{name}` in {where}"
    close = difflib.get_close_matches(name, valid, n=1, cutoff=0.6) or [
        v for v in valid if v.lower() == name.replace("_", "").replace("-", "").lower()
    ]
    if close:
        return f"{message}; did you mean `{close[0]}`?"
    return f"{message}; valid fields: {', '.join(valid)}" if valid else message


def _missing_field(model: type[BaseModel], loc: Loc) -> str:
    field = _field_at(model, loc)
    where = dotted(loc[:-1]) or "the document"
    about = f" ({field.description})" if field and field.description else ""
    return f"missing required field `{loc[-1]}` in {where}; add `{loc[-1]}: …`{about}"


def dotted(loc: Loc) -> str:
    """`spec.models[1]` style path for messages."""
    text = ""
    for part in loc:
        if part == KEY:
            continue
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _alias(name: str, field: FieldInfo) -> str:
    return field.validation_alias if isinstance(field.validation_alias, str) else field.alias or name


def _field_at(model: type[BaseModel], loc: Loc) -> FieldInfo | None:
    return _walk(model, loc)[1]


def _model_at(model: type[BaseModel], loc: Loc) -> type[BaseModel] | None:
    annotation = _walk(model, loc)[0]
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def _walk(model: type[BaseModel], loc: Loc) -> tuple[Any, FieldInfo | None]:
    """Follow `loc` through model fields, list items and dict values: the type reached and the last field passed."""
    annotation: Any = model
    field: FieldInfo | None = None
    for part in loc:
        if part == KEY:
            break
        annotation = _unwrap(annotation)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            field = next((f for n, f in annotation.model_fields.items() if part in (n, _alias(n, f))), None)
            if field is None:
                return None, None
            annotation = field.annotation
        elif get_origin(annotation) in (list, tuple, dict):
            annotation = get_args(annotation)[-1]
        else:
            return None, field
    return _unwrap(annotation), field


def _unwrap(annotation: Any) -> Any:
    """Strip Annotated and Optional, the wrappers that do not change which mapping is validated."""
    while True:
        if get_origin(annotation) is Annotated:
            annotation = get_args(annotation)[0]
        elif get_origin(annotation) in (Union, types.UnionType):
            options = [a for a in get_args(annotation) if a is not type(None)]
            if len(options) != 1:
                return annotation
            annotation = options[0]
        else:
            return annotation
