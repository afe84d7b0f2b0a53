"""The cleanup stage on real ONNX models: onnxslim's passes, their switches, and the ONNX Runtime proof that catches a
broken cleanup."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import trtflow, write_project
from onnx import TensorProto, helper, numpy_helper
from zoo import zoo_model

ONE_TARGET = "targets: [rtx-ada]\n"
RECIPE = (
    """\
source: {onnx: models/bn.onnx}
profiles:
  - inputs:
      input: {min: [1, 3, 16, 16], opt: [2, 3, 16, 16], max: [4, 3, 16, 16]}
"""
    + ONE_TARGET
)


def conv_bn_dropout(rng: np.random.Generator) -> onnx.ModelProto:
    """Conv -> BatchNormalization -> Relu -> Dropout -> Identity -> pool -> Gemm, with a bias computed from two
    constants:
    what an exporter leaves behind for cleanup (9 nodes)."""

    def init(name: str, *shape: int, offset: float = 0.0) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.1 + offset).astype(np.float32), name)

    inits = [
        init("w", 8, 3, 3, 3),
        init("b", 8),
        init("scale", 8, offset=1.0),
        init("shift", 8),
        init("mean", 8),
        numpy_helper.from_array(rng.uniform(0.5, 1.5, 8).astype(np.float32), "var"),
        init("fc", 4, 8),
        init("half_a", 4),
        init("half_b", 4),
    ]
    nodes = [
        helper.make_node("Conv", ["input", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "scale", "shift", "mean", "var"], ["n"]),
        helper.make_node("Relu", ["n"], ["r"]),
        helper.make_node("Dropout", ["r"], ["d"]),
        helper.make_node("Identity", ["d"], ["i"]),
        helper.make_node("GlobalAveragePool", ["i"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Add", ["half_a", "half_b"], ["fc_bias"]),  # constant: folds away
        helper.make_node("Gemm", ["f", "fc", "fc_bias"], ["logits"], transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "bn",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 3, 16, 16])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 4])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def bn_project(root: Path, recipes: dict[str, str]) -> Path:
    write_project(root, recipes)
    onnx.save(conv_bn_dropout(np.random.default_rng(0)), root / "models" / "bn.onnx")
    return root


def cleanup_record(root: Path, recipe: str) -> dict:
    from trtflow.store import Store

    store = Store(root / "artifacts" / "store")
    try:
        return store.records.get(store.memos.last_run(f"cleanup:{recipe}")["key"])["record"]
    finally:
        store.close()


def test_cleanup_removes_nodes_proves_equality_and_each_pass_can_be_switched_off(tmp_path: Path) -> None:
    root = bn_project(
        tmp_path / "p",
        {
            "slim": RECIPE,
            "plain": RECIPE + "cleanup: {simplify: false}\n",
            "nofold": RECIPE + "cleanup: {fold_constants: false, fuse_patterns: false, opset: 18}\n",
        },
    )
    result = trtflow(root, "run", "--json")
    assert result.code == 0, result.err
    assert json.loads(result.out)["failed"] == 0
    slim, plain, nofold = (cleanup_record(root, name) for name in ("slim", "plain", "nofold"))
    assert slim["before"]["nodes"] == 9 and slim["after"]["ops"] == {
        "Conv": 1,
        "Flatten": 1,
        "Gemm": 1,
        "GlobalAveragePool": 1,
        "Relu": 1,
    }
    assert slim["equality"]["passed"] and slim["equality"]["outputs"][0]["name"] == "logits"
    assert {"fold_constants", "fuse_patterns", "remove_dead_nodes", "infer_shapes"} <= set(slim["passes"])
    assert (
        plain["after"]["nodes"] == 9 and "fold_constants" not in plain["passes"] and "infer_shapes" in plain["passes"]
    )
    assert (
        "fold_constants" not in nofold["passes"]
        and "opset 18" in nofold["passes"]
        and nofold["after"]["opsets"] == {"ai.onnx": 18}
    )
    # Dropout/Identity still removed; BatchNorm and the constant Add kept
    assert slim["after"]["nodes"] < nofold["after"]["nodes"] < 9


def test_changing_a_cleanup_option_is_explained_and_reruns_cleanup(tmp_path: Path) -> None:
    root = bn_project(tmp_path / "p", {"slim": RECIPE})
    assert trtflow(root, "run").code == 0
    recipe = root / "recipes" / "slim.yaml"
    recipe.write_text(recipe.read_text() + "cleanup: {tie_weights: false}\n")
    assert "options.tie_weights: default -> False" in trtflow(root, "plan", "--explain").out


def break_cleanup(monkeypatch: pytest.MonkeyPatch, root: Path, tmp_path: Path):
    """Make cleanup's passes perturb one weight (in this process); returns the source model as the stage's input."""
    from trtflow.stages import cleanup
    from trtflow.stages.base import Upstream

    clean = cleanup._clean

    def broken(onnx_module, model, options):
        model, passes = clean(onnx_module, model, options)
        weight = next(t for t in model.graph.initializer if t.data_type == TensorProto.FLOAT and t.raw_data)
        weight.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(weight) + 0.5, weight.name))
        return model, passes

    monkeypatch.setattr(cleanup, "_clean", broken)
    (tmp_path / "work").mkdir()
    return Upstream(files={"model": root / "models" / "bn.onnx"}, sha256={"model": "0" * 64})


def test_a_broken_cleanup_is_caught_by_the_onnx_runtime_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Cleanup's passes are made to perturb one weight (in this process); the equality proof must name the output."""
    from trtflow.errors import StageError
    from trtflow.recipe import load_project
    from trtflow.run.dag import dag_from_project
    from trtflow.stages import cleanup

    root = bn_project(tmp_path / "p", {"slim": RECIPE})
    node = dag_from_project(load_project(root)).nodes["cleanup:slim"]
    source = break_cleanup(monkeypatch, root, tmp_path)
    with pytest.raises(StageError) as failure:
        cleanup.run(node.params, {"model": source}, tmp_path / "work")
    assert str(failure.value).startswith(
        "the cleaned model differs from the source: onnx_compare out of tolerance (rtol 0.001, atol 0.0001): "
        "first differing output logits max abs "
    )


def test_changing_verify_on_fail_leaves_cleanup_cached(tmp_path: Path) -> None:
    """on_fail is a policy over the proof, not part of cleanup's key: it changes nothing cleanup makes."""
    root = bn_project(tmp_path / "p", {"slim": RECIPE})
    assert trtflow(root, "run").code == 0
    for on_fail in ("warn", "fail"):
        (root / "recipes" / "slim.yaml").write_text(RECIPE + f"verify: {{on_fail: {on_fail}}}\n")
        states = {node["id"]: node["status"] for node in json.loads(trtflow(root, "plan", "--json").out)["nodes"]}
        assert states["cleanup:slim"] == "cached", on_fail


def test_a_failed_proof_is_recorded_under_warn_and_fails_a_cached_cleanup_under_fail(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same key serves both policies, so the finish hook refuses a failed proof cached under warn once on_fail is
    fail."""
    from trtflow.errors import StageError
    from trtflow.recipe import load_project
    from trtflow.run.dag import dag_from_project
    from trtflow.stages import cleanup

    root = bn_project(tmp_path / "p", {"warn": RECIPE + "verify: {on_fail: warn}\n", "fail": RECIPE})
    nodes = dag_from_project(load_project(root)).nodes
    assert nodes["cleanup:warn"].params.key_parts() == nodes["cleanup:fail"].params.key_parts()
    source = break_cleanup(monkeypatch, root, tmp_path)
    output = cleanup.run(nodes["cleanup:warn"].params, {"model": source}, tmp_path / "work")
    assert output.record["equality"]["passed"] is False
    cached = {"record": output.record}
    assert cleanup.finish(nodes["cleanup:warn"], cached, None) is None
    cached_under_warn = r"\(a cached result built under verify: \{on_fail: warn\}\)$"
    with pytest.raises(StageError, match=r"^the cleaned model differs from the source: .* " + cached_under_warn):
        cleanup.finish(nodes["cleanup:fail"], cached, None)


@pytest.mark.parametrize(
    "shape, expected",
    [
        ({"min": [1, 3], "opt": [8, 3], "max": [32, 3]}, 2),  # opt and min differ on the batch axis: max adds nothing
        ({"min": [1, 3], "opt": [1, 3], "max": [32, 3]}, 3),  # opt = min: only the max shape moves the batch axis
        ({"min": [1, 3, 8], "opt": [4, 3, 8], "max": [8, 3, 16]}, 3),  # the last axis: opt = min
        ({"min": [2, 3], "opt": [2, 3], "max": [2, 3]}, 2),  # static
    ],
)
def test_a_rewrite_is_proven_at_two_shapes_when_they_move_every_dynamic_axis(shape: dict, expected: int) -> None:
    from trtflow.recipe.schema import VerifyOptions

    assert VerifyOptions().rewrite_samples_for([{"input": shape}, {"input": shape}]) == 2 * expected
    assert VerifyOptions(samples=5).rewrite_samples_for([{"input": shape}]) == 5


@pytest.mark.parametrize("name", ["resnet", "lstm", "encoder", "opweights"])
def test_shape_inference_without_the_weights_gives_what_onnx_gives(name: str, zoo_dir: Path) -> None:
    """Shape inference runs with the weights' bytes set aside: the same model comes out, and the input is untouched."""
    from trtflow.stages.weightless import infer_shapes

    model = onnx.load(str(zoo_model(name, zoo_dir).path))
    before = model.SerializeToString()
    for options in ({}, {"data_prop": True}, {"check_type": True, "data_prop": True}):
        expected = onnx.shape_inference.infer_shapes(model, **options).SerializeToString()
        assert infer_shapes(onnx, model, **options).SerializeToString() == expected, options
    assert model.SerializeToString() == before
