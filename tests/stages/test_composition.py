"""What a reduced-precision model really is: shares of weights and MACs in the precision, the nodes kept higher with
the tool's reason, `min_share` limits, `inspect` naming the kept nodes, and range diagnosis of accuracy failures."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import trtflow
from onnx import TensorProto, helper, numpy_helper
from test_precision import PROFILE_YAML, _project, _run_node

from trtflow.errors import StageError
from trtflow.stages.composition import autocast_reason

FP16 = "source: {onnx: models/m.onnx}\nprecisions: [fp32, fp16]\ntargets: [rtx-ada]\n" + PROFILE_YAML


def test_an_fp16_model_that_is_mostly_fp32_is_caught_by_min_share_and_named_in_inspect(tmp_path: Path) -> None:
    mostly_fp32 = FP16 + "autocast: {keep_op_types: [Conv]}\naccuracy:\n  fp16: {min_share: 0.9}\n"
    root = _project(tmp_path, "tiny_cnn", mostly_fp32)
    with pytest.raises(
        StageError,
        match=r"fp16: only \d+\.\d% of the weights and \d+\.\d% of the MACs run in fp16 \(min_share 0\.9\); "
        r"\d+ node\(s\) kept higher, the largest: .*Conv.*autocast\.keep_op_types",
    ):
        _run_node(root, "fp16", tmp_path)
    (root / "recipes" / "m.yaml").write_text(mostly_fp32 + "verify: {on_fail: warn}\n")
    result = trtflow(root, "run")
    assert result.code == 0, result.err + result.out
    shown = trtflow(root, "inspect", str(root / "artifacts" / "packages" / "m")).out
    assert "fp16 share: weights " in shown and "node(s) kept in higher precision, the largest:" in shown
    assert "(Conv, " in shown and "autocast.keep_op_types (recipe)" in shown, shown


def test_a_true_fp16_model_has_full_shares_and_passes_min_share(tmp_path: Path) -> None:
    root = _project(tmp_path, "tiny_cnn", FP16 + "accuracy:\n  fp16: {min_share: 0.99}\n")
    _, record = _run_node(root, "fp16", tmp_path)
    made_of = record["composition"]
    assert made_of["weight_share"] == 1.0 and made_of["mac_share"] == 1.0 and made_of["kept"] == []
    assert record["accuracy"]["passed"] and record["accuracy"]["problems"] == []


def test_int8_composition_names_what_ptq_left_unquantized(tmp_path: Path) -> None:
    recipe = (
        "source: {onnx: models/m.onnx}\nprecisions: [int8]\ntargets: [rtx-ada]\n"
        + PROFILE_YAML
        + "calibration: {random: true, samples: 4}\nquantize: {exclude_op_types: [MatMul]}\n"
    )
    _, record = _run_node(_project(tmp_path, "tiny_cnn", recipe), "int8", tmp_path)
    made_of = record["composition"]
    assert 0 < made_of["weight_share"] < 1 and made_of["kept_nodes"] >= 1
    assert any(k["op"] == "MatMul" and k["reason"].startswith("excluded") for k in made_of["kept"]), made_of["kept"]


def _tiny_output_model() -> onnx.ModelProto:
    """x @ W with |W| ~ 1e-11: every output is ~1e-9, below fp16's smallest subnormal."""
    weight = (np.random.default_rng(0).standard_normal((3 * 32 * 32, 10)) * 1e-11).astype(np.float32)
    nodes = [helper.make_node("Flatten", ["input"], ["flat"]), helper.make_node("MatMul", ["flat", "w"], ["logits"])]
    graph = helper.make_graph(
        nodes,
        "tiny_outputs",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, 32, 32])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])],
        [numpy_helper.from_array(weight, "w")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def test_an_fp16_failure_below_the_smallest_subnormal_says_so_with_the_numbers(tmp_path: Path) -> None:
    root = _project(tmp_path, "tiny_cnn", FP16)
    onnx.save(_tiny_output_model(), root / "models" / "m.onnx")
    with pytest.raises(
        StageError,
        match=r"the fp32 reference's largest \|value\| is \d\.\d+e-0?\d+, below fp16's smallest subnormal "
        r"5\.96e-08 \(every value underflows to 0\)",
    ):
        _run_node(root, "fp16", tmp_path)


@pytest.mark.parametrize(
    "line, reason",
    [
        (
            "Skipping node /conv1/Conv: reference IO out of range: min=-1e5, max=2e5, absmax=2e5, range=[-65504, "
            "65504]",
            ("/conv1/Conv", "data range: out of range: min=-1e5, max=2e5, absmax=2e5, range=[-65504, 65504]"),
        ),
        ("Skipping node fc: DisabledOpTypes", ("fc", "autocast.keep_op_types (recipe)")),
        ("Converting node fc", None),
    ],
)
def test_autocast_log_lines_become_reasons(line: str, reason: tuple | None) -> None:
    assert autocast_reason(line) == reason


def test_provision_ranks_an_engine_by_what_it_really_is(tmp_path: Path) -> None:
    """An "fp16" engine AutoCast left mostly fp32 is no faster than the fp32 one: the default preference (fewest bits
    first) ranks it as fp32, and the fp32 engine is chosen, saying why."""
    from conftest import TINY_RECIPE, write_project

    recipe = TINY_RECIPE.replace("precisions: [fp32]", "precisions: [fp32, fp16]").replace(
        "targets: [rtx-ampere, rtx-ada]", "targets: [rtx-ada]"
    )
    root = write_project(tmp_path / "p", {"tiny": recipe + "autocast: {keep_op_types: [Conv, MatMul, Gemm]}\n"})
    assert trtflow(root, "run").code == 0
    package = root / "artifacts" / "packages" / "tiny"
    chosen = trtflow(root, "provision", str(package), "--gpu", "sm_89", "--dest", str(tmp_path / "engines"), "--json")
    record = __import__("json").loads(chosen.out)
    assert chosen.code == 0 and record["chosen"]["file"].endswith("tiny-fp32.engine")
    [fp16] = [n for n in record["not_chosen"] if n["precision"] == "fp16"]
    assert "its composition is mostly fp32: ranked as fp32" in fp16["reason"]
    forced = trtflow(
        root, "provision", str(package), "--gpu", "sm_89", "--precision", "fp16", "--dest", str(tmp_path / "e2")
    )
    assert forced.code == 0  # asked for by name, it is still there
