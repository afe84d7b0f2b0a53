"""Named points where the kill tests stop a run dead: with TRTFLOW_CRASH_AT=<point> in its environment, the process
SIGKILLs itself on reaching that point (nothing is flushed, nothing cleaned up: exactly a power cut or an OOM kill).
Unset, a point costs one dictionary lookup. Points: object-placed, package-extracted, package-swapped,
run-history-written (a run file's temp file written, not yet renamed), and write:<file name> (a durable write's temp
file is complete and fsynced, not yet renamed)."""

from __future__ import annotations

import os
import signal

ENV = "TRTFLOW_CRASH_AT"


def crash_point(name: str) -> None:
    """Die here, now, if the environment names this point."""
    if os.environ.get(ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)
