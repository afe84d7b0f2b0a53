"""Process helpers for Linux: a child that dies with its parent, and a folder swap with no moment of absence.

Both fall back to the portable behaviour elsewhere (no death signal; a two-step rename).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from pathlib import Path

PR_SET_PDEATHSIG = 1
RENAME_EXCHANGE = 2
AT_FDCWD = -100


def die_with_parent() -> None:
    """In a worker (or a child before exec): be killed when the process that started it dies, so a killed run
    leaves no worker behind holding its output pipes (`trtflow run | tee` would hang). Ctrl-C, which a terminal sends
    to every process of the run, is the run's to handle: a worker ignores it (each printed a KeyboardInterrupt
    traceback) and ends with the run."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def exchange(a: Path, b: Path) -> bool:
    """Swap two existing paths atomically (renameat2 RENAME_EXCHANGE); False where the system cannot."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if not hasattr(libc, "renameat2"):
        return False
    done = libc.renameat2(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE)
    return done == 0
