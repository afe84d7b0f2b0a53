"""Precision: the ONNX a build starts from, one per precision and shared by every target.

TensorRT 11 and TensorRT-RTX build strongly typed networks: reduced precision is baked into the ONNX
(fp16/bf16 by ModelOpt AutoCast, int8/fp8 by ModelOpt PTQ with Q/DQ nodes). fp32 passes the cleaned
model through unchanged (the store deduplicates it: same bytes, same object).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from trtflow.errors import StageError
from trtflow.stages import StageOutput, Upstream
from trtflow.stages.modelfile import FILE_NAMES, companions


def run(params: dict, inputs: dict[str, Upstream], workdir: Path) -> StageOutput:
    precision = params["precision"]
    if precision != "fp32":
        raise StageError(f"precision {precision} is not implemented yet")
    return StageOutput(files=_pass_through(inputs["model"], workdir), record={"precision": "fp32", "accuracy": None})


def _pass_through(model: Upstream, workdir: Path) -> dict[str, Path]:
    files = {}
    for name in ("model", *companions(model.files, "model")):
        files[name] = workdir / FILE_NAMES.get(name, name)
        _link_or_copy(model.files[name], files[name])
    return files


def _link_or_copy(source: Path, target: Path) -> None:
    """A hard link costs nothing for a multi-GB model (the store is one filesystem); copy where links fail."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)
