"""Running the run-dir probe (`probe`) on a login node, over the cluster's own command runner (ssh, multiplexed).

The program sent is a small bootstrap and the sources of `localfs`, `harbor_format` and `probe`, executed as
modules of their own names: the login node runs the very code this process reads local dirs with. Its version is
a digest of those sources, sent with the program and checked in the answer. Whatever goes wrong — the command
fails or times out, `python` is missing or too old, the answer is cut short, does not decode or is of another
version — is an `ObservationError`: the cluster's cells are Unknown, never "no run dir".
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from controller.adapters.scheduler.commands import CommandFailed, CommandRunner
from controller.core.ports import JobsDirMissing, ObservationError
from controller.core.types import RUN_TAG_PREFIX

MODULES = ("localfs", "harbor_format", "probe")  # in import order
PACKAGE = "controller.adapters.rundirs"
MIN_PYTHON = (3, 9)
SCAN_BATCH = 256  # run dirs per probe call that are not known finished: a cold one answers ~100 trial outcomes
PARALLEL_CALLS = 2  # batches in flight at once (sessions of one ssh master): the login node reads while we decode
TIMEOUT_S = 300.0  # one probe call, a batch of cold run dirs on a slow file system included
_BOOTSTRAP = """\
import json, sys, types
VERSION = {version!r}
if sys.version_info < {min_python!r}:
    sys.stdout.write(json.dumps({{"probe": VERSION, "python": sys.version.split()[0]}}))
    raise SystemExit(0)
SOURCES = {sources!r}
for package in ("controller", "controller.adapters", {package!r}):
    sys.modules[package] = types.ModuleType(package)
    sys.modules[package].__path__ = []
for name in {modules!r}:
    module = sys.modules[{package!r} + "." + name] = types.ModuleType({package!r} + "." + name)
    exec(compile(SOURCES[name], module.__name__, "exec"), module.__dict__)
sys.modules[{package!r} + ".probe"].main({request!r}, VERSION)
"""

Json = dict[str, Any]


@functools.cache
def _sources() -> tuple[dict[str, str], str]:
    here = Path(__file__).parent
    sources = {name: (here / f"{name}.py").read_text() for name in MODULES}
    return sources, hashlib.sha256(json.dumps(sources, sort_keys=True).encode()).hexdigest()[:16]


def program(request: Json) -> str:
    sources, version = _sources()
    return _BOOTSTRAP.format(version=version, min_python=MIN_PYTHON, sources=sources, package=PACKAGE,
                             modules=MODULES, request=json.dumps(request))


class RunDirProbe:
    """The probe of one login node, `host` (the cluster's `scheduler.ssh`, which its commands reach); `python`: its
    interpreter (`scheduler.python`)."""

    def __init__(self, commands: CommandRunner, host: str, python: str = "python3", *,
                 timeout_s: float = TIMEOUT_S) -> None:
        self.commands, self.host, self.python, self.timeout_s = commands, host, python, timeout_s

    def run_tags(self, jobs_dir: str) -> list[str]:
        answer = self._call({"op": "list", "jobs_dir": jobs_dir, "prefix": RUN_TAG_PREFIX})
        if answer.get("missing"):
            raise JobsDirMissing(f"jobs dir {jobs_dir} on {self.host} does not exist")
        tags = answer.get("run_tags")
        if not isinstance(tags, list) or not all(isinstance(tag, str) for tag in tags):
            raise ObservationError(f"the run-dir probe on {self.host} answered no run tags")
        return tags

    def scan(self, jobs_dir: str, known: Mapping[str, Json]) -> dict[str, Json]:
        """Each run dir's answer (see `probe.scan`), in batches, `PARALLEL_CALLS` at a time."""
        batches = list(_batches(known))
        if not batches:
            return {}
        with ThreadPoolExecutor(min(PARALLEL_CALLS, len(batches))) as pool:
            answers = list(pool.map(lambda batch: self._call({"op": "scan", "jobs_dir": jobs_dir, "runs": batch}),
                                    batches))
        runs: dict[str, Json] = {}
        for batch, answer in zip(batches, answers, strict=True):
            got = answer.get("runs")
            if not isinstance(got, dict) or set(got) != set(batch):
                raise ObservationError(f"the run-dir probe on {self.host} did not answer for every run dir asked")
            runs.update(got)
        return runs

    def _call(self, request: Json) -> Json:
        try:
            result = self.commands.run([self.python, "-"], stdin=program(request), timeout=self.timeout_s)
        except CommandFailed as exc:
            raise ObservationError(f"the run-dir probe on {self.host} could not run: {exc}") from exc
        if result.returncode == 127:
            raise ObservationError(f"{self.python} was not found on {self.host}: set scheduler.python to the login "
                                   f"node's Python {'.'.join(map(str, MIN_PYTHON))} or later")
        if result.returncode != 0:
            said = result.stderr.strip().splitlines()[-1:] or [f"exit {result.returncode}"]
            raise ObservationError(f"the run-dir probe on {self.host} failed: {said[0][:300]}")
        try:
            answer = json.loads(result.stdout)
        except ValueError as exc:
            raise ObservationError(f"the run-dir probe's answer from {self.host} does not decode (cut short?): "
                                   f"{exc}") from None
        version = _sources()[1]
        if not isinstance(answer, dict) or answer.get("probe") != version:
            got = answer.get("probe") if isinstance(answer, dict) else None
            raise ObservationError(f"the run-dir probe on {self.host} answered as version {got!r}, not {version}")
        if "python" in answer:
            raise ObservationError(f"{self.python} on {self.host} is Python {answer['python']}: the run-dir probe "
                                   f"needs {'.'.join(map(str, MIN_PYTHON))} or later (set scheduler.python)")
        if "error" in answer:
            raise ObservationError(f"the run-dir probe on {self.host} failed: {str(answer['error'])[:300]}")
        return answer


def _batches(known: Mapping[str, Json]) -> Iterator[dict[str, Json]]:
    """Batches that each hold at most SCAN_BATCH run dirs not known finished (those answer `same` in a few bytes)."""
    batch: dict[str, Json] = {}
    unknown = 0
    for tag, state in known.items():
        batch[tag] = state
        unknown += state.get("finished") is None
        if unknown >= SCAN_BATCH:
            yield batch
            batch, unknown = {}, 0
    if batch:
        yield batch
