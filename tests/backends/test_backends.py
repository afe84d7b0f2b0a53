"""Backends against their real libraries: TensorRT-RTX here, full TensorRT wherever it imports."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import example_models

from trtflow.backends.base import BuildRequest, backend_version, get_backend
from trtflow.errors import StageError

needs_tensorrt = pytest.mark.skipif(
    importlib.util.find_spec("tensorrt") is None,
    reason="full TensorRT is not installed (it installs from NVIDIA's package index and needs a GPU to build)",
)


def _request(tmp_path: Path, name: str, ccs: list[str]) -> BuildRequest:
    model = tmp_path / "tiny.onnx"
    if not model.exists():
        onnx.save(example_models().tiny_cnn(np.random.default_rng(0)), model)
    return BuildRequest(
        onnx_path=model,
        engine_path=tmp_path / name,
        compute_capabilities=ccs,
        profiles=[{"input": ([1, 3, 32, 32], [2, 3, 32, 32], [4, 3, 32, 32])}],
    )


def test_rtx_builds_the_same_bytes_twice_and_reports_io(tmp_path: Path) -> None:
    backend = get_backend("tensorrt-rtx")
    first = backend.engine_from_onnx(_request(tmp_path, "a.engine", ["sm_86"]))
    backend.engine_from_onnx(_request(tmp_path, "b.engine", ["sm_86"]))
    assert (tmp_path / "a.engine").read_bytes() == (tmp_path / "b.engine").read_bytes()
    assert first.backend_version == backend_version("tensorrt-rtx")
    assert [(t.name, t.mode, t.dtype, t.shape) for t in first.tensors] == [
        ("input", "input", "float32", [-1, 3, 32, 32]),
        ("logits", "output", "float32", [-1, 10]),
    ]


def test_rtx_engine_depends_on_the_compute_capability(tmp_path: Path) -> None:
    backend = get_backend("tensorrt-rtx")
    backend.engine_from_onnx(_request(tmp_path, "86.engine", ["sm_86"]))
    backend.engine_from_onnx(_request(tmp_path, "89.engine", ["sm_89"]))
    assert (tmp_path / "86.engine").read_bytes() != (tmp_path / "89.engine").read_bytes()


def test_rtx_rejects_a_profile_for_an_unknown_input(tmp_path: Path) -> None:
    request = _request(tmp_path, "x.engine", ["sm_86"])
    bad = BuildRequest(**{**request.__dict__, "profiles": [{"nope": ([1], [1], [1])}]})
    with pytest.raises(StageError):
        get_backend("tensorrt-rtx").engine_from_onnx(bad)


@needs_tensorrt
def test_tensorrt_builds_for_the_local_gpu(tmp_path: Path) -> None:
    from trtflow.device import query_compute_capabilities

    result = get_backend("tensorrt").engine_from_onnx(
        _request(tmp_path, "t.engine", list(query_compute_capabilities()[:1]))
    )
    assert result.engine_bytes == (tmp_path / "t.engine").stat().st_size > 0
