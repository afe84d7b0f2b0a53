"""Verification on real ONNX Runtime sessions: it passes equal models and catches different ones."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from conftest import example_models, trtflow
from trtflow.errors import StageError
from trtflow.stages import Upstream
from trtflow.stages import verify

PROFILES = [{"input": {"min": [1, 3, 32, 32], "opt": [2, 3, 32, 32], "max": [4, 3, 32, 32]}}]
TENSORS = [{"name": "input", "mode": "input", "dtype": "float32", "shape": [-1, 3, 32, 32]},
           {"name": "logits", "mode": "output", "dtype": "float32", "shape": [-1, 10]}]


def _params(on_fail: str = "fail") -> dict:
    return {"profiles": PROFILES, "rtol": 1e-3, "atol": 1e-4, "samples": 3, "seed": 0, "on_fail": on_fail,
            "backend": "tensorrt-rtx", "compute_capabilities": ["sm_86"], "hardware_compatibility": "none"}


def _inputs(tmp_path: Path, source_seed: int, model_seed: int, tensors: list = TENSORS) -> dict:
    for name, seed in (("source.onnx", source_seed), ("model.onnx", model_seed)):
        onnx.save(example_models().tiny_cnn(np.random.default_rng(seed)), tmp_path / name)
    return {"source": Upstream(files={"source": tmp_path / "source.onnx"}),
            "model": Upstream(files={"model": tmp_path / "model.onnx"}),
            "engine": Upstream(files={"engine": tmp_path / "none.engine"}, record={"tensors": tensors})}


def test_equal_models_pass_and_the_engine_run_is_not_faked(tmp_path: Path) -> None:
    output = verify.run(_params(), _inputs(tmp_path, 0, 0), tmp_path)
    compare = output.record["onnx_compare"]
    assert compare["passed"] and compare["samples"] == 3 and compare["outputs"][0]["max_abs_error"] == 0.0
    assert output.record["engine_run"]["status"].startswith("not run (no GPU")
    assert "passed" not in output.record["engine_run"] or output.record["engine_run"].get("passed") is None


def test_different_models_fail_naming_the_output(tmp_path: Path) -> None:
    with pytest.raises(StageError, match="onnx_compare out of tolerance.*first differing output logits max abs"):
        verify.run(_params(), _inputs(tmp_path, 0, 1), tmp_path)


def test_on_fail_warn_records_the_failure_without_failing(tmp_path: Path) -> None:
    record = verify.run(_params("warn"), _inputs(tmp_path, 0, 1), tmp_path).record
    assert record["onnx_compare"]["passed"] is False and record["onnx_compare"]["outputs"][0]["max_abs_error"] > 1e-3


def test_engine_io_that_does_not_match_the_model_fails(tmp_path: Path) -> None:
    wrong = [dict(TENSORS[0], dtype="float16"), TENSORS[1]]
    with pytest.raises(StageError, match="input: engine .*float16.* vs model .*float32"):
        verify.run(_params(), _inputs(tmp_path, 0, 0, wrong), tmp_path)


def test_profile_outside_the_engine_static_dims_is_reported() -> None:
    problems = verify._profile_problems(TENSORS, [{"input": {"min": [1, 4, 32, 32]}}])
    assert problems == ["profile 0 input.min [1, 4, 32, 32] does not fit engine shape [-1, 3, 32, 32]"]


def test_samples_cover_min_opt_and_max_shapes(tmp_path: Path) -> None:
    onnx.save(example_models().tiny_cnn(np.random.default_rng(0)), tmp_path / "m.onnx")
    session = verify._session(__import__("onnxruntime"), tmp_path / "m.onnx")
    shapes = [feed["input"].shape[0] for feed in verify.sample_feeds(session, PROFILES, 3, 0)]
    assert shapes == [2, 1, 4]


def test_every_packaged_engine_records_what_verification_ran(project: Path) -> None:
    assert trtflow(project, "run").code == 0
    manifest = json.loads((project / "artifacts/packages/tiny/manifest.json").read_text())
    for engine in manifest["engines"]:
        check = engine["verification"]
        assert check["onnx_compare"]["passed"] and check["onnx_compare"]["samples"] == 6
        assert check["engine_checks"] == {"io_names_and_dtypes": "pass", "profile_shapes": "pass", "problems": []}
        assert check["engine_run"]["status"].startswith("not run (no GPU")
