"""How much of a read a pass hands back (whole lines), and a failed job's tail: the helpers both schedulers share."""

from __future__ import annotations

import pytest

from controller.adapters.scheduler.output import consumed, failure_tail, job_output
from controller.adapters.secrets import SecretMask


@pytest.mark.parametrize(("raw", "capped", "taken"), [
    (b"one\ntwo\n", False, 8),
    (b"one\ntwo\npart", False, 8),  # the line being written waits for the next pass
    (b"10%\r20%\r3", False, 8),  # a progress bar's carriage returns end lines too
    (b"no line end yet", False, 0),
    (b"a line as long as the cap", True, 25),  # nothing would ever end it: it is handed back cut
    ("caf\u00e9".encode()[:-1], True, 3),  # ...but never in the middle of a character
    ("\u20ac".encode()[:2], True, 0),
    ("\U0001f600".encode(), True, 4),
    (b"", False, 0),
])
def test_a_read_hands_back_whole_lines(raw: bytes, capped: bool, taken: int) -> None:
    assert consumed(raw, capped) == taken


def test_offsets_count_raw_bytes_whatever_masking_and_decoding_do_to_the_text() -> None:
    raw = b"key tok-0123456789 ok \xff\xfe\n"
    out = job_output("7", 100, raw, cap=1 << 20, mask=SecretMask(["tok-0123456789"]))
    assert (out.job_id, out.offset, out.end) == ("7", 100, 100 + len(raw))
    assert out.text == "key *** ok \ufffd\ufffd\n"


def test_a_failed_jobs_tail_keeps_its_last_lines_and_a_short_reason_both_masked() -> None:
    text = "\n".join(f"line {i}" for i in range(100)) + "\n\nTraceback: token tok-0123456789 refused\n\n"
    reason, tail = failure_tail(text, SecretMask(["tok-0123456789"]), whole=True)
    assert tail == "\n".join([*(f"line {i}" for i in range(39, 100)), "", "Traceback: token *** refused", ""])
    assert reason == "line 96 | line 97 | line 98 | line 99 | Traceback: token *** refused"


def test_a_tail_that_starts_inside_a_line_drops_it_so_no_half_secret_shows() -> None:
    reason, tail = failure_tail("56789 (the end of a secret)\nnext line\n", SecretMask(["tok-0123456789"]), whole=False)
    assert (reason, tail) == ("next line", "next line")


def test_a_withheld_tail_keeps_the_notice_whole() -> None:
    mask = SecretMask(unavailable=[f"set EVALCTL_SECRET_PINGGY_{i}_TOKEN (pinggy pair {i})" for i in range(20)])
    reason, tail = failure_tail("Killed\n", mask, whole=True)
    assert reason == tail and reason.startswith("(job output withheld") and reason.endswith("log file)")
