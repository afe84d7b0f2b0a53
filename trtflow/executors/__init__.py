"""Executors: where a stage runs. The runner hands each stale node to an `Executor` as a `StageTask` and gets a
`StageResult` back through a future; it knows nothing of processes, machines or what a stage does.

`run_task` is what a worker calls: it runs the stage and turns any failure into a plain, picklable result
that keeps the exit code of the error class (an EnvironmentProblem in a worker still makes the run exit 4).
The local process pool (executors.local) is the default; a distributed executor implements the same two methods.
"""

from __future__ import annotations

import concurrent.futures as futures
import dataclasses
import os
import re
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from trtflow.errors import EnvironmentProblem, StageError, TrtflowError
from trtflow.stages import stage
from trtflow.stages.base import StageParams, Upstream
from trtflow.util.memory import peak_rss, released_after, reset_peak, shown
from trtflow.util.text import clipped


@dataclass(frozen=True)
class StageTask:
    """One stage to run: its node, kind, typed params, input files and the work directory it may write in."""

    node_id: str
    kind: str
    params: StageParams
    inputs: dict[str, Upstream]
    workdir: Path


@dataclass(frozen=True)
class StageResult:
    """Output files and record of a stage that ran, or the one-line error of one that failed (and how to exit)."""

    files: dict[str, str] | None = None
    record: dict | None = None
    error: str | None = None
    exit_code: int = 0
    errno: int | None = None  # the OS error behind a failure: a full disk stops the run
    detail: str = ""
    node: dict | None = None  # where a distributed executor ran it: {"id": ..., "labels": {...}}
    deterministic: bool = False  # the stage's own failure (same inputs, same failure): recorded under its key
    peak_rss: int | None = None  # bytes: the high-water mark of the worker process that ran it (the report shows it)

    @classmethod
    def failure(
        cls,
        message: str,
        exit_code: int = StageError.exit_code,
        detail: str = "",
        errno: int | None = None,
        node: dict | None = None,
        deterministic: bool = False,
    ) -> StageResult:
        """A failed stage: what the user reads, the exit code its error class carries, the traceback for -v.

        Only a stage's own failure is `deterministic`; a worker that died, was killed or ran out of memory, a
        timeout, a missing package or a full disk say nothing about the stage's inputs and are never recorded.
        """
        return cls(
            error=message, exit_code=exit_code, detail=detail, errno=errno, node=node, deterministic=deterministic
        )

    def to_json(self) -> dict:
        """The result as JSON-ready data: how it travels back from a worker process (never pickled)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> StageResult | None:
        """The result a worker wrote as JSON, or None if it is not one (every field's type checked)."""
        if not isinstance(data, dict) or set(data) - RESULT_TYPES.keys():
            return None
        if not all(isinstance(data.get(name), types) for name, types in RESULT_TYPES.items()):
            return None
        files = data.get("files")
        if files is not None and not all(isinstance(k, str) and isinstance(v, str) for k, v in files.items()):
            return None
        return cls(**data)


RESULT_TYPES: dict[str, tuple[type, ...]] = {
    "files": (dict, type(None)),
    "record": (dict, type(None)),
    "error": (str, type(None)),
    "exit_code": (int,),
    "errno": (int, type(None)),
    "detail": (str,),
    "node": (dict, type(None)),
    "deterministic": (bool,),
    "peak_rss": (int, type(None)),
}


class Executor(Protocol):
    """Runs StageTasks somewhere; each future resolves to a StageResult, never raises."""

    def submit(self, task: StageTask) -> futures.Future[StageResult]:
        """Start `task`; the future resolves to its StageResult, a failure included."""

    def prepare(self, kinds: set[str], imports: Mapping[str, set[str]] | None = None) -> None:
        """Start what tasks of these stage kinds will need (workers, their imports; `imports`: per kind, the modules
        its planned tasks import beyond the kind's own) ahead of the first one."""

    def shutdown(self) -> None:
        """Stop the workers at the end of a run; tasks not yet started are cancelled."""


def warm_up(kinds: list[str]) -> None:
    """Import what stages of these kinds need, in this worker, before their first task arrives."""
    import_quietly([module for kind in kinds for module in stage(kind).warm_imports])


def import_quietly(modules: list[str]) -> None:
    """Import these modules now; one that is missing or fails to load is left to the stage, which says what to install
    or what failed (a server never dies of a tool's internals moving between versions)."""
    import importlib

    for module in modules:
        try:
            importlib.import_module(module)
        except Exception:  # noqa: BLE001, S112 - the stage meets the same failure and reports it in one line
            continue


def run_task(task: StageTask, release: bool = True) -> StageResult:
    """Run one stage (in a worker). Returns its files and record, or its failure as a StageResult, with the peak RSS the
    worker reached while it ran (the peak is reset first: a pool worker's earlier stages do not count). `release`:
    free what the stage left behind for the next (false in a worker that exits after this one)."""
    reset_peak()
    with released_after(release):
        return dataclasses.replace(_run_stage(task), peak_rss=peak_rss())


def _run_stage(task: StageTask) -> StageResult:
    try:
        output = stage(task.kind).run(task.params, task.inputs, task.workdir)
    except MemoryError:
        return StageResult.failure(
            f"{task.node_id} ran out of memory (MemoryError at {shown(peak_rss())}): run fewer stages at once "
            "(-j, --memory) or on a machine with more memory",
            EnvironmentProblem.exit_code,
            traceback.format_exc(),
        )
    except TrtflowError as exc:
        own = isinstance(exc, StageError) and exc.exit_code == StageError.exit_code
        return StageResult.failure(
            stable_reason(str(exc), task.workdir), exc.exit_code, traceback.format_exc(), deterministic=own
        )
    except Exception as exc:  # a library failed inside the stage: report it as the stage's failure
        code = _errno(exc)
        own = code is None and not isinstance(exc, ENVIRONMENT_EXCEPTIONS)
        return StageResult.failure(
            stable_reason(library_failure(exc), task.workdir),
            StageError.exit_code,
            traceback.format_exc(),
            code,
            deterministic=own,
        )
    return StageResult(files={name: str(path) for name, path in output.files.items()}, record=output.record)


# Failures that say something about the machine, not the stage's inputs: never recorded as the stage's result.
ENVIRONMENT_EXCEPTIONS = (MemoryError, OSError, TimeoutError, ImportError)
_ADDRESS = re.compile(r"\b0x[0-9a-fA-F]{6,}\b")


def stable_reason(message: str, workdir: Path) -> str:
    """A failure's line without what differs from run to run (its work directory, memory addresses): a recorded
    failure is compared with trtflow.lock's word for word."""
    for spelling in {str(workdir), os.path.realpath(workdir)}:
        message = message.replace(spelling, "<workdir>")
    return _ADDRESS.sub("0x...", message)


_ORT_LOAD = re.compile(r"^\[ONNXRuntimeError\] : \d+ : \w+ : Load model from .*? failed:\s*")
_CXX_LOCATION = re.compile(r"^/\S+\.(?:cc|h|cpp):\d+ .*?\) (?=\S)")


def library_failure(exc: BaseException) -> str:
    """One readable line for an exception a library raised inside a stage (ONNX Runtime's load errors shortened)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    shortened = _ORT_LOAD.sub("", text)
    if shortened != text:
        return "ONNX Runtime cannot load the model: " + clipped(_CXX_LOCATION.sub("", shortened), 400)
    return f"{type(exc).__name__}: {text}"[:600]


def _errno(exc: BaseException | None) -> int | None:
    """The OS error number behind a failure (a full disk must stop the run, not fail one stage after another)."""
    while exc is not None:
        if isinstance(exc, OSError) and exc.errno:
            return exc.errno
        exc = exc.__cause__ or exc.__context__
    return None
