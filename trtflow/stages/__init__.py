"""Stages: each turns input artifacts into output files plus a JSON record, inside a given work directory.

One module (or package) per stage kind, each a typed unit (see stages.base): export, cleanup, precision, build,
verify, package, in DAG order. Helpers shared by several stages: compare (ONNX Runtime proofs), accuracy, convert
(ModelOpt), modelfile (model.onnx + external data), capture (native output). Stages never read the CLI, the
global config or the clock.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trtflow.stages.base import Stage

STAGE_KINDS = ("export", "cleanup", "precision", "build", "verify", "package")


def stage(kind: str) -> Stage:
    """The Stage of a kind (light to import: heavy libraries load inside its `run`)."""
    if kind not in STAGE_KINDS:
        raise KeyError(f"no stage kind {kind!r}")
    found: Stage = importlib.import_module(f"trtflow.stages.{kind}").STAGE
    return found


def described(kind: str, files: Mapping[str, str | Path], record: dict[str, Any]) -> dict[str, Any]:
    """A finished stage's record with what the runner reads from its output files (Stage.described)."""
    describe = stage(kind).described
    return {**record, **describe({name: Path(path) for name, path in files.items()})} if describe else record


def kinds_running_in(where: str) -> tuple[str, ...]:
    """The stage kinds whose nodes run in `where` (util.servers: BUILD_SERVER, TOOLS_SERVER, USER_CODE_SERVER, POOL),
    in DAG order."""
    return tuple(kind for kind in STAGE_KINDS if stage(kind).runs_in == where)
