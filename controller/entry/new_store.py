"""Before an acting pass creates a SQLite store, look for run dirs of ours it knows nothing about: their history is
in another store (an older evalctl kept it in the working directory), and the user should know before this one
starts a history of its own."""

from __future__ import annotations

from controller.api.loader import SpecSet
from controller.entry.shell import StoreURLs, dry_pass, error_line, results_url
from controller.entry.store_location import missing_file


def warn_of_a_new_store(specs: SpecSet, urls: StoreURLs) -> None:
    """With no store file yet, a dry pass (which creates nothing) reads the clusters' run dirs; when some are our
    cells' run tags, stderr says so. The pass goes on: a cell is judged by its run dir and the queue (RULES §2, §4),
    so no job is submitted twice; only the history (rows, fires, remedies) starts afresh."""
    path = missing_file(results_url(urls))
    if path is None:
        return
    tags = sorted({tag for result in dry_pass(specs, urls, missing_note=False) for tag in result.run_tags})
    if tags:
        error_line(f"evalctl: warning: a new store at {path}, but the jobs dir already holds {len(tags)} run dir(s) of "
                   f"these cells ({', '.join(tags[:3])}{', …' if len(tags) > 3 else ''}): their history is in another "
                   f"store. To go on with it, name it with --store or $EVALCTL_STORE, or move it to {path} (an older "
                   "evalctl kept it as .evalctl/store.db in the directory it ran from); this pass starts a new "
                   "history and judges those cells by their run dirs")
