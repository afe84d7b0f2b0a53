"""Hermetic workers: each task in a process of its own with address-space randomization off, a fixed minimal
environment, a fixed hash seed and a fixed working directory (Linux): a child forked by a build server that did its
imports and nothing else (executors.worker), or a fresh process.

Why: TensorRT-RTX numbers what it generates (`__mye3107`) after memory addresses and thread interleaving, so two
builds of one network in two ordinary processes give engines that differ in that numbering. With the addresses
fixed (personality(ADDR_NO_RANDOMIZE), what `setarch -R` does) and nothing else varying between processes, most
builds give the same bytes (measured: README, Reproducible builds). Even the lengths of the paths a process
handles move its allocations, so the worker runs in a fixed slot folder (`/tmp/trtflow-hermetic-<uid>/<n>`, one
per concurrent worker) with its inputs linked there under fixed names, and an identical command line. A process per
task (forked from the same state, or fresh) also means no state left by earlier builds. Elsewhere, or where the
kernel refuses, the task runs in an ordinary process and the record says `hermetic: no (<reason>)`.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from trtflow.errors import TrtflowError
from trtflow.executors import StageResult, StageTask
from trtflow.executors.worker import RESULT_FILE, TASK_FILE
from trtflow.stages.modelfile import FILE_NAMES
from trtflow.util.fs import check_private, private_dir, read_private
from trtflow.util.proc import die_with_parent
from trtflow.util.settings import Settings
from trtflow.util.slots import free_slot
from trtflow.util.text import clipped

ADDR_NO_RANDOMIZE = 0x0040000
RESULT_MAX_BYTES = 64 << 20


def unavailable_reason() -> str | None:
    """Why address-space randomization cannot be switched off for a child here, or None."""
    if not sys.platform.startswith("linux"):
        return f"{sys.platform} has no personality(ADDR_NO_RANDOMIZE)"
    libc = ctypes.CDLL(None, use_errno=True)
    current = libc.personality(0xFFFFFFFF)  # query without changing
    if current == -1:
        return f"personality() failed: errno {ctypes.get_errno()}"
    return None


def _no_aslr() -> None:
    """In the child, before exec: turn off address-space randomization for the program it becomes; die with the run."""
    libc = ctypes.CDLL(None, use_errno=True)
    current = libc.personality(0xFFFFFFFF)
    libc.personality(current | ADDR_NO_RANDOMIZE)
    die_with_parent()


class SlotWorker(Protocol):
    """A process that runs one task placed in its slot folder (a fresh one, or a child a build server forks)."""

    @property
    def slot(self) -> Path:
        """The slot folder the task's inputs are linked into."""

    def run(self, task: StageTask) -> StageResult:
        """Run the task (already in the slot); its result, or its death as a failure."""


class SlotWorkers(Protocol):
    """Where hermetic tasks can run one after another (executors.forking.ForkServers)."""

    def server(self) -> contextlib.AbstractContextManager[SlotWorker]:
        """A worker with a slot of its own for one task."""


class _FreshWorker(NamedTuple):
    """A fresh hermetic process per task, in a slot held for it (where no build server is available)."""

    slot: Path
    settings: Settings

    def run(self, task: StageTask) -> StageResult:
        """Run `task` (already in the slot) in a fresh hermetic process."""
        return _run_worker(task, self.slot, self.settings.hermetic_env(), hermetic_preexec())


@contextlib.contextmanager
def _fresh_worker(settings: Settings) -> Iterator[_FreshWorker]:
    """A slot for one task in a fresh process."""
    with free_slot() as slot:
        yield _FreshWorker(slot, settings)


def hermetic_preexec() -> Any:
    """What a hermetic child runs before exec: ASLR off and die with the run, or only the latter where ASLR stays on."""
    return die_with_parent if unavailable_reason() else _no_aslr


def run_hermetic(task: StageTask, settings: Settings, servers: SlotWorkers | None = None) -> StageResult:
    """Run one task hermetically in a free slot folder: in a child of one of `servers` (forked from a process that
    did its imports), or in a fresh process; its outputs are moved back to its work dir."""
    try:
        with servers.server() if servers is not None else _fresh_worker(settings) as worker:
            result = worker.run(task_in_slot(task, worker.slot))
            if result.record is not None:
                result.record["hermetic"] = description(unavailable_reason(), settings, forked=servers is not None)
            if result.files is not None:
                moved = {name: shutil.move(path, task.workdir / Path(path).name) for name, path in result.files.items()}
                result = dataclasses.replace(result, files={name: str(path) for name, path in moved.items()})
    except TrtflowError as exc:
        return StageResult.failure(str(exc), exc.exit_code)
    except OSError as exc:  # the slot folder could not be made or filled
        return StageResult.failure(f"hermetic worker could not start: {exc}", errno=exc.errno)
    return result


def task_in_slot(task: StageTask, slot: Path) -> StageTask:
    """The task with every input file linked into the slot under a fixed name, and the slot's work folder.

    A hermetic stage reads its inputs' files and digests, not their records: a record holds text that differs from
    run to run (a tool's log), and whatever the worker process reads moves its allocations."""
    inputs = {}
    for role, upstream in task.inputs.items():
        folder = slot / "in" / role.replace("/", "_").replace(":", "_")
        folder.mkdir(parents=True)
        files = {}
        for name, path in upstream.files.items():
            files[name] = folder / FILE_NAMES.get(name, name)
            os.symlink(os.path.abspath(path), files[name])
        inputs[role] = dataclasses.replace(upstream, files=files, record={})  # records hold run-specific text (logs)
    (slot / "work").mkdir()
    return dataclasses.replace(task, inputs=inputs, workdir=slot / "work")


def run_isolated(task: StageTask) -> StageResult:
    """Run one task in a fresh ordinary process (the user's environment, its own work dir): a stage that runs user
    code (a torch factory) cannot take the run down, and when it dies, the message says how and in what."""
    with private_dir("trtflow-worker-") as channel:  # not the work dir: the store's tmp/ is writable by others
        return _run_worker(task, task.workdir, Settings.pinned_env(), die_with_parent, channel)


def _run_worker(task: StageTask, folder: Path, env: dict | None, prepare, channel: Path | None = None) -> StageResult:
    """`python -m trtflow.executors.worker` in `folder` on the task pickled in the private folder `channel` (the slot
    itself if None); its death becomes a one-line failure."""
    channel = channel or folder
    write_task(channel / TASK_FILE, task)
    files = [TASK_FILE, RESULT_FILE] if channel == folder else [str(channel / TASK_FILE), str(channel / RESULT_FILE)]
    command = [sys.executable, "-m", "trtflow.executors.worker", *files]
    done = subprocess.run(
        command, env=env, cwd=folder, stdin=subprocess.DEVNULL, capture_output=True, text=True, preexec_fn=prepare
    )
    return worker_result(task, channel, done.returncode, done.stderr)


def write_task(path: Path, task: StageTask) -> None:
    """Pickle the task for the child into a private folder this process made (checked: 0700, this user's, real)."""
    check_private(path.parent)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as sink:
        sink.write(pickle.dumps(task))


def worker_result(task: StageTask, channel: Path, code: int, stderr: str) -> StageResult:
    """The JSON result a worker left in the private folder `channel`, or its death as a one-line failure."""
    try:
        data = json.loads(read_private(channel / RESULT_FILE, RESULT_MAX_BYTES)) if code == 0 else None
    except (OSError, ValueError, RecursionError):
        data = None
    result = StageResult.from_json(data) if data is not None else None
    if result is None:
        factory = getattr(task.params, "factory", None)
        inside = f" in source.torch.factory {factory} or the exporter" if factory else ""
        return StageResult.failure(
            f"the worker process of {task.node_id} died{inside}: {_exit_description(code)}: {_last_line(stderr)}",
            detail=stderr[-4000:],
        )
    return result


def description(reason: str | None, settings: Settings, forked: bool = False) -> str:
    """What the record says about how the stage ran."""
    process = "forked from a build server that did only its imports" if forked else "fresh process"
    if reason:
        return f"no ({reason}); {process}, minimal environment, PYTHONHASHSEED=0, fixed slot folder and names"
    passed = f", passed through: {', '.join(sorted(settings.passed_through))}" if settings.passed_through else ""
    return f"yes: {process}, ASLR off, minimal environment{passed}, PYTHONHASHSEED=0, fixed slot folder and names"


def _exit_description(code: int) -> str:
    """`exit 1`, or `killed by SIGSEGV` for a native crash."""
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit {code}"


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return clipped(lines[-1], 300) if lines else "no output"
