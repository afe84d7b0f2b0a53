"""Reduced-precision accuracy on ONNX Runtime's CPU provider: numbers as fp16 arithmetic gives them, not fp32's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from zoo import zoo_model

from trtflow.stages import accuracy, compare


def _scale_chain(dtype: int) -> onnx.ModelProto:
    """x * 1e-4 * 1e-4 * 1e4 * 1e4: 1 in fp32; in fp16 the middle value (1e-8) underflows and the result is 0."""
    np_type = np.float16 if dtype == TensorProto.FLOAT16 else np.float32
    small, large = (
        numpy_helper.from_array(np.array(1e-4, np_type), "small"),
        numpy_helper.from_array(np.array(1e4, np_type), "large"),
    )
    names = ["x", "a", "b", "c", "y"]
    factors = ["small", "small", "large", "large"]
    nodes = [helper.make_node("Mul", [names[i], factors[i]], [names[i + 1]]) for i in range(4)]
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [small, large],
    )
    if dtype == TensorProto.FLOAT16:  # keep_io_types: fp32 in and out, fp16 inside (what AutoCast writes)
        graph.node.insert(0, helper.make_node("Cast", ["x"], ["x16"], to=TensorProto.FLOAT16))
        graph.node[1].input[0] = "x16"
        graph.node[-1].output[0] = "y16"
        graph.node.append(helper.make_node("Cast", ["y16"], ["y"], to=TensorProto.FLOAT))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def test_fp16_underflow_shows_in_the_accuracy_report(tmp_path: Path) -> None:
    reference = tmp_path / "fp32.onnx"
    onnx.save(_scale_chain(TensorProto.FLOAT), reference)
    feeds = [{"x": np.ones((1, 4), np.float32)}]
    candidate = tmp_path / "fp16.onnx"
    onnx.save(_scale_chain(TensorProto.FLOAT16), candidate)
    result = accuracy.report(candidate, reference, feeds, {"min_cosine": 0.9999}, "ones")
    [output] = result["outputs"]
    assert output["max_abs_error"] > 0.99 and not result["passed"]  # ONNX Runtime alone would say 0 and pass
    assert "fp16 emulated" in result["runtime"]


@pytest.mark.parametrize("name", ["resnet", "mobilenet", "efficientnet", "lstm", "encoder"])
def test_comparison_sessions_compute_as_the_unrewritten_graph_does(name: str, zoo_dir: Path) -> None:
    """Reports follow the model, not the machine: the sessions trtflow measures with give bit for bit what the graph
    gives with no rewrite at all, so neither a layout that follows the CPU's vector width (NCHWc: every CNN here
    differs under ONNX Runtime's default level) nor a fused kernel (the LSTM and the encoder differ at level 2) takes
    part."""
    model = zoo_model(name, zoo_dir)
    ort = compare.onnxruntime()
    plain_options = ort.SessionOptions()
    plain_options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    plain_options.intra_op_num_threads = 1
    plain = ort.InferenceSession(str(model.path), plain_options, providers=["CPUExecutionProvider"])
    measuring = compare.session(model.path)
    feeds = compare.sample_feeds(measuring, [model.recipe_profile()["inputs"]], 3, seed=1)
    for got, want in zip(compare.run_all(measuring, feeds), compare.run_all(plain, feeds), strict=True):
        for output, expected in want.items():
            assert np.array_equal(got[output], expected), (name, output, float(np.abs(got[output] - expected).max()))


@pytest.mark.parametrize("name", ["resnet", "lstm", "encoder"])
def test_proofs_side_by_side_give_the_numbers_one_after_the_other_gives(
    name: str, zoo_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The equality proof and the accuracy report run their two models at once when they are small: each session keeps
    its one thread, so every number is the same as when they run in turn (the path models over the limit take)."""
    model = zoo_model(name, zoo_dir)
    profiles = [model.recipe_profile()["inputs"]]
    fp16 = tmp_path / "fp16.onnx"
    onnx.save(_rounded_copy(onnx.load(str(model.path))), fp16)
    tolerance = {"rtol": 1e-3, "atol": 1e-4, "samples": 3, "seed": 1}
    feeds = compare.sample_feeds(compare.session(model.path), profiles, 3, seed=2)
    results = []
    for limit in (compare.SIDE_BY_SIDE_MAX_BYTES, 0):
        monkeypatch.setattr(compare, "SIDE_BY_SIDE_MAX_BYTES", limit)
        assert compare.side_by_side(1) == (limit > 0)
        results.append(
            (
                compare.prove_equal(model.path, model.path, profiles, tolerance),
                accuracy.report(fp16, model.path, feeds, {"min_cosine": 0.99}, "random"),
            )
        )
    assert results[0] == results[1]
    assert results[0][0]["passed"] and results[0][1]["samples"] == 3


def _rounded_copy(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with its float initializers stored as fp16 behind a Cast (what a precision stage could make)."""
    for init in list(model.graph.initializer):
        if init.data_type == TensorProto.FLOAT and init.dims:
            half = numpy_helper.from_array(numpy_helper.to_array(init).astype(np.float16), init.name + "_h")
            model.graph.initializer.remove(init)
            model.graph.initializer.append(half)
            model.graph.node.insert(0, helper.make_node("Cast", [half.name], [init.name], to=TensorProto.FLOAT))
    return model


def test_a_miss_found_on_some_feeds_is_a_miss_on_all_of_them() -> None:
    """The fallback search stops a trial at the first feeds that miss a limit for good (accuracy.failed_for_good): that
    must never change its answer. Over 200 seeded cases of 6 feeds, every prefix judged failed for good fails on all
    the feeds too, and the early answer comes often (it is what saves the trials)."""
    rng = np.random.default_rng(0)
    tolerance = {"min_cosine": 0.99, "max_abs_error": 0.8, "min_top1": 0.9, "max_mean_rel_error": 0.2}
    early = 0
    for _ in range(200):
        want = [{"y": rng.standard_normal((4, 10))} for _ in range(6)]
        got = [{"y": w["y"] + rng.standard_normal((4, 10)) * rng.choice([0.01, 0.05, 0.2])} for w in want]
        if rng.random() < 0.1:
            got[int(rng.integers(6))]["y"][0, 0] = np.inf
        whole = accuracy.judged(got, want, {}, tolerance)
        for count in range(1, 7):
            if accuracy.failed_for_good(accuracy.judged(got[:count], want[:count], {}, tolerance), tolerance):
                assert not all(o["passed"] for o in whole)
                early += count < 6
                break
    assert early > 20


def test_top1_out_of_reach_on_some_feeds_misses_on_all_of_them() -> None:
    """A trial missing only top-1 agreement stops once the rows that disagree are more than the limit allows over all
    the feeds (accuracy.top1_out_of_reach): never a different answer. Over 200 seeded cases of 6 feeds of 8 rows, with
    no other limit, every prefix found out of reach misses on all the feeds, and the early answer comes often where
    failed_for_good, which does not count rows, gives none."""
    rng = np.random.default_rng(1)
    tolerance = {"min_top1": 0.9}
    early = 0
    for _ in range(200):
        want = [{"logits": rng.standard_normal((8, 10)), "features": rng.standard_normal((8, 3, 2))} for _ in range(6)]
        scale = rng.choice([0.05, 0.2, 0.5])
        got = [{name: value + rng.standard_normal(value.shape) * scale for name, value in w.items()} for w in want]
        whole = accuracy.judged(got, want, {}, tolerance)
        for count in range(1, 7):
            assert not accuracy.failed_for_good(accuracy.judged(got[:count], want[:count], {}, tolerance), tolerance)
            if accuracy.top1_out_of_reach(got[:count], want, {}, tolerance):
                assert not all(o["passed"] for o in whole)
                early += count < 6
                break
    assert early > 20
