"""Constant Q/DQ chains computed once (stages.precomputed): a quantized model's check gives the same numbers, bit for
bit, as the model run as ModelOpt wrote it, and its weights' chains are gone from the graph it runs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from zoo import zoo_model

from trtflow.stages import accuracy, compare, convert, precomputed

N = 64  # the weight is N x N
OPTIONS = {"method": "entropy", "exclude_op_types": [], "exclude_nodes": [], "high_precision": "fp16"}


def _quantized(tmp_path: Path, zoo_dir: Path, name: str, precision: str, external: bool) -> tuple[Path, list[dict]]:
    """A zoo model quantized by ModelOpt as the precision stage calls it, saved (its weights beside it or inside)."""
    model = zoo_model(name, zoo_dir)
    feeds = model.random_feeds(3, seed=7)
    options = {**OPTIONS, "method": "max" if precision == "fp8" else "entropy", "external_data": external}
    path = tmp_path / f"{name}-{precision}.onnx"
    convert.quantize(model.path, path, precision, feeds, options)
    assert any(p != path for p in tmp_path.iterdir()) == external
    return path, feeds


def _weights_quantized_in_the_graph(graph: onnx.ModelProto) -> int:
    """Q/DQ nodes whose input is computed from initializers alone (a weight, cast from how it is stored)."""
    constant = {i.name for i in graph.graph.initializer}
    count = 0
    for node in graph.graph.node:
        if all(name in constant for name in node.input if name):
            constant.update(node.output)
            count += node.op_type in ("QuantizeLinear", "DequantizeLinear")
    return count


@pytest.mark.parametrize(
    ("name", "precision", "external"),
    [("resnet", "int8", False), ("efficientnet", "fp8", True), ("encoder", "fp8", False)],
)
def test_the_check_computes_what_the_model_as_written_does_bit_for_bit(
    tmp_path: Path, zoo_dir: Path, name: str, precision: str, external: bool
) -> None:
    path, feeds = _quantized(tmp_path, zoo_dir, name, precision, external)
    runnable, _ = accuracy.candidate_runnable(path)
    assert _weights_quantized_in_the_graph(runnable) > 5
    made = precomputed.prepared(path, runnable)
    assert made.values and _weights_quantized_in_the_graph(made.graph) == 0
    assert _weights_quantized_in_the_graph(runnable) > 5  # the graph given is left as it was
    want = compare.run_all(compare.session_beside(path, runnable), feeds)
    got = compare.run_all(precomputed.session(path, made), feeds)
    assert all(np.array_equal(g[k], w[k]) for g, w in zip(got, want, strict=True) for k in w)
    assert [i.name for i in precomputed.session(path, made).get_inputs()] == list(feeds[0])


def _chain_model() -> onnx.ModelProto:
    """y = x @ DQ(Q(w)) with an fp16 scale cast in, reshaped by a cast shape; an If reads the weight's value too, and
    so does the graph's last output (as a search's baseline gives a cut's values)."""
    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.standard_normal((N, N)).astype(np.float32), "w")
    scale = numpy_helper.from_array(np.array(0.02, np.float16), "scale16")
    shape = numpy_helper.from_array(np.array([1, N * N], np.int32), "shape32")
    nodes = [
        helper.make_node("Cast", ["scale16"], ["scale"], to=TensorProto.FLOAT),
        helper.make_node("QuantizeLinear", ["w", "scale"], ["wq"]),
        helper.make_node("DequantizeLinear", ["wq", "scale"], ["wd"]),
        helper.make_node("MatMul", ["x", "wd"], ["y"]),
        helper.make_node("Cast", ["shape32"], ["shape"], to=TensorProto.INT64),
        helper.make_node("Reshape", ["y", "shape"], ["flat"]),
        helper.make_node(
            "If",
            ["flag"],
            ["out"],
            then_branch=helper.make_graph(
                [helper.make_node("ReduceSum", ["wd"], ["s"], keepdims=0)],
                "then",
                [],
                [helper.make_tensor_value_info("s", TensorProto.FLOAT, [])],
            ),
            else_branch=helper.make_graph(
                [helper.make_node("ReduceSum", ["flat"], ["t"], keepdims=0)],
                "else",
                [],
                [helper.make_tensor_value_info("t", TensorProto.FLOAT, [])],
            ),
        ),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [N, N]),
            helper.make_tensor_value_info("flag", TensorProto.BOOL, []),
        ],
        [
            helper.make_tensor_value_info("flat", TensorProto.FLOAT, [1, N * N]),
            helper.make_tensor_value_info("out", TensorProto.FLOAT, []),
            helper.make_tensor_value_info("wd", TensorProto.FLOAT, [N, N]),  # asked for: the value fed, given back
        ],
        [weight, scale, shape],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)], ir_version=9)


@pytest.mark.parametrize("listed", [False, True])
def test_only_chains_through_a_dequantize_are_computed(tmp_path: Path, listed: bool) -> None:
    """A Cast of a shape constant stays (ONNX Runtime reads a Reshape's shape as it is); a weight's Q/DQ chain, and
    the Cast of its fp16 scale into it, go; a value also read inside a subgraph is still given to it. `listed`: the
    weight is a graph input too (initializers as overridable inputs, as IR 3 models list them): it goes with them."""
    model, path = _chain_model(), tmp_path / "m.onnx"
    if listed:
        model.graph.input.append(helper.make_tensor_value_info("w", TensorProto.FLOAT, [N, N]))
    onnx.save(model, path)
    made = precomputed.prepared(path, model)
    assert sorted(made.values) == ["wd"]
    assert [n.op_type for n in made.graph.graph.node] == ["MatMul", "Cast", "Reshape", "If"]
    assert sorted(i.name for i in made.graph.graph.initializer) == ["shape32"]
    assert [i.name for i in precomputed.session(path, made).get_inputs()] == ["x", "flag"]
    rng = np.random.default_rng(1)
    feeds = [{"x": rng.standard_normal((N, N)).astype(np.float32), "flag": np.array(flag)} for flag in (True, False)]
    want = compare.run_all(compare.session_beside(path, model), feeds)
    got = compare.run_all(precomputed.session(path, made), feeds)
    assert all(np.array_equal(g[k], w[k]) for g, w in zip(got, want, strict=True) for k in w)


def test_past_the_budget_the_model_runs_as_it_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model, path = _chain_model(), tmp_path / "m.onnx"
    onnx.save(model, path)
    monkeypatch.setattr(precomputed, "PRECOMPUTED_MAX_BYTES", 4 * N * N - 1)  # one less than the weight's values
    made = precomputed.prepared(path, model)
    assert made.graph is model and not made.values
    monkeypatch.setattr(precomputed, "PRECOMPUTED_MAX_BYTES", 4 * N * N)
    assert list(precomputed.prepared(path, model).values) == ["wd"]


def test_a_memo_computes_a_chain_once_for_every_variant_that_has_it(tmp_path: Path, zoo_dir: Path) -> None:
    """A fallback search's trial models share most weight chains (fallback_trial.Trial.chain_values): with a memo, a
    second variant computes only the chain whose weights differ, and every value is what it is without the memo."""
    path, _ = _quantized(tmp_path, zoo_dir, "resnet", "int8", False)
    runnable, _ = accuracy.candidate_runnable(path)
    memo: dict = {}
    first = precomputed.prepared(path, runnable, memo)
    assert len(memo) == len(first.values) > 5
    variant = onnx.ModelProto()
    variant.CopyFrom(runnable)
    weights = {i.name: i for i in variant.graph.initializer}
    stored = weights[precomputed._constant_chains(variant)[0].input[0]]  # the first weight as ModelOpt stored it
    stored.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(stored) * 2, stored.name))
    second = precomputed.prepared(path, variant, memo)
    alone = precomputed.prepared(path, variant)
    changed = [name for name in second.values if second.values[name] is not first.values.get(name)]
    assert len(memo) == len(first.values) + len(changed) and 1 <= len(changed) < len(first.values) // 2
    assert second.values.keys() == alone.values.keys()
    assert all(np.array_equal(second.values[name], alone.values[name]) for name in alone.values)
    assert any(not np.array_equal(second.values[name], first.values[name]) for name in changed)


def test_a_memo_past_the_budget_keeps_only_the_last_variant(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Variants whose chains all differ do not pile up in a memo: past PRECOMPUTED_MAX_BYTES it holds what the last
    variant reads, and each variant still gets its own values."""
    model, path = _chain_model(), tmp_path / "m.onnx"
    onnx.save(model, path)
    monkeypatch.setattr(precomputed, "PRECOMPUTED_MAX_BYTES", 4 * N * N)  # one chain's values
    memo: dict = {}
    for factor in (1, 2, 3):
        variant = onnx.ModelProto()
        variant.CopyFrom(model)
        weight = variant.graph.initializer[0]
        weight.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(weight) * factor, weight.name))
        made = precomputed.prepared(path, variant, memo)
        assert np.array_equal(made.values["wd"], precomputed.prepared(path, variant).values["wd"])
        assert len(memo) == 1 and next(iter(memo.values())) is made.values["wd"]


def test_a_check_of_one_sample_runs_its_chains_in_that_run_with_the_same_numbers(
    tmp_path: Path, zoo_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Computing the chains first pays only when more than one run reads them."""
    path, feeds = _quantized(tmp_path, zoo_dir, "resnet", "int8", False)
    reference = zoo_model("resnet", zoo_dir).path
    own, computed = precomputed._computed, []
    monkeypatch.setattr(precomputed, "_computed", lambda *args: computed.append(args[0]) or own(*args))
    tolerance = {"min_cosine": 0.9}
    one = accuracy.report(path, reference, feeds[:1], tolerance, "random")
    assert not computed
    twice = accuracy.report(path, reference, feeds[:1] * 2, tolerance, "random")
    assert computed == [path]
    assert one["outputs"] == twice["outputs"]  # the same sample twice: its numbers, whichever way its chains ran
