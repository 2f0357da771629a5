"""Reading jobs' output files, shared by both schedulers: bounded reads on from an offset, and failed jobs' tails.

A read hands back whole lines only (a line still being written waits for the next pass), so a secret, a UTF-8
character or a log line the health rules match is never cut in two between passes; only a single line longer
than the cap is cut, at a character boundary. Offsets are raw bytes of the file, whatever masking does to the text.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager

from controller.adapters.secrets import SecretMask
from controller.core.observed import JobOutput

TAIL_LINES = 64  # a failed job's log tail: what its traceback or the node's complaint usually fits in
TAIL_BYTES = 16 << 10  # ...read as the file's last bytes: a progress bar's endless line cannot make it large
REASON_LINES = 5  # the short reason (status tables, hold reasons)
REASON_CHARS = 500

_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0)


def consumed(raw: bytes, capped: bool) -> int:
    """How many bytes of `raw` (read from a line start) to hand back now: up to its last line end.

    With no line end at all, nothing, unless the read filled the cap: then the whole line so far, minus a
    UTF-8 character cut short at its end.
    """
    cut = max(raw.rfind(b"\n"), raw.rfind(b"\r")) + 1
    if cut or not capped:
        return cut
    return len(raw) - _cut_character(raw)


def _cut_character(raw: bytes) -> int:
    """Bytes at the end of `raw` that start a UTF-8 character but do not finish it (0 to 3)."""
    for back in range(1, min(4, len(raw)) + 1):
        byte = raw[-back]
        if byte & 0xC0 != 0x80:  # not a continuation byte: the character's first byte (or ASCII)
            need = 2 if byte & 0xE0 == 0xC0 else 3 if byte & 0xF0 == 0xE0 else 4 if byte & 0xF8 == 0xF0 else 1
            return back if need > back else 0
    return 0


def job_output(job_id: str, start: int, raw: bytes, cap: int, mask: SecretMask) -> JobOutput:
    """One read's JobOutput: whole lines of `raw` (read at `start`), decoded with bad bytes replaced, masked."""
    take = consumed(raw, capped=len(raw) >= cap)
    return JobOutput(job_id=job_id, offset=start, end=start + take,
                     text=mask(raw[:take].decode("utf-8", errors="replace")))


def read_from(path: str, offset: int, cap: int) -> tuple[int, bytes] | None:
    """(where the read started, at most `cap` bytes) of a regular file; None when there is no such file.

    The read restarts at 0 when the file is shorter than `offset` (rotated or truncated). Other errors
    (permissions, I/O) raise OSError.
    """
    with _regular(path) as opened:
        if opened is None:
            return None
        fd, size = opened
        start = offset if 0 <= offset <= size else 0
        chunks, left, at = [], cap, start
        while left > 0:  # a regular file's pread is short only at its end, but a signal may cut one short
            chunk = os.pread(fd, left, at)
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
            at += len(chunk)
        return start, b"".join(chunks)


def read_tail(path: str) -> tuple[bytes, bool] | None:
    """(the last TAIL_BYTES of a regular file, whether that is all of it); None: no such file, or not a regular file."""
    with _regular(path) as opened:
        if opened is None:
            return None
        fd, size = opened
        start = max(size - TAIL_BYTES, 0)
        return os.pread(fd, TAIL_BYTES, start), start == 0


@contextmanager
def _regular(path: str) -> Iterator[tuple[int, int] | None]:
    """(fd, size) of a regular file, closed after; None when it is missing or not a regular file. O_NONBLOCK +
    fstat: a FIFO (or any non-regular file) in its place never blocks the pass, and is left out like a missing one."""
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except FileNotFoundError:
        yield None
        return
    try:
        st = os.fstat(fd)
        yield (fd, st.st_size) if stat.S_ISREG(st.st_mode) else None
    finally:
        os.close(fd)


def failure_tail(text: str, mask: SecretMask, *, whole: bool) -> tuple[str, str]:
    """(short reason, log tail) of a failed job's last output, both masked (then cut, so no secret is halved).

    `whole`: `text` is the whole file; otherwise its first line is a line's end, possibly a secret's, and dropped.
    The tail keeps the last TAIL_LINES lines as printed; the reason joins the last REASON_LINES non-blank ones
    with ' | ', as status tables show it.
    """
    lines = text.splitlines()[0 if whole else 1:][-TAIL_LINES:]
    shown = [line.strip() for line in lines if line.strip()][-REASON_LINES:]
    reason = mask(" | ".join(shown))
    withheld = mask("x") != "x"  # the mask's notice replaces any text: it is kept whole
    return reason if withheld else reason[-REASON_CHARS:], mask("\n".join(lines))
