"""Hermetic workers: each task in a fresh process with address-space randomization off, a fixed minimal environment,
a fixed hash seed and a fixed working directory (Linux).

Why: TensorRT-RTX names its generated kernels (`__mye3107`) after memory addresses and thread interleaving, so two
builds of one network in two ordinary processes give engines that differ in those names. With the addresses fixed
(personality(ADDR_NO_RANDOMIZE), what `setarch -R` does) and nothing else varying between processes, the same
build gives the same bytes (measured: README, Reproducible builds). A fresh process per task also means no state
left by earlier builds. Elsewhere, or where the kernel refuses, the task runs in an ordinary fresh process and the
record says `hermetic: no (<reason>)`.
"""

from __future__ import annotations

import ctypes
import pickle
import signal
import subprocess
import sys
from typing import Optional

from trtflow.executors import StageResult, StageTask
from trtflow.util.settings import Settings

ADDR_NO_RANDOMIZE = 0x0040000
WORKING_DIRECTORY = "/"
TASK_FILE, RESULT_FILE = ".hermetic-task.pickle", ".hermetic-result.pickle"


def unavailable_reason() -> Optional[str]:
    """Why address-space randomization cannot be switched off for a child here, or None."""
    if not sys.platform.startswith("linux"):
        return f"{sys.platform} has no personality(ADDR_NO_RANDOMIZE)"
    libc = ctypes.CDLL(None, use_errno=True)
    current = libc.personality(0xFFFFFFFF)  # query without changing
    if current == -1:
        return f"personality() failed: errno {ctypes.get_errno()}"
    return None


def _no_aslr() -> None:
    """In the child, before exec: turn off address-space randomization for the program it becomes."""
    libc = ctypes.CDLL(None, use_errno=True)
    current = libc.personality(0xFFFFFFFF)
    libc.personality(current | ADDR_NO_RANDOMIZE)


def run_hermetic(task: StageTask, settings: Settings) -> StageResult:
    """Run one task in a fresh hermetic process (task and result travel as pickles in its own work directory)."""
    reason = unavailable_reason()
    task_file, result_file = task.workdir / TASK_FILE, task.workdir / RESULT_FILE
    task_file.write_bytes(pickle.dumps(task))
    command = [sys.executable, "-m", "trtflow.executors.worker", str(task_file), str(result_file)]
    done = subprocess.run(command, env=settings.hermetic_env(), cwd=WORKING_DIRECTORY, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, preexec_fn=None if reason else _no_aslr)
    if done.returncode != 0 or not result_file.is_file():
        return StageResult.failure(f"hermetic worker failed: {_exit_description(done.returncode)}: {_last_line(done.stderr)}",
                                   detail=done.stderr[-4000:])
    result: StageResult = pickle.loads(result_file.read_bytes())
    if result.record is not None:
        result.record["hermetic"] = _description(reason, settings)
    return result


def _description(reason: Optional[str], settings: Settings) -> str:
    """What the record says about how the stage ran."""
    if reason:
        return f"no ({reason}); fresh process, minimal environment, PYTHONHASHSEED=0, cwd {WORKING_DIRECTORY}"
    passed = f", passed through: {', '.join(sorted(settings.passed_through))}" if settings.passed_through else ""
    return f"yes: fresh process, ASLR off, minimal environment{passed}, PYTHONHASHSEED=0, cwd {WORKING_DIRECTORY}"


def _exit_description(code: int) -> str:
    """`exit 1`, or `killed by SIGSEGV` for a native crash."""
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit {code}"


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no output"
