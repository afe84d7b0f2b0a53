"""Fork servers: a process that did a stage kind's imports once forks one worker per task (`python -m
trtflow.executors.worker --serve ...`), so a stage costs a fork instead of a process start and its imports.

Two sorts:
- **hermetic** (builds): address-space randomization off, the minimal environment, a slot folder of its own
  (executors.hermetic), and the same fixed request every time, so every child starts from the same memory and the
  builder numbers what it generates the same way in every child;
- **plain** (cleanup and precision: the model tools): this process's environment with the hash seed and locale pinned,
  a slot folder of its own (`/tmp/trtflow-servers-<uid>/<n>`, emptied by its next user: a killed run leaves nothing
  there for good). A child runs the task where the task says and exits, and what the model tools left behind leaves
  with it: no stage is charged with an earlier stage's garbage (measured: a VGG-19's fp16 precision stage peaked at
  7.9 GB after its cleanup in the same pool worker, 5.6 GB alone), and a crash inside a tool ends one child. A request
  may name modules to import before forking (ModelOpt, when a reduced precision comes): the server keeps them for the
  children after; and modules to import while its child runs (ModelOpt again, named with the run's first task for this
  server when its plan has a reduced precision: the import overlaps that task). The model tools' servers of a run
  share a private folder, named in their environment (stages.shared_outputs: the fp32 outputs one precision stage
  computed for the recipe's others), removed when the run ends. Exports run user code (a torch
  factory) in a plain server of their own, which imports torch and its exporter at the first torch or Hugging Face
  export and nothing else: a child per export, whose crash names itself as a fresh process's did, for a fork instead
  of 5.4 s of imports.
Each server serves one task at a time; there is at most one per job and kind.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from trtflow.errors import EnvironmentProblem, TrtflowError
from trtflow.executors import StageResult, StageTask
from trtflow.executors.hermetic import hermetic_preexec, worker_result, write_task
from trtflow.executors.worker import GO, OUTPUT_FILE, TASK_FILE
from trtflow.stages import kinds_running_in, stage
from trtflow.util import early_server, servers
from trtflow.util.servers import BUILD_SERVER, TOOLS_SERVER, USER_CODE_SERVER
from trtflow.util.settings import Settings
from trtflow.util.slots import HERMETIC_SLOTS, PLAIN_SLOTS, SHARED_SLOTS, free_slot

FORKS = sys.platform.startswith("linux")  # where servers fork workers (fork without exec is safe there)
# The stage kinds one server imports for: hermetic build servers; plain servers for the model tools, and for user code.
BUILD_SERVED, TOOLS_SERVED = kinds_running_in(BUILD_SERVER), kinds_running_in(TOOLS_SERVER)
USER_CODE_SERVED = kinds_running_in(USER_CODE_SERVER)


class ForkServer(NamedTuple):
    """A started server: the stack that holds its slot folder (closing it ends the server), the slot (its working
    directory, where each task and, for a build, its inputs are placed), the process."""

    stack: contextlib.ExitStack
    slot: Path
    process: subprocess.Popen

    def run(self, task: StageTask, imports: tuple[str, ...] = (), later: tuple[str, ...] = ()) -> StageResult:
        """Run `task` in a child the server forks (after importing `imports`, a plain server only; `later` it imports
        while the child runs, for the tasks after); its result, or its death."""
        write_task(self.slot / TASK_FILE, task)
        words = [*imports, *(("then", *later) if later else ())]
        reply = _ask(self.process, GO if not words else b"go " + " ".join(words).encode() + b"\n")
        code = int(reply) if reply.strip().lstrip(b"-").isdigit() else _server_death(self.process)
        return worker_result(task, self.slot, code, _tail(self.slot / OUTPUT_FILE))


class ForkServers:
    """The servers of some stage kinds, started as tasks need them (or ahead, `fill`), each in a slot of its own."""

    def __init__(self, kinds: tuple[str, ...], settings: Settings, hermetic: bool):
        self.kinds, self.settings, self.hermetic = kinds, settings, hermetic
        self._idle: list[ForkServer] = []
        self._lock = threading.Lock()
        self._closed = False
        self._shared = contextlib.ExitStack()  # the model tools' servers' shared folder, held while the run lasts
        self._shared_folder: Path | None = None

    @classmethod
    def for_builds(cls, settings: Settings) -> ForkServers:
        """Hermetic build servers (what a run builds with, and `--check-repro` rebuilds with)."""
        return cls(BUILD_SERVED, settings, hermetic=True)

    @contextlib.contextmanager
    def server(self) -> Iterator[ForkServer]:
        """An idle server (started if none is), given back emptied after the task; ended if it died meanwhile."""
        with self._lock:
            if self._closed:
                raise EnvironmentProblem("the run is ending: no worker server is started any more")
            while self._idle and self._idle[0].process.poll() is not None:
                self._idle.pop(0).stack.close()  # died while idle (killed from outside): forget it
            taken = self._idle.pop(0) if self._idle else self._start()
        try:
            yield taken
        finally:
            self._give_back(taken)

    def _give_back(self, server: ForkServer) -> None:
        """Keep a server that is still alive for the next task, its folder emptied; end it once the run is ending."""
        if server.process.poll() is None:
            _empty(server.slot)
            with self._lock:
                if not self._closed:
                    self._idle.append(server)
                    return
        server.stack.close()

    def fill(self, count: int) -> None:
        """Start up to `count` servers now (before the first task), so tasks find them with their imports done."""
        with self._lock:
            while not self._closed and len(self._idle) < count:
                self._idle.append(self._start())

    def _start(self) -> ForkServer:
        early = self._early()
        if early is not None:
            return early
        stack = contextlib.ExitStack()
        slot = stack.enter_context(free_slot(HERMETIC_SLOTS if self.hermetic else PLAIN_SLOTS))
        where = stage(self.kinds[0]).runs_in
        process = (
            servers.spawn(where, True, slot, self.settings.hermetic_env(), hermetic_preexec())
            if self.hermetic
            else servers.spawn_plain(where, slot, self._shared_for_tools())
        )
        stack.callback(servers.end, process)
        return ForkServer(stack, slot, process)

    def _early(self) -> ForkServer | None:
        """The model tools' server the command started as it began (util.early_server), taken over as this run's
        first, with the folder it shares; None for other servers, or if there is none; called with the lock held."""
        if self.kinds != TOOLS_SERVED or self._shared_folder is not None:
            return None
        started = early_server.take()
        if started is None:
            return None
        self._shared.enter_context(started.shared_stack)
        self._shared_folder = started.shared
        return ForkServer(started.stack, started.slot, started.process)

    def _shared_for_tools(self) -> Path | None:
        """The folder the model tools' servers share (stages.shared_outputs): a slot of its own
        (`/tmp/trtflow-shared-<uid>/<n>`), taken at the first server's start; None for other servers; called with the
        lock held."""
        if self.kinds != TOOLS_SERVED:
            return None
        if self._shared_folder is None:
            self._shared_folder = self._shared.enter_context(free_slot(SHARED_SLOTS))
        return self._shared_folder

    def close(self) -> None:
        """End the idle servers (killed: they hold no task) and free their folders; busy ones end when given back."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for server in idle:
            server.stack.close()
        self._shared.close()  # its slot: emptied by its next user, as a killed run's is


def run_forked(
    task: StageTask, servers: ForkServers, imports: tuple[str, ...] = (), later: tuple[str, ...] = ()
) -> StageResult:
    """Run one task in a child of a plain server (`imports` done in the server first, `later` while the child runs),
    in the task's own work dir."""
    try:
        with servers.server() as server:
            return server.run(task, imports, later)
    except TrtflowError as exc:
        return StageResult.failure(str(exc), exc.exit_code)
    except OSError as exc:  # the server's folder could not be made or written
        return StageResult.failure(f"worker server could not start: {exc}", errno=exc.errno)


def _empty(slot: Path) -> None:
    """Remove what a task left in a server's slot (the folder stays: it is the server's working directory)."""
    for entry in slot.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)


def _ask(process: subprocess.Popen, request: bytes) -> bytes:
    """Ask a server to fork a child for the task in its folder; the line it answers when the child ended (b'' if the
    server is gone)."""
    if process.stdin is None or process.stdout is None:
        return b""
    try:
        process.stdin.write(request)
        process.stdin.flush()
        return process.stdout.readline()
    except OSError:
        return b""


def _server_death(process: subprocess.Popen) -> int:
    """The exit status of a server that stopped answering (killed from outside, or out of memory)."""
    try:
        return process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        return process.wait()


def _tail(path: Path) -> str:
    """The last 4000 characters a forked child wrote (its output file in the server's folder), or nothing."""
    try:
        with open(path, "rb") as source:
            source.seek(max(0, os.fstat(source.fileno()).st_size - 4000))
            return source.read().decode("utf-8", "replace")
    except OSError:
        return ""
