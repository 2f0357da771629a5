"""Where a command's store is, whatever the working directory (docs/DECISIONS.md, "The store follows the spec").

Precedence: `--store` > `$EVALCTL_STORE` > next to the spec (`<spec dir>/.evalctl/store.db`, as every other relative
path of a spec resolves). A relative `sqlite:///` path given as a flag or in the environment resolves against the
working directory, as any path on a command line does. The URL a command used is printed as its first stderr line,
its password masked.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from controller.adapters.store import DEFAULT_STATE_FOR_SUPABASE, SQLITE_PREFIX, SUPABASE_SCHEMES, redact
from controller.adapters.store.sqlite_session import MEMORY

STORE_ENV, STATE_ENV = "EVALCTL_STORE", "EVALCTL_STATE"
STORE_FILE = Path(".evalctl") / "store.db"  # under the spec's directory
STATE_FILE = Path(DEFAULT_STATE_FOR_SUPABASE.removeprefix(SQLITE_PREFIX))  # with supabase://, beside STORE_FILE
_QUERY_PASSWORD = re.compile(r"(?i)(password=)[^&\s]*")


class NoDefaultStore(ValueError):
    """No store named and no single spec directory to find it in: bad input (exit 2), with the fix."""


def spec_home(files: tuple[Path, ...]) -> Path:
    """The directory the default store lives in: the directory given with -f, or the spec file's. Specs from
    several directories have no one home: refused, so two commands never pick two stores."""
    if not files:
        raise NoDefaultStore(f"no store named: this command reads no spec, so pass --store URL or set ${STORE_ENV}")
    homes = sorted({str(f.resolve() if f.is_dir() else f.resolve().parent) for f in files})
    if len(homes) > 1:
        raise NoDefaultStore(f"the specs are in {len(homes)} directories ({', '.join(homes)}): the default store lives "
                             f"next to the spec, so name one with --store URL or ${STORE_ENV} (or pass one -f "
                             "directory that holds them all)")
    return Path(homes[0])


def store_url(given: str | None, files: tuple[Path, ...]) -> tuple[str, str]:
    """(the results DB's URL, where it came from: `--store`, `$EVALCTL_STORE` or `next to the spec`)."""
    if given:
        return absolute(given), "--store"
    if env := os.environ.get(STORE_ENV):
        return absolute(env), f"${STORE_ENV}"
    return SQLITE_PREFIX + str(spec_home(files) / STORE_FILE), "next to the spec"


def state_url(given: str | None, results: str, files: tuple[Path, ...]) -> str | None:
    """The controller state's URL; None: in the results DB. Beside a `supabase://` results DB (which holds only the
    lab's tables) it defaults to a SQLite file next to the spec, or, with no spec, the adapter's default."""
    if chosen := given or os.environ.get(STATE_ENV):
        return absolute(chosen)
    if results.startswith(SUPABASE_SCHEMES) and files:
        return SQLITE_PREFIX + str(spec_home(files) / STATE_FILE)
    return None


def absolute(url: str) -> str:
    """A relative SQLite path made absolute against the working directory; other URLs as they are."""
    path = sqlite_path(url)
    if path is None or Path(path).is_absolute():
        return url
    return SQLITE_PREFIX + os.path.normpath(Path.cwd() / path)


def sqlite_path(url: str) -> str | None:
    """The file a `sqlite:///` URL names; None for other URLs and `:memory:`."""
    path = url.removeprefix(SQLITE_PREFIX)
    return path if url.startswith(SQLITE_PREFIX) and path and path != MEMORY else None


def missing_file(url: str) -> str | None:
    """The path of a SQLite store that does not exist yet; None when it exists or is not a file."""
    path = sqlite_path(url)
    return path if path is not None and not os.path.lexists(path) else None


def shown(url: str) -> str:
    """The URL as output may show it: no password, in the authority or in the query."""
    return _QUERY_PASSWORD.sub(r"\1***", redact(url))
