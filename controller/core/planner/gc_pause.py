"""The planner's objects form no reference cycles: reference counting frees all of them. A pass over 10,000 cells
allocates a few hundred thousand, enough to trip the cyclic collector's full pass over the whole process heap
(~250 ms over the bench's fleets) that finds nothing of the planner's to free. `cyclic_gc_paused` holds that
collector off while a plan is made, and gives it back as it was (nested and concurrent plans included)."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_depth = 0
_was_enabled = False


@contextmanager
def cyclic_gc_paused() -> Iterator[None]:
    global _depth, _was_enabled
    with _lock:
        if _depth == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _was_enabled:
                gc.enable()
