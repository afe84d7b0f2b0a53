"""The model tools' server of a cold `trtflow run`, started as the command starts (trtflow.__main__), before the run
imports its stages: the server's imports (onnx, ONNX Runtime, onnxslim: about a second) then overlap the run's own
from the first instant, and the first cleanup finds the server ready sooner.

The run takes it over as its first model tools' server (executors.forking), with the slot and the shared folder it
holds: the same command, environment and folders a server started later would have. The decision reads the command
line without the CLI's parser, so it is a guess (`run`, not dry, not on Ray, a pipeline.yaml but no store at its
default place and no no-op memo yet); a wrong guess costs a process that the run never takes, ended when the command
exits. Import-light: the standard library and trtflow.util only.
"""

from __future__ import annotations

import atexit
import contextlib
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

from trtflow.util import servers
from trtflow.util.slots import PLAIN_SLOTS, SHARED_SLOTS, free_slot

DEFAULT_STORE = "artifacts/store"  # pipeline.yaml's default `store:` (the guess need not load the project)
RUN_MEMO = ".trtflow/last-run.json"  # run.runmemo's no-op memo: a run it may answer starts no server
PROJECT_OPTIONS = ("-C", "--project")
NOT_LOCAL = ("--dry-run", "--ray-address", "--help", "-h")  # options of a run that starts no local server at once


class Started(NamedTuple):
    """A server started early: its stack (its slot, its end), slot and process; the folder the model tools' servers
    share (stages.shared_outputs) and the stack that holds it."""

    stack: contextlib.ExitStack
    slot: Path
    process: subprocess.Popen
    shared: Path
    shared_stack: contextlib.ExitStack


_started: list[Started] = []  # at most one, until the run takes it


def start_for(argv: list[str]) -> None:
    """Start the model tools' server now if `argv` (the command's arguments) is a cold local `run`. Best effort: a
    server that cannot start here is left to the run, which reports its problem when a stage needs it."""
    if _started or not sys.platform.startswith("linux"):  # elsewhere a run forks no server to take it over
        return
    project = cold_run_project(argv)
    if project is None:
        return
    with contextlib.ExitStack() as shared_stack, contextlib.ExitStack() as stack:
        try:
            shared = shared_stack.enter_context(free_slot(SHARED_SLOTS))
            slot = stack.enter_context(free_slot(PLAIN_SLOTS))
            process = servers.spawn_plain(servers.TOOLS_SERVER, slot, shared)
        except Exception:  # noqa: BLE001 - any problem here is met again, and reported, where the run starts it
            return
        stack.callback(servers.end, process)
        _started.append(Started(stack.pop_all(), slot, process, shared, shared_stack.pop_all()))
    atexit.register(_end_untaken)


def take() -> Started | None:
    """The server started early, still running, for the run to keep (once: later calls get None)."""
    if not _started:
        return None
    started = _started.pop()
    if started.process.poll() is not None:  # it died: the run starts its own
        _close(started)
        return None
    return started


def cold_run_project(argv: list[str]) -> Path | None:
    """The project folder of `argv` when it is a local `run` of a project that has not run yet (_cold); else None.
    Options before the command: -C/--project DIR (also -CDIR, --project=DIR) and -v/--verbose."""
    project = Path(".")
    words = iter(argv)
    for word in words:
        if word in PROJECT_OPTIONS:
            project = Path(next(words, "."))
        elif word.startswith("--project="):
            project = Path(word.partition("=")[2])
        elif word.startswith("-C") and not word.startswith("--"):
            project = Path(word[2:])
        elif word in ("-v", "--verbose"):
            continue
        elif word == "run":
            return project if _starts_local(list(words)) and _cold(project) else None
        else:
            return None
    return None


def _starts_local(options: list[str]) -> bool:
    """Whether a run with these options starts local servers at once: not a dry run, not on Ray, not its help."""
    for index, word in enumerate(options):
        name, _, value = word.partition("=")
        if name == "--executor" and (value or next(iter(options[index + 1 :]), "")) != "local":
            return False
        if name in NOT_LOCAL:
            return False
    return True


def _cold(project: Path) -> bool:
    """Whether `project` is a project that has not run yet: its pipeline.yaml, no store at the default place, no
    no-op memo (a memo's answer starts no server; a project with a store elsewhere has no memo until its first
    no-op)."""
    return (project / "pipeline.yaml").is_file() and not any(
        (project / path).exists() for path in (DEFAULT_STORE, RUN_MEMO)
    )


def _end_untaken() -> None:
    """At the command's exit: end the server the run did not take (a wrong guess), and free its folders."""
    while _started:
        _close(_started.pop())


def _close(started: Started) -> None:
    started.stack.close()
    started.shared_stack.close()
