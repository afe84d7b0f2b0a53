"""Stages: each turns input artifacts into output files plus a JSON record, inside a given work directory.

A stage module has `run(params, inputs, workdir) -> StageOutput`; its version lives in STAGE_VERSIONS
(bump it when the stage's output for the same inputs would change). Stages never read the CLI, the global config or the
clock, and import their heavy libraries (onnx, TensorRT) only inside `run`.
`execute` is what a worker process calls; it turns any failure into a plain, picklable dict.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from trtflow.errors import TrtflowError

# Kept here, not in the stage modules, so planning never imports a stage (or what it imports).
STAGE_VERSIONS = {"export": 1, "cleanup": 3, "precision": 1, "build": 1, "verify": 2, "package": 3}


@dataclass
class Upstream:
    """One input of a stage: the files an upstream node produced (or a source file) and its record."""

    files: dict[str, Path]
    record: dict[str, Any] = field(default_factory=dict)
    key: Optional[str] = None
    sha256: dict[str, str] = field(default_factory=dict)


@dataclass
class StageOutput:
    files: dict[str, Path]
    record: dict[str, Any]


@functools.lru_cache(maxsize=None)
def tool_version(distribution: str) -> Optional[str]:
    """Installed version of a package, read from its metadata (no import; remembered for the process)."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def execute(kind: str, params: dict, inputs: dict[str, Upstream], workdir: Path) -> dict:
    """Run one stage (in a worker process). Returns {"files", "record"} or {"error", "detail"}."""
    module = importlib.import_module(f"trtflow.stages.{kind}")
    try:
        output = module.run(params, inputs, workdir)
    except TrtflowError as exc:
        return {"error": str(exc), "error_type": type(exc).__name__, "detail": traceback.format_exc()}
    except Exception as exc:  # a library failed inside the stage: report it as the stage's failure
        return {"error": f"{type(exc).__name__}: {exc}", "error_type": "StageError", "detail": traceback.format_exc(), "errno": _errno(exc)}
    return {"files": {name: str(path) for name, path in output.files.items()}, "record": output.record}


def _errno(exc: BaseException) -> Optional[int]:
    """The OS error number behind a failure (a full disk must stop the run, not fail one stage after another)."""
    while exc is not None:
        if isinstance(exc, OSError) and exc.errno:
            return exc.errno
        exc = exc.__cause__ or exc.__context__
    return None
