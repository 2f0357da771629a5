"""The run-dir probe: what a pass needs of a jobs dir on a login node, read THERE, in one answer (issue 19).

Read over sftp, one run dir cost a round trip per file and per listing: 200 finished dirs × 100 trials took
~80 s on loopback, and 30 min to 2 h at the distances from a Kubernetes cluster to an HPC login node. This module,
with `localfs` and `harbor_format` (standard library only, Python 3.9+), is sent over the existing ssh connection
and run by the login node's `python3` (`RunDirProbe` in `remote`): nothing is installed there, and it reads with
the same code, bounds and fail-closed rules as a local pass.

The client says what it already knows; the answer carries only what changed:

- `list`: the jobs dir's run tags (or that it is missing);
- `scan`: per run dir, `{"same": true}` when its signature (the stat of the dir and its job files) is the one of
  the finished facts the client keeps; else the dir's job files (bytes), its marker, its first trial's config,
  and per trial: `known` (its result.json has the StatKey the client gave), its parsed outcome, `unreadable`
  (with why), or `none` (no result yet; with whether its agent/ holds anything).

A fault of one path is a value; any other error ends the answer as `{"error": ...}`, which the client makes the
cluster's observation unknown.
"""

from __future__ import annotations

import base64
import json
import os
import sys
from typing import Any, Optional

from controller.adapters.rundirs.harbor_format import FormatError, trial_outcome
from controller.adapters.rundirs.localfs import (
    AGENT_DIR,
    TOP_FILE_CAP,
    TRIAL_CONFIG,
    TRIAL_RESULT,
    TRIAL_RESULT_CAP,
    Content,
    StatKey,
    Unreadable,
    describe,
    has_entry,
    is_path_error,
    list_run,
    list_run_tags,
    read_file,
    read_local,
    signature,
)

Json = dict[str, Any]


def answer(request: Json) -> Json:
    root = request["jobs_dir"]
    if request["op"] == "list":
        try:
            return {"run_tags": list_run_tags(root, request["prefix"])}
        except FileNotFoundError:
            return {"missing": True}
    if request["op"] == "scan":
        return {"runs": {tag: scan(os.path.join(root, tag), known) for tag, known in request["runs"].items()}}
    raise ValueError(f"unknown op {request['op']!r}")


def scan(run: str, known: Json) -> Json:
    """One run dir against what the client knows of it. The signature is taken first, as a local pass does: a
    dir that changes while it is read is read again next pass."""
    sig = signature(run)
    if sig is not None and known.get("finished") is not None and _signature(known["finished"]) == sig:
        return {"same": True}
    try:
        listing = list_run(run)
    except OSError as exc:
        if not is_path_error(exc):
            raise
        return {"fault": describe(exc)}
    files = {name: _content(content) for name in listing.top_files
             if (content := read_local(os.path.join(run, name), TOP_FILE_CAP)[0]) is not None}
    trials = listing.trials
    config = read_local(os.path.join(run, trials[0], TRIAL_CONFIG), TRIAL_RESULT_CAP)[0] if trials else None
    known_trials = known.get("trials") or {}
    return {"signature": sig, "files": files, "no_resume": listing.no_resume,
            "trial_config": None if config is None else _content(config),
            "trials": [_trial(run, name, known_trials.get(name)) for name in trials]}


def _trial(run: str, name: str, known_key: Optional[list[int]]) -> list[Any]:
    """[name, kind, value, mtime, key, agent_active]."""
    recall = None if known_key is None else (lambda key: True if list(key) == known_key else None)
    read = read_file(os.path.join(run, name, TRIAL_RESULT), TRIAL_RESULT_CAP, recall)
    if read.known is not None:
        return [name, "known", None, read.mtime, read.key, False]
    if read.content is None:
        return [name, "none", None, None, None, has_entry(os.path.join(run, name, AGENT_DIR))]
    if isinstance(read.content, Unreadable):
        return [name, "unreadable", read.content.reason, None, read.key, False]
    try:
        outcome = trial_outcome(read.content)
    except FormatError as exc:
        return [name, "unreadable", str(exc), None, read.key, False]
    return [name, "outcome", list(outcome), read.mtime, read.key, False]


def _content(content: Content) -> list[str]:
    if isinstance(content, Unreadable):
        return ["unreadable", content.reason]
    return ["b64", base64.b64encode(content).decode("ascii")]


def _signature(value: list[Optional[list[int]]]) -> tuple[Optional[StatKey], ...]:
    return tuple(None if key is None else (key[0], key[1]) for key in value)


def main(request_text: str, version: str) -> None:
    """Print the answer to the request, as one JSON document, with the probe's version (what the client sent)."""
    try:
        body = answer(json.loads(request_text))
    except Exception as exc:  # anything: the client makes it the whole observation's failure
        body = {"error": f"{type(exc).__name__}: {exc}"}
    sys.stdout.write(json.dumps({"probe": version, **body}, separators=(",", ":")))
