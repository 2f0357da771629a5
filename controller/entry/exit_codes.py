"""What `evalctl`'s exit codes mean, and how a pass's results map to one (docs/DECISIONS.md, "Exit codes").

A cron job or CI step reads the code, a human reads stderr: each cause of a code >0 is one line there.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from controller.core.reconcile import PassResult

OK = 0  # every cell observed, every action done
ACTION_FAILED = 1  # an action (or the command itself) failed
BAD_INPUT = 2  # FILE:LINE:COL: what is wrong; nothing submitted, no row touched
UNOBSERVED = 3  # a cluster's queue, its run dirs or the store could not be read: its cells are Unknown
HELD = 4  # reconcile --until-done: every cell settled, some held for a human
TIMED_OUT = 5  # reconcile --until-done --timeout: time ran out with cells not settled

EPILOG = ("Exit codes: 0 every cell observed and every action done; 1 an action failed; 2 bad input "
          "(FILE:LINE:COL: …, nothing done); 3 a cluster's queue, its run dirs or the store could not be "
          "observed (one line per cause on stderr; `status` shows them too); with --until-done: 4 only held cells "
          "remain (see `evalctl retry`), 5 --timeout ran out; 128+N after signal N (130 SIGINT, 143 SIGTERM). "
          "The first stderr line names the store used.")


def unobserved_lines(results: Sequence[PassResult]) -> list[str]:
    """One line per source that could not be read (a cluster shared by EvalRuns is one cause, said once)."""
    return list(dict.fromkeys(f"evalctl: {u.line()}" for r in results for u in r.unobserved))


def tell_unobserved(results: Sequence[PassResult]) -> int:
    """Print each cause on stderr; UNOBSERVED if there is one, else OK."""
    lines = unobserved_lines(results)
    for line in lines:
        print(line, file=sys.stderr)
    return UNOBSERVED if lines else OK


def pass_code(results: Sequence[PassResult]) -> int:
    """An acting pass: a failed action is the most specific news (1), then a source not read (3; its cells were not
    acted on), then a pass the store refused to let act (1)."""
    if any(not o.ok for r in results for o in r.outcomes):
        return ACTION_FAILED
    if any(r.unobserved for r in results):
        return UNOBSERVED
    return ACTION_FAILED if any(r.blocked for r in results) else OK
