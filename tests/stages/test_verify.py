"""Verification on real ONNX Runtime sessions: proofs pass equal models and catch different ones."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import example_models, trtflow

from trtflow.errors import StageError
from trtflow.stages import compare, verify
from trtflow.stages.base import Upstream

PROFILES = [{"input": {"min": [1, 3, 32, 32], "opt": [2, 3, 32, 32], "max": [4, 3, 32, 32]}}]
TENSORS = [
    {"name": "input", "mode": "input", "dtype": "float32", "shape": [-1, 3, 32, 32]},
    {"name": "logits", "mode": "output", "dtype": "float32", "shape": [-1, 10]},
]


def _params(on_fail: str = "fail") -> verify.Params:
    return verify.Params(
        profiles=PROFILES,
        rtol=1e-3,
        atol=1e-4,
        samples=3,
        cleanup_samples=2,
        seed=0,
        on_fail=on_fail,
        onnxruntime=None,
        local_gpus=[],
        backend="tensorrt-rtx",
        backend_version=None,
        compute_capabilities=["sm_86"],
        hardware_compatibility="none",
    )


def _save(tmp_path: Path, name: str, seed: int) -> Path:
    onnx.save(example_models().tiny_cnn(np.random.default_rng(seed)), tmp_path / name)
    return tmp_path / name


def _inputs(tmp_path: Path, tensors: list = TENSORS) -> dict:
    model = _save(tmp_path, "model.onnx", 0)
    equality = compare.prove_equal(model, model, PROFILES, _params().model_dump())
    return {
        "reference": Upstream(files={"model": model}, record={"equality": equality}),
        "model": Upstream(files={"model": model}, record={"accuracy": None}),
        "engine": Upstream(files={"engine": tmp_path / "none.engine"}, record={"tensors": tensors}),
    }


def test_equal_models_prove_equal(tmp_path: Path) -> None:
    model = _save(tmp_path, "a.onnx", 0)
    proof = compare.prove_equal(model, _save(tmp_path, "b.onnx", 0), PROFILES, _params().model_dump())
    assert proof["passed"] and proof["samples"] == 3 and proof["outputs"][0]["max_abs_error"] == 0.0


def test_different_models_fail_naming_the_output(tmp_path: Path) -> None:
    proof = compare.prove_equal(
        _save(tmp_path, "a.onnx", 0), _save(tmp_path, "b.onnx", 1), PROFILES, _params().model_dump()
    )
    assert proof["passed"] is False and proof["outputs"][0]["max_abs_error"] > 1e-3
    assert compare.failure_message("onnx_compare", proof).startswith(
        "onnx_compare out of tolerance (rtol 0.001, atol 0.0001): first differing output logits max abs"
    )


def test_verify_carries_the_proofs_and_the_engine_run_is_not_faked(tmp_path: Path) -> None:
    record = verify.run(_params(), _inputs(tmp_path), tmp_path).record
    assert record["cleanup_equality"]["passed"] and record["precision_accuracy"] is None
    assert record["engine_run"]["status"].startswith("not run (no GPU")
    assert record["engine_run"].get("passed") is None


def test_engine_io_that_does_not_match_the_model_fails(tmp_path: Path) -> None:
    wrong = [dict(TENSORS[0], dtype="float16"), TENSORS[1]]
    with pytest.raises(StageError, match="input: engine .*float16.* vs model .*float32"):
        verify.run(_params(), _inputs(tmp_path, wrong), tmp_path)


def test_the_engine_is_checked_against_the_cleanups_record_of_the_very_model_it_was_built_from(tmp_path: Path) -> None:
    """fp32 builds from the cleaned model itself: verify takes its I/O from the cleanup's record of that file (no
    parse); a model that is another file (a reduced precision's) is read from its graph, whatever the record says."""
    from trtflow.stages import cleanup

    inputs = _inputs(tmp_path)
    model = inputs["model"].files["model"]
    summary = cleanup.model_summary(onnx.load(model))
    lying = {**summary, "inputs": [{"name": "input", "dtype": "float16", "shape": [-1, 3, 32, 32]}]}
    inputs["reference"] = Upstream(files={"model": model}, record={"after": lying}, sha256={"model": "a" * 64})
    inputs["model"] = Upstream(files={"model": model}, sha256={"model": "a" * 64})
    with pytest.raises(StageError, match="input: engine .*float32.* vs model .*float16"):  # the record was read
        verify.run(_params(), inputs, tmp_path)
    inputs["model"] = Upstream(files={"model": model}, sha256={"model": "b" * 64})
    assert verify.run(_params(), inputs, tmp_path).record["engine_checks"]["problems"] == []  # the graph was read
    inputs["reference"] = Upstream(files={"model": model}, record={"after": summary}, sha256={"model": "b" * 64})
    assert verify.run(_params(), inputs, tmp_path).record["engine_checks"]["problems"] == []


def test_profile_outside_the_engine_static_dims_is_reported() -> None:
    problems = verify._profile_problems(TENSORS, [{"input": {"min": [1, 4, 32, 32]}}])
    assert problems == ["profile 0 input.min [1, 4, 32, 32] does not fit engine shape [-1, 3, 32, 32]"]


def test_samples_cover_min_opt_and_max_shapes(tmp_path: Path) -> None:
    session = compare.session(_save(tmp_path, "m.onnx", 0))
    shapes = [feed["input"].shape[0] for feed in compare.sample_feeds(session, PROFILES, 3, 0)]
    assert shapes == [2, 1, 4]


def test_every_packaged_engine_records_what_verification_ran(project: Path) -> None:
    assert trtflow(project, "run").code == 0
    manifest = json.loads((project / "artifacts/packages/tiny/manifest.json").read_text())
    for engine in manifest["engines"]:
        check = engine["verification"]
        # one profile whose opt and min differ on its dynamic axis: the cleanup's proof runs those two shapes
        assert check["cleanup_equality"]["passed"] and check["cleanup_equality"]["samples"] == 2
        assert check["engine_checks"] == {"io_names_and_dtypes": "pass", "profile_shapes": "pass", "problems": []}
        assert check["engine_run"]["status"].startswith("not run (no GPU")


def test_inspect_shows_the_evidence_behind_each_engine(built: Path) -> None:
    shown = trtflow(built, "inspect", str(built / "artifacts/packages/tiny"))
    assert shown.code == 0
    assert shown.out.count("cleanup == source: passed (max abs error") == 2
    assert shown.out.count("engine run: not run (no GPU") == 2
