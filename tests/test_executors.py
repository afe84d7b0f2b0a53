"""The executor boundary: what a worker returns keeps the exit code of the error that failed the stage."""

from __future__ import annotations

from pathlib import Path

import pytest

from trtflow.errors import EnvironmentProblem, StageError
from trtflow.executors import StageTask, run_task
from trtflow.executors.local import LocalExecutor
from trtflow.stages import build
from trtflow.stages.base import Upstream


def _build_task(tmp_path: Path, backend: str) -> StageTask:
    params = build.Params(precision="fp32", profiles=[], backend=backend, backend_version=None, compute_capabilities=["sm_86"],
                          hardware_compatibility="none", version_compatible=False)
    return StageTask("build:m/fp32/t", "build", params, {"model": Upstream(files={"model": tmp_path / "missing.onnx"})}, tmp_path)


@pytest.mark.skipif(__import__("importlib").util.find_spec("tensorrt") is not None, reason="full TensorRT is installed here")
def test_a_missing_backend_in_a_worker_keeps_exit_code_4(tmp_path: Path) -> None:
    result = LocalExecutor(1).submit(_build_task(tmp_path, "tensorrt")).result(timeout=120)
    assert result.exit_code == EnvironmentProblem.exit_code == 4
    assert result.error.startswith("module 'tensorrt' is required: pip install 'trtflow[tensorrt]'")


def test_a_stage_failure_is_exit_code_1_with_its_message(tmp_path: Path) -> None:
    result = run_task(_build_task(tmp_path, "tensorrt-rtx"))
    assert result.exit_code == StageError.exit_code == 1 and result.files is None
    assert result.error.startswith("the ONNX parser rejected the model")
