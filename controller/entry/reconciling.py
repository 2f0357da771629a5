"""The acting passes of `evalctl reconcile`: one (`--once`, cron and CI), or pass after pass (`--loop`), each
sending its webhook messages and telling what it could not read."""

from __future__ import annotations

import time

from controller.adapters.process import identity_is_dead, process_identity
from controller.api.loader import SpecSet
from controller.core.reconcile import PassResult
from controller.core.store import Store
from controller.entry import render, retrying
from controller.entry.exit_codes import pass_code, tell_unobserved, unobserved_lines
from controller.entry.secrets import EnvironmentSecrets
from controller.entry.shell import FATAL, RETRY_MAX_S, StoreURLs, connect, error_line, one_line, one_pass, out
from controller.entry.until_done import Deadline, settled_end, timed_out
from controller.entry.webhooks import FLUSH_S, Notifier, webhooks_of


def reconcile_once(specs: SpecSet, urls: StoreURLs) -> int:
    """One acting pass; its exit code (exit_codes.pass_code) so cron and CI see a failed action or a source not
    read (the summary and stderr say which). Its messages are sent before it exits (for at most FLUSH_S; the rest
    wait for the next run)."""
    store = connect(urls, readonly=False)
    notifier = _notifier(urls)
    try:
        results = one_pass(specs, store, act=True)
        _notify(notifier, specs, flush=True)
    finally:
        store.close()
        notifier.close()
    render.pass_summary(results, out)
    tell_unobserved(results)
    return pass_code(results)


def reconcile_loop(specs: SpecSet, urls: StoreURLs, interval: float, *, until_done: bool, every_cell: bool,
                   deadline: Deadline | None = None) -> int:
    """Pass after pass until interrupted (or, with `until_done`, settled or past the `deadline`: its exit code).
    A failed action waits for the next pass; a pass that fails as a whole (store locked or unreachable, an I/O
    error) is retried with back-off and a freshly opened store, so a long-running reconciler outlives an outage.
    Each pass prints its line and what changed (`every_cell`, from -v: every decision, as --once does); the
    sources it could not read go to stderr when they change."""
    store: Store | None = None
    notifier = _notifier(urls)
    passes = failures = 0
    decided: render.Decisions = {}
    results: list[PassResult] | None = None
    unread: list[str] = []
    try:
        while True:
            passes += 1
            try:
                store = store or connect(urls, readonly=False)
                results = one_pass(specs, store, act=True)
                _notify(notifier, specs, flush=until_done and _settled(results))
            except FATAL:
                raise
            except (OSError, RuntimeError) as exc:
                failures += 1
                delay = min(interval * 2 ** failures, max(RETRY_MAX_S, interval))
                error_line(f"evalctl: pass {passes} failed: {one_line(exc)}; retrying in {delay:g}s")
                _close(store)
                store = None
                if deadline is not None and deadline.passed():
                    return _end(*timed_out(results, deadline))
                time.sleep(deadline.cap(delay) if deadline else delay)
                continue
            failures = 0
            decided = render.loop_summary(results, out, decided, every_cell=every_cell)
            if unobserved_lines(results) != unread:
                unread = unobserved_lines(results)
                tell_unobserved(results)
            if until_done and _settled(results):
                out.print(f"converged after {passes} pass(es)")
                for result in results:
                    render.status_grid(result, out, retrying.spec_args(urls.files, urls),
                                       retrying.store_args(urls.files, urls))
                return _end(*settled_end(results))
            if deadline is not None and deadline.passed():
                return _end(*timed_out(results, deadline))
            time.sleep(deadline.cap(interval) if deadline else interval)
    finally:
        _close(store)
        notifier.close()


def _end(code: int, line: str) -> int:
    if line:
        error_line(line)
    return code


def _close(store: Store | None) -> None:
    if store is not None:
        store.close()


def _notifier(urls: StoreURLs) -> Notifier:
    """The webhook sender, on a store of its own (its thread's); it starts only for EvalRuns with webhooks."""
    return Notifier(lambda: connect(urls, readonly=False), process_identity(), holder_is_dead=identity_is_dead)


def _notify(notifier: Notifier, specs: SpecSet, *, flush: bool) -> None:
    """Wake the sender with the webhooks as they are now; with `flush`, give the last messages FLUSH_S to go."""
    notifier.offer(webhooks_of(specs, EnvironmentSecrets()))
    if flush and not notifier.flush(FLUSH_S):
        error_line(f"evalctl: webhook messages still unsent after {FLUSH_S:g}s; the next run sends them")


def _settled(results: list[PassResult]) -> bool:
    """Nothing in flight: every cell Completed, Failed or held (a human's turn)."""
    return all(r.status.settled for r in results)
