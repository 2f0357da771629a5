"""Masking secrets out of text that comes from jobs (log tails) before anything keeps or shows it.

A job may print its own key. What reads that text (status, plan -o json, events, a dashboard) often runs
without the secrets, so masking at print time with "the secrets this process happens to hold" leaks; the
mask is built per cluster from every secret it references, and when one of them is not available here the
text is withheld rather than shown unmasked.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

SECRET_VARIABLES = "EVALCTL_SECRET_"
MIN_SECRET_LENGTH = 4  # shorter values would mask ordinary words; no real token is that short


class SecretMask:
    """Callable: text → the same text with every known secret value replaced by ***, or withheld."""

    def __init__(self, values: Iterable[str] = (), unavailable: Iterable[str] = ()) -> None:
        """`unavailable`: how to provide each referenced secret this process does not have."""
        held = {v for v in values if len(v) >= MIN_SECRET_LENGTH}
        held |= {v for k, v in os.environ.items() if k.startswith(SECRET_VARIABLES) and len(v) >= MIN_SECRET_LENGTH}
        self._values = sorted(held, key=len, reverse=True)  # longest first: a secret containing another
        self._unavailable = sorted(set(unavailable))

    def __call__(self, text: str) -> str:
        if not text:
            return text
        if self._unavailable:
            return ("(job output withheld: it cannot be masked without every secret its cluster references; "
                    f"{'; '.join(self._unavailable)}, or read the job's log file)")
        for value in self._values:
            text = text.replace(value, "***")
        return text
