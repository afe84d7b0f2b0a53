"""Keep what libraries print inside a stage out of the user's terminal, and in the stage's record instead.

Workers inherit the CLI's stdout and stderr, so a library that prints (torch's exporter reports progress,
onnx-graphsurgeon logs with print, onnxscript logs tracebacks it recovers from) would land in the middle
of `trtflow run --json`. Redirecting the file descriptors catches Python prints, logging handlers that
hold the original streams, and native code alike.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Iterator

KEEP_LINES = 40
ANSI_ESCAPES = re.compile(r"\x1b\[[0-9;]*m")  # colours some libraries write even when not on a terminal


@contextlib.contextmanager
def captured_output() -> Iterator[list[str]]:
    """Redirect fds 1 and 2 for the block; the yielded list holds the last KEEP_LINES non-empty lines afterwards."""
    lines: list[str] = []
    with tempfile.TemporaryFile(mode="w+b") as sink:
        sys.stdout.flush()
        sys.stderr.flush()
        saved = os.dup(1), os.dup(2)
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
        try:
            yield lines
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
            sink.seek(0)
            text = ANSI_ESCAPES.sub("", sink.read().decode("utf-8", errors="replace"))
            lines.extend([line.rstrip() for line in text.splitlines() if line.strip()][-KEEP_LINES:])
