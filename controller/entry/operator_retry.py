"""`evalctl retry` for the operator (RULES §13): an annotation on the EvalRun.

`evalrun.io/retry: <token>` — any token not handled before — asks for one retry of every held cell of the EvalRun,
or of the cells `evalrun.io/retry-cells` selects (`model=Org/M,benchmark=tb2`; several cells separated by `;`;
a benchmark matches the cell's benchmark, dataset or its name in the results DB), with `evalrun.io/retry-reason` as
the why. After its pass, the operator records one request per held cell it selects (the request's id comes from
the token, so recording it again after a restart is a no-op), writes the token to `.status.retry` (the last one
handled: the same token is not handled again) and says what it did in an Event. The next pass releases each hold.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from controller.core.levers import retried
from controller.core.retry import RetryRequest, request_id
from controller.core.store import Store
from controller.core.vocabulary import CellPlan
from controller.entry.explaining import names_cell
from controller.entry.kube_status import EventNote, clip

log = logging.getLogger("evalctl.operator")
RETRY = "evalrun.io/retry"
RETRY_CELLS = "evalrun.io/retry-cells"
RETRY_REASON = "evalrun.io/retry-reason"
SELECTOR_KEYS = ("model", "benchmark")


class SelectorError(ValueError):
    """A `evalrun.io/retry-cells` value that does not parse."""


def parse_cells(text: str) -> tuple[dict[str, str], ...]:
    """`model=Org/M,benchmark=tb2; model=Org/N` → one dict per cell selector (an empty text: every cell)."""
    selectors = []
    for part in (p.strip() for p in text.split(";")):
        if not part:
            continue
        selector: dict[str, str] = {}
        for pair in (p.strip() for p in part.split(",")):
            key, eq, value = pair.partition("=")
            key, value = key.strip(), value.strip()
            if not eq or key not in SELECTOR_KEYS or not value:
                raise SelectorError(f"{RETRY_CELLS}: {pair!r} is not model=NAME or benchmark=NAME (cells are "
                                    "separated by ';', their keys by ',')")
            selector[key] = value
        selectors.append(selector)
    return tuple(selectors)


def selected(cell: CellPlan, selectors: Sequence[Mapping[str, str]]) -> bool:
    if not selectors:
        return True
    c = cell.cell
    return any(s.get("model", c.model) == c.model
               and names_cell(c, c.model, s.get("benchmark", c.benchmark)) for s in selectors)


def annotated_retry(store: Store, body: Mapping[str, Any], cells: Sequence[CellPlan],
                    now: datetime) -> tuple[dict[str, Any], EventNote] | None:
    """Handle a new `evalrun.io/retry` token against the cells of this pass: (the `.status` patch, the Event), or
    None without a new token."""
    meta = body["metadata"]
    annotations = meta.get("annotations") or {}
    token = annotations.get(RETRY)
    if not token or ((body.get("status") or {}).get("retry") or {}).get("token") == token:
        return None
    reason = annotations.get(RETRY_REASON, "")
    try:
        selectors = parse_cells(annotations.get(RETRY_CELLS, ""))
    except SelectorError as exc:
        return _handled(token, now, [], str(exc)), EventNote(type="Warning", reason="RetryNotRecorded",
                                                             message=clip(str(exc)))
    held = [c for c in cells if c.held and selected(c, selectors)]
    who = f"annotation {RETRY}={token} on {meta['namespace']}/{meta['name']}"
    for cell in held:
        for asked in retried(cell, cells):  # a sharded cell: its shards
            store.state.request_retry(RetryRequest(
                id=request_id(asked.evalrun, asked.key, token), cell_key=asked.key, evalrun=asked.evalrun,
                requested_by=who, requested_at=now, reason=reason))
    labels = [c.cell.label for c in held]
    if not labels:
        message = f"{RETRY}={token}: nothing to retry: no held cell" + (" matches " + RETRY_CELLS if selectors else "")
        note = EventNote(type="Warning", reason="NothingToRetry", message=clip(message))
    else:
        message = f"{RETRY}={token}: retry recorded for {len(labels)} held cell(s): {', '.join(labels)}" \
                  + (f" ({reason})" if reason else "") + "; the next pass releases each once"
        note = EventNote(type="Normal", reason="RetryRequested", message=clip(message))
    log.info("retry annotation handled", extra={"evalrun": f"{meta['namespace']}/{meta['name']}", "note": message})
    return _handled(token, now, labels, message), note


def release_hints(status: dict[str, Any], cells: Sequence[CellPlan], meta: Mapping[str, Any]) -> dict[str, Any]:
    """`status` with each held cell's attention item saying how to release it: the annotation, as a command."""
    held = {(c.cell.model, c.cell.benchmark) for c in cells if c.held}
    if not held:
        return status
    where = f"evalrun/{meta['name']} -n {meta['namespace']}"
    attention = [{**item, "release": f"kubectl annotate {where} --overwrite {RETRY}=<new token> "
                                     f"'{RETRY_CELLS}=model={item['model']},benchmark={item['benchmark']}'"}
                 if (item["model"], item["benchmark"]) in held else item for item in status.get("attention", [])]
    return {**status, "attention": attention}


def _handled(token: str, now: datetime, cells: list[str], message: str) -> dict[str, Any]:
    return {"retry": {"token": token, "handledAt": now.strftime("%Y-%m-%dT%H:%M:%SZ"), "cells": cells,
                      "message": clip(message)}}
