"""MLflow as the `Tracker`: one run per cell attempt, found again by its run tag and never duplicated.

On the server: experiment <name> (created when missing) → one run named <run tag>, tagged
`evalrun.run_tag=<run tag>` and `evalrun.<key>` for each record tag; params as params; metrics at step 0
(the newest value is the run's, so a re-analysis replaces what dashboards show); the report as the
artifact `post_eval_report.txt`; the run left FINISHED. Re-analysis attaches to the same run (RULES §5).

Params are immutable in MLflow: logging a param again with the same value is a no-op, a different value is
refused (INVALID_PARAMETER_VALUE) and the whole batch with it. A re-analysis with changed settings (max
retries ×2, another browser backend) keeps the first value as the param and records the new one as tag
`evalrun.param.<name>`; `read_back` reports that tag's value as the param, i.e. what the LAST analysis used,
which is what the core compares against what it logged. No logged value is ever deleted or rewritten.

`log` returning proves nothing: a proxy or rate limiter can answer 200 and drop the write (RULES §5,
"verify, don't trust exit codes"). `read_back` reads the server afresh so the core can compare.

Timeouts: mlflow's HTTP client retries 7 times with exponential backoff (minutes) and waits 120 s per request
by default, and 3.17 has no per-client knob: it reads MLFLOW_HTTP_REQUEST_TIMEOUT / _MAX_RETRIES /
_BACKOFF_FACTOR from the environment at every request. The constructor sets those that are unset, so a stopped
server fails in about 3 s; values the operator exported win, and the first tracker of a process sets them for
every tracker (and any other mlflow use) in it. Messages state the effective values. It also forces
MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT: mlflow otherwise prints each finished run's URL, password included.

Credentials: the tracker's own (`credentials`, from an EvalRun's or EvalCluster's Secret), else the tracking URI's
user:password@, else MLFLOW_TRACKING_USERNAME/PASSWORD/TOKEN of the environment. mlflow reads those names at every
request, tracking and artifact calls alike, through its `_EnvironmentVariable` objects (and a username/password
from ~/.mlflow/credentials), and has no per-client setting. `_install_call_hooks` makes the three objects
read the calling thread's credentials when the call has its own (and the file none then): each call runs on a
worker thread of its own, so calls of different trackers run at once and each request carries exactly its
tracker's login, never another server's, and the environment is never written. mlflow 3.17 makes the tracking and
artifact requests of one call on the calling thread (a test holds it to that). Credentials never reach a message:
URLs lose their userinfo, values are masked.

A tenant's server (`public_only`) is connected to only at an address checked when it is dialled, the same hook
on urllib3's `create_connection`: a name that resolved to a public address at the pass's check and to 127.0.0.1
now is refused (DNS rebinding).

Deadline and lanes: requests' timeout is per read, so a server that trickles its answer holds a call for as long
as it likes. Each `log` / `read_back` runs in a lane on a worker thread (adapters/lanes.py) and its caller gives up
after `deadline_s` in all (DEADLINE_S, 60 s: a run's metrics, params and report take a few requests of well under a
second each). A lane is one server for one namespace (`lane`, from the caller; default the server): an abandoned
call holds only its lane until the server lets go, so a tenant's slow server delays only that tenant's uploads.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any
from urllib.parse import unquote, urlsplit

import mlflow.utils.credentials as credentials_module
import urllib3.util.connection as urllib3_connection
from mlflow import MlflowClient
from mlflow.entities import Metric, Param, Run, RunTag
from mlflow.environment_variables import MLFLOW_TRACKING_PASSWORD, MLFLOW_TRACKING_TOKEN, MLFLOW_TRACKING_USERNAME
from mlflow.exceptions import MlflowException, RestException

from controller.adapters.dialing import dial_address
from controller.adapters.lanes import DeadlineExceeded, Lanes
from controller.core.ports import ObservationError, StoreUnavailable, TrackedRun, TrackerRecord

log = logging.getLogger("evalctl.tracker")

TAG_PREFIX = "evalrun."
RUN_TAG = f"{TAG_PREFIX}run_tag"
OWNER_TAG = f"{TAG_PREFIX}owner"  # the run tag names no user: two users' runs of one cell are told apart by this
PARAM_OVERRIDE = f"{TAG_PREFIX}param."  # a param's value from a later analysis (params are immutable)
REPORT_ARTIFACT = "post_eval_report.txt"
CREDENTIAL_ENV = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN")
SECRET_ENV = CREDENTIAL_ENV[1:]
TIMEOUT_ENV, RETRIES_ENV, BACKOFF_ENV = (
    "MLFLOW_HTTP_REQUEST_TIMEOUT", "MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR")
QUIET_ENV = "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"
BACKOFF_FACTOR = 1  # mlflow wants an int: sleeps 0 s, 2 s, 4 s … between attempts (its default 2 doubles that)
# log-batch limits of the REST API: 1000 metrics, 100 params, 100 tags, 1000 entities in all per request.
BATCH_METRICS, BATCH_PARAMS, BATCH_TAGS = 800, 100, 100
SEARCH_LIMIT = 100  # runs per run tag; more than one only after a race, so this is never reached
MESSAGE_MAX = 400

_ENV_LOCK = threading.Lock()
DEADLINE_S = 60.0  # one log or read_back in all, waiting for the lane included
_LANES = Lanes(DEADLINE_S)
_CALL = threading.local()  # .credentials: the MLFLOW_TRACKING_* of the tracker this thread calls for (None: none)
_USERINFO = re.compile(r"(?<=://)[^/\s]*@")  # up to the LAST @ of the authority: a password may hold one
_STATUS_RETRIES = re.compile(r"too many (\d{3}) error responses")
_REFUSED_ADDRESS = re.compile(r"(\S+ reaches \S+, an? [a-z -]+ address) when dialled")  # dialing.RefusedAddress
_STATUS_CODE = re.compile(r"error code (\d{3})")  # mlflow's "failed with error code 403 != 200. Response body: …"


class _Refused(Exception):
    """The server answered, but not in a way this adapter can log through (deleted experiment, no run id)."""


_FAILURES = (MlflowException, OSError, json.JSONDecodeError, _Refused)  # OSError covers requests' errors (and
# DeadlineExceeded, a TimeoutError)


class MlflowTracker:
    """`Tracker` on an MLflow tracking server, through its REST API (`MlflowClient`, no global mlflow state)."""

    def __init__(self, tracking_uri: str, *, timeout_s: float = 30.0, retries: int = 2,
                 credentials: Mapping[str, str] | None = None, deadline_s: float = DEADLINE_S,
                 lane: str | None = None, public_only: bool = False) -> None:
        """`timeout_s` per request and `retries` after the first attempt, unless MLFLOW_HTTP_REQUEST_* are set.
        `credentials`: values for CREDENTIAL_ENV names, replacing all three of the environment's in its calls.
        `lane`: whose calls wait for each other (default: every call to this server). `public_only`: a tenant's
        server, connected to only at an address the operator's policy allows when it is dialled."""
        unknown = set(credentials or {}) - set(CREDENTIAL_ENV)
        if unknown:
            raise ValueError(f"credentials: unknown names {sorted(unknown)}; expected some of {CREDENTIAL_ENV}")
        self._where = strip_credentials(tracking_uri)
        self._lane = lane or self._where
        self._public_only = public_only
        self._credentials = dict(credentials) if credentials is not None else None
        self.deadline_s = deadline_s
        self._secrets = _secrets(tracking_uri) + tuple(
            value for name, value in (credentials or {}).items() if name in SECRET_ENV)
        _configure_http(timeout_s, retries)
        try:
            self._client = MlflowClient(tracking_uri=tracking_uri)
        except MlflowException as exc:  # an unsupported scheme: its message repeats the URI, credentials included
            raise StoreUnavailable(self._one_line("cannot use this tracking URI", exc)) from None

    # ------------------------------------------------------------------ the port

    def log(self, experiment: str, record: TrackerRecord) -> str:
        """Find or create `record.owner`'s run tagged `record.run_tag`, log everything to it, mark it FINISHED; its id.

        Safe to repeat: the run is looked up by tag every time, params already stored are skipped, tags and
        metrics are overwritten. Raises `StoreUnavailable` (one line) when the server cannot be reached or
        refuses the write.
        """
        _check_tag_keys(record)
        def log_it() -> Run:
            with self._authenticated():
                run = self._run_for(self._experiment_for_writing(experiment), record.run_tag, record.owner)
                self._log_to(run, record)
            return run

        try:
            run = _LANES.call(self._lane, log_it, self.deadline_s)
        except _FAILURES as exc:
            raise StoreUnavailable(
                self._one_line(f"cannot log run {record.run_tag!r} in experiment {experiment!r}", exc)) from None
        return str(run.info.run_id)

    def read_back(self, experiment: str, run_tag: str, owner: str) -> TrackedRun | None:
        """`owner`'s run as the server holds it now (three fresh reads: experiment, runs, artifacts), or None if none.

        Speaks the record's vocabulary: `tags` are the record tags this adapter wrote (prefix removed), `params`
        the values of the latest analysis, `metrics` the latest value of each, `artifacts` the top-level paths.
        Raises `ObservationError` (one line) when the server cannot be read.
        """
        def read_it() -> TrackedRun | None:
            with self._authenticated():
                found = self._client.get_experiment_by_name(experiment)
                if found is None or found.lifecycle_stage == "deleted":
                    return None
                runs = self._runs_tagged(str(found.experiment_id), run_tag, owner)
                if not runs:
                    return None
                artifacts = tuple(sorted(info.path for info in self._client.list_artifacts(runs[0].info.run_id)))
            return _tracked(runs[0], artifacts)

        try:
            return _LANES.call(self._lane, read_it, self.deadline_s)
        except _FAILURES as exc:
            raise ObservationError(
                self._one_line(f"cannot read run {run_tag!r} in experiment {experiment!r}", exc)) from None

    @contextlib.contextmanager
    def _authenticated(self) -> Iterator[None]:
        """On the call's worker thread: mlflow's requests carry this tracker's credentials (or the environment's)
        and, for a tenant's server, connect only to checked addresses."""
        _CALL.credentials, _CALL.public_only = self._credentials, self._public_only
        try:
            yield
        finally:
            _CALL.credentials, _CALL.public_only = None, False

    # ------------------------------------------------------------------ steps

    def _experiment_for_writing(self, name: str) -> str:
        """The id of the live experiment `name`, created when missing."""
        found = self._client.get_experiment_by_name(name)
        if found is None:
            try:
                created = self._client.create_experiment(name)
            except RestException as exc:
                if exc.error_code != "RESOURCE_ALREADY_EXISTS":
                    raise
                found = self._client.get_experiment_by_name(name)  # another process created it meanwhile
                if found is None:
                    raise
            else:
                if not created:
                    raise _Refused("the server answered create-experiment without an id (a proxy dropping writes?)")
                return str(created)
        if found.lifecycle_stage == "deleted":
            raise _Refused(f"experiment {name!r} is deleted on the server; restore it "
                           "(mlflow experiments restore) or name another experiment")
        return str(found.experiment_id)

    def _runs_tagged(self, experiment_id: str, run_tag: str, owner: str) -> list[Run]:
        """`owner`'s live runs carrying `run_tag`, oldest first (ties broken by id, so racing writers agree). Another
        user's run of the same cell is another measurement, never logged to; a run without an owner was written
        before runs carried one, and is claimed by the first to log to it."""
        runs = self._client.search_runs([experiment_id], filter_string=tag_filter(RUN_TAG, run_tag),
                                        max_results=SEARCH_LIMIT, order_by=["attributes.start_time ASC"])
        exact = [run for run in runs if run.data.tags.get(RUN_TAG) == run_tag  # LIKE matches more, see tag_filter
                 and run.data.tags.get(OWNER_TAG, owner) == owner]
        exact.sort(key=lambda run: (run.info.start_time or 0, run.info.run_id))
        if len(exact) > 1:
            log.warning("%d MLflow runs carry run tag %r (an earlier race); using the oldest, %s",
                        len(exact), run_tag, exact[0].info.run_id)
        return exact

    def _run_for(self, experiment_id: str, run_tag: str, owner: str) -> Run:
        """`owner`'s run of `run_tag`, created if absent. Two writers racing both create one; both then pick the
        oldest and each deletes its own newer one, so one run remains."""
        runs = self._runs_tagged(experiment_id, run_tag, owner)
        if runs:
            return runs[0]
        created = self._client.create_run(experiment_id, tags={RUN_TAG: run_tag, OWNER_TAG: owner}, run_name=run_tag)
        if not created.info.run_id:
            raise _Refused("the server answered create-run without a run id (a proxy dropping writes?)")
        runs = self._runs_tagged(experiment_id, run_tag, owner)
        oldest = runs[0] if runs else created
        if oldest.info.run_id != created.info.run_id:
            self._client.delete_run(created.info.run_id)
            log.warning("another writer created MLflow run %s for run tag %r at the same time; logging to it and "
                        "deleting ours, %s", oldest.info.run_id, run_tag, created.info.run_id)
        return oldest

    def _log_to(self, run: Run, record: TrackerRecord) -> None:
        run_id = run.info.run_id
        stored_params, stored_tags = run.data.params, run.data.tags
        params: list[Param] = []
        tags = [RunTag(RUN_TAG, record.run_tag), RunTag(OWNER_TAG, record.owner),
                *(RunTag(TAG_PREFIX + k, v) for k, v in record.tags.items())]
        for name, value in record.params.items():
            if name not in stored_params:
                params.append(Param(name, value))
            elif stored_params[name] != value or PARAM_OVERRIDE + name in stored_tags:
                tags.append(RunTag(PARAM_OVERRIDE + name, value))  # immutable param: the new value goes here
        now_ms = int(time.time() * 1000)
        metrics = [Metric(name, float(value), now_ms, 0) for name, value in record.metrics.items()]
        for metric_batch, param_batch, tag_batch in _batches(metrics, params, tags):
            # synchronous: with MLFLOW_ENABLE_ASYNC_LOGGING set, a failed write would otherwise only be logged
            self._client.log_batch(run_id, metrics=metric_batch, params=param_batch, tags=tag_batch, synchronous=True)
        self._client.log_text(run_id, record.report, REPORT_ARTIFACT)
        self._client.set_terminated(run_id, "FINISHED")

    # ------------------------------------------------------------------ messages

    def _one_line(self, doing: str, exc: BaseException) -> str:
        """`MLflow at <uri without credentials>: <doing>: <why>; <what to check>`, masked, on one line."""
        text = self._masked(f"MLflow at {self._where}: {doing}: {self._reason(exc)}")
        return text if len(text) <= MESSAGE_MAX else text[: MESSAGE_MAX - 1] + "…"

    def _masked(self, text: str) -> str:
        """On one line, without userinfo, the tracker's and the environment's secrets masked."""
        text = _USERINFO.sub("", " ".join(text.split()))
        for secret in self._secrets + tuple(os.environ.get(name, "") for name in SECRET_ENV):
            if len(secret) >= 3:
                text = text.replace(secret, "***")
        return text

    def _reason(self, exc: BaseException) -> str:
        """Why, in words of this adapter: what a server answered (its body) is never quoted, only its status and
        the exception's class, since the URI may be a tenant's pointing anywhere (issue 27: a read-SSRF into
        status); the full text goes to the debug log, masked."""
        retries, timeout_s = _setting(RETRIES_ENV, 7), _setting(TIMEOUT_ENV, 120)  # as mlflow read them (defaults)
        attempts = f"{retries + 1} attempt{'s' if retries else ''}"
        message = str(exc)
        log.debug("MLflow call failed: %s", self._masked(f"{type(exc).__name__}: {message}"))
        if isinstance(exc, RestException):  # the server answered with an error of its own
            denied = exc.error_code in ("UNAUTHENTICATED", "PERMISSION_DENIED")
            hint = "; check the credentials (MLFLOW_TRACKING_USERNAME/PASSWORD/TOKEN)" if denied else ""
            # error_code is one of mlflow's own names (it maps any other to INTERNAL_ERROR), never the server's text
            return f"answered {exc.error_code} (RestException){hint}"
        if isinstance(exc, _Refused):
            return message
        if isinstance(exc, DeadlineExceeded):
            return f"{message} (the deadline of one call); check that the server is up and not overloaded"
        if refused := _REFUSED_ADDRESS.search(message):
            return (f"not dialled: {refused.group(1)} when dialled; a tenant's tracking server must be on a public "
                    "address, or under the admin's --allowed-mlflow-uri")
        if status_code := _STATUS_RETRIES.search(message):
            return f"answered HTTP {status_code.group(1)} to {attempts}; check the server's log"
        if "connection refused" in message.lower() or "failed to establish" in message.lower():
            return f"unreachable ({attempts}, connection refused); check that the server is running on that address"
        if "timeout" in message.lower() or "timed out" in message.lower():
            return f"no answer within {timeout_s} s ({attempts}); check that the server is up and not overloaded"
        if isinstance(exc, json.JSONDecodeError):
            return "answered with something that is not JSON (a proxy or login page in between?)"
        if status_code := _STATUS_CODE.search(message):
            return f"answered {status_code.group(1)} ({type(exc).__name__})"
        return f"failed ({type(exc).__name__}; the detail is in the debug log)"


# ---------------------------------------------------------------------- helpers


def _install_call_hooks() -> None:
    """mlflow's credential variables read the calling thread's tracker credentials when it has its own (unset
    names: none, and nothing from ~/.mlflow/credentials), else the environment as before; urllib3's connections
    of a `public_only` call go to an address checked as it is dialled (adapters/dialing.py). Once per process."""
    if getattr(credentials_module, "_evalctl_per_call", False):
        return
    for variable in (MLFLOW_TRACKING_USERNAME, MLFLOW_TRACKING_PASSWORD, MLFLOW_TRACKING_TOKEN):
        variable.get_raw = functools.partial(_call_value, variable.name, variable.get_raw)  # type: ignore[method-assign]
    from_file = credentials_module._read_mlflow_creds_from_file
    credentials_module._read_mlflow_creds_from_file = lambda: (
        (None, None) if getattr(_CALL, "credentials", None) is not None else from_file())
    connect = urllib3_connection.create_connection
    urllib3_connection.create_connection = functools.partial(_checked_connection, connect)
    credentials_module._evalctl_per_call = True  # type: ignore[attr-defined]


def _call_value(name: str, environment: Callable[[], str | None]) -> str | None:
    own = getattr(_CALL, "credentials", None)
    return environment() if own is None else own.get(name)


def _checked_connection(connect: Callable[..., socket.socket], address: tuple[str, int], *args: Any,
                        **kwargs: Any) -> socket.socket:
    if not getattr(_CALL, "public_only", False):
        return connect(address, *args, **kwargs)
    host, port = address
    return connect((dial_address(host, port), port), *args, **kwargs)


_install_call_hooks()


def strip_credentials(uri: str) -> str:
    """The URI without user:password@, for messages and logs."""
    return _USERINFO.sub("", uri)


def tag_filter(key: str, value: str) -> str:
    """A search filter matching tag `key` = `value`. MLflow's filter grammar has no escapes: a value is quoted
    with whichever quote it lacks; one holding both is matched with LIKE, quotes as `_` (callers re-check)."""
    if "'" not in value:
        return f"tags.`{key}` = '{value}'"
    if '"' not in value:
        return f'tags.`{key}` = "{value}"'
    return f"tags.`{key}` LIKE '{value.replace(chr(39), '_').replace(chr(34), '_')}'"


def _configure_http(timeout_s: float, retries: int) -> None:
    """Set mlflow's HTTP timeout, retries and backoff for this process where unset."""
    wanted = {TIMEOUT_ENV: str(max(1, math.ceil(timeout_s))), RETRIES_ENV: str(max(0, retries)),
              BACKOFF_ENV: str(BACKOFF_FACTOR)}
    with _ENV_LOCK:
        for name, value in wanted.items():
            os.environ.setdefault(name, value)
        # set_terminated otherwise writes "🏃 View run … at: <tracking URI>" to stdout: credentials included, and
        # in the middle of whatever the CLI prints there (plan -o json). Forced, whatever the environment says.
        os.environ[QUIET_ENV] = "true"


def _setting(name: str, default: int) -> int:
    """One of mlflow's integer HTTP settings as it reads them, for messages."""
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


def _secrets(uri: str) -> tuple[str, ...]:
    """The password in the URI, raw and decoded, to mask wherever it might still appear."""
    try:
        password = urlsplit(uri).password
    except ValueError:
        return ()
    return tuple({password, unquote(password)}) if password else ()


def _check_tag_keys(record: TrackerRecord) -> None:
    """Record tags share the `evalrun.` namespace with the run tag and param overrides; keep them apart."""
    clashes = [key for key in record.tags if TAG_PREFIX + key == RUN_TAG or (TAG_PREFIX + key).startswith(PARAM_OVERRIDE)]
    if clashes:
        raise ValueError(f"record tags {clashes} clash with the tracker's own tags ({RUN_TAG}, {PARAM_OVERRIDE}*)")


def _batches(metrics: Sequence[Metric], params: Sequence[Param],
             tags: Sequence[RunTag]) -> Iterator[tuple[Sequence[Metric], Sequence[Param], Sequence[RunTag]]]:
    """Slices within the REST API's per-request limits; usually one."""
    while metrics or params or tags:
        yield metrics[:BATCH_METRICS], params[:BATCH_PARAMS], tags[:BATCH_TAGS]
        metrics, params, tags = metrics[BATCH_METRICS:], params[BATCH_PARAMS:], tags[BATCH_TAGS:]


def _tracked(run: Run, artifacts: tuple[str, ...]) -> TrackedRun:
    ours = {key.removeprefix(TAG_PREFIX): value for key, value in run.data.tags.items() if key.startswith(TAG_PREFIX)}
    overrides = {key.removeprefix("param."): value for key, value in ours.items() if key.startswith("param.")}
    tags = {key: value for key, value in ours.items() if key not in ("run_tag", "owner") and not key.startswith("param.")}
    return TrackedRun(run_id=run.info.run_id, tags=tags, params={**run.data.params, **overrides},
                      metrics=dict(run.data.metrics), artifacts=artifacts)
