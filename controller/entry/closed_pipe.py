"""stdout whose reader may go away (`evalctl plan -o json | head -1`): the output is dropped from then on, quietly,
and the command goes on. A pass is never cut short by its reader, and its exit code stays its own."""

from __future__ import annotations

import os
from typing import Any, TextIO


class ClosedPipeTolerant:
    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._reader_gone = False

    def write(self, text: str) -> int:
        if not self._reader_gone:
            try:
                self._stream.write(text)
            except BrokenPipeError:
                self._drop_output()
        return len(text)

    def flush(self) -> None:
        if not self._reader_gone:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._drop_output()

    def _drop_output(self) -> None:
        """What is buffered, and the interpreter's own flush at exit, go to /dev/null instead of raising again."""
        self._reader_gone = True
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, self._stream.fileno())
        finally:
            os.close(devnull)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)
