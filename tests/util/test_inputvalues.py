"""Integer inputs take values the model accepts, read from the graph (trtflow/util/inputvalues.py): token ids within
their embedding table, masks of ones with a padded tail; the recipe's `inputs:` overrides; unknown ones are named."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import stage_record, trtflow, write_project
from onnx import TensorProto, helper, numpy_helper

from trtflow.util.inputvalues import inferred_values, mask_carrying_nodes, padded_mask, values_for


def attention_like() -> onnx.ModelProto:
    """ids -> Gather(words [100, 8]); types -> Unsqueeze -> Gather(type_table [2, 8]); mask -> Cast -> Sub -> Mul ->
    Add(scores) -> Softmax -> MatMul; positions -> Gather(axis 1 of a [8, 16] table); steps -> Range (unknown)."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal((100, 8)).astype(np.float32), "words"),
        numpy_helper.from_array(rng.standard_normal((2, 8)).astype(np.float32), "type_table"),
        numpy_helper.from_array(rng.standard_normal((8, 16)).astype(np.float32), "positions_table"),
        numpy_helper.from_array(np.array(1.0, np.float32), "one"),
        numpy_helper.from_array(np.array(np.finfo(np.float32).min, np.float32), "lowest"),
        numpy_helper.from_array(np.array([1], np.int64), "axis1"),
    ]
    nodes = [
        helper.make_node("Gather", ["words", "ids"], ["w"], name="embed_words"),
        helper.make_node("Unsqueeze", ["types", "axis1"], ["t_u"], name="unsqueeze_types"),
        helper.make_node("Squeeze", ["t_u", "axis1"], ["t_s"], name="squeeze_types"),
        helper.make_node("Gather", ["type_table", "t_s"], ["t"], name="embed_types"),
        helper.make_node("Add", ["w", "t"], ["e"], name="sum"),
        helper.make_node("MatMul", ["e", "e_t"], ["scores"], name="qk"),
        helper.make_node("Transpose", ["e"], ["e_t"], perm=[0, 2, 1], name="kt"),
        helper.make_node("Cast", ["mask"], ["m_f"], to=TensorProto.FLOAT, name="mask_cast"),
        helper.make_node("Sub", ["one", "m_f"], ["m_inv"], name="mask_invert"),
        helper.make_node("Mul", ["m_inv", "lowest"], ["m_add"], name="mask_scale"),
        helper.make_node("Unsqueeze", ["m_add", "axis1"], ["m_b"], name="mask_broadcast"),
        helper.make_node("Add", ["scores", "m_b"], ["masked"], name="mask_add"),
        helper.make_node("Softmax", ["masked"], ["probs"], axis=-1, name="softmax"),
        helper.make_node("MatMul", ["probs", "e"], ["out"], name="pv"),
        helper.make_node("Gather", ["positions_table", "pos"], ["p"], axis=1, name="embed_positions"),
    ]
    ints = TensorProto.INT64
    graph = helper.make_graph(
        nodes,
        "attention_like",
        [
            helper.make_tensor_value_info("ids", ints, ["batch", "sequence"]),
            helper.make_tensor_value_info("types", ints, ["batch", "sequence"]),
            helper.make_tensor_value_info("mask", ints, ["batch", "sequence"]),
            helper.make_tensor_value_info("pos", ints, ["batch", "sequence"]),
            helper.make_tensor_value_info("steps", ints, []),
            helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", 8]),
        ],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_token_ids_index_their_table_masks_are_masks_and_floats_are_left_alone() -> None:
    found = inferred_values(attention_like())
    assert set(found) == {"ids", "types", "mask", "pos", "steps"}
    assert (found["ids"].kind, found["ids"].low, found["ids"].high) == ("range", 0, 99)
    assert (found["types"].kind, found["types"].high) == ("range", 1)  # through Unsqueeze and Squeeze
    assert "type_table (2 rows)" in found["types"].why
    assert (found["mask"].kind, found["mask"].low, found["mask"].high) == ("mask", 0, 1)
    assert found["pos"].high == 15  # axis 1 of an [8, 16] table
    assert found["steps"] is None


def test_the_recipe_overrides_what_the_graph_says_and_unknown_inputs_keep_the_old_range() -> None:
    values = values_for(attention_like(), {"types": (0, 0), "features": (0, 3)})
    assert (values["types"].low, values["types"].high, values["types"].why) == (0, 0, "the recipe")
    assert (values["steps"].low, values["steps"].high, values["steps"].why) == (0, 7, "unknown")
    assert values["ids"].high == 99


@pytest.mark.parametrize("shape", [[4, 16], [2, 1], [3, 2, 5]])
def test_a_drawn_mask_is_ones_then_zeros_with_at_least_one_one_per_row(shape: list[int]) -> None:
    mask = padded_mask(np.random.default_rng(1), shape)
    assert mask.shape == tuple(shape)
    rows = mask.reshape(-1, shape[-1])
    assert rows[:, 0].all()
    assert (np.diff(rows, axis=1) <= 0).all()  # never a one after a zero


def test_drawn_values_are_seeded_and_within_the_table() -> None:
    values = inferred_values(attention_like())["ids"]
    first = values.draw(np.random.default_rng(5), [8, 128], "int64")
    again = values.draw(np.random.default_rng(5), [8, 128], "int64")
    assert np.array_equal(first, again) and first.min() >= 0 and first.max() <= 99 and first.dtype == np.int64


def test_the_nodes_an_additive_mask_reaches_stop_at_the_softmax() -> None:
    assert mask_carrying_nodes(attention_like()) == [
        "mask_add",
        "mask_broadcast",
        "mask_cast",
        "mask_invert",
        "mask_scale",
    ]


def attention_project(root: Path, shapes: dict[str, str] | None = None) -> Path:
    """A project whose model is attention_like() with `steps` and `features` dropped (fp32, one target)."""
    model = attention_like()
    keep = [i for i in model.graph.input if i.name not in ("steps", "features")]
    del model.graph.input[:]
    model.graph.input.extend(keep)
    shapes = shapes or {}
    lines = "".join(
        f"      {name}: {shapes.get(name, '{min: [1, 4], opt: [2, 8], max: [4, 16]}')}\n"
        for name in ("ids", "types", "mask", "pos")
    )
    root = write_project(
        root, {"m": f"source: {{onnx: models/m.onnx}}\ntargets: [rtx-ada]\nprofiles:\n  - inputs:\n{lines}"}
    )
    onnx.save(model, root / "models" / "m.onnx")
    return root


def test_cleanups_proof_draws_token_types_within_their_two_rows(tmp_path: Path) -> None:
    """Drawn in [0, 8), token type 7 indexed a 2-row table: ONNX Runtime refused the proof (`idx=7 must be within
    [-2,1]`), and a model that was fine could not be built."""
    root = attention_project(tmp_path / "p")
    result = trtflow(root, "run")
    assert result.code == 0, result.err
    assert stage_record(root, "cleanup:m")["equality"]["passed"]


def test_a_profile_must_agree_on_the_axes_its_inputs_share(tmp_path: Path) -> None:
    root = attention_project(tmp_path / "p", {"mask": "{min: [1, 4], opt: [2, 8], max: [4, 12]}"})
    result = trtflow(root, "validate")
    assert result.code == 3
    shared = "axis 1 is 'sequence' in the model, shared with ids, which is 16 there, not 12"
    assert f"profiles[0].inputs.mask.max: {shared}" in result.err


def test_validate_names_an_integer_input_it_cannot_tell_and_refuses_values_for_a_float_one(tmp_path: Path) -> None:
    model = attention_like()
    del model.graph.input[4:]  # keep ids, types, mask, pos
    model.graph.input.append(helper.make_tensor_value_info("steps", TensorProto.INT64, ["batch", "sequence"]))
    model.graph.node.append(helper.make_node("Shape", ["steps"], ["steps_shape"]))
    root = attention_project(tmp_path / "p")
    onnx.save(model, root / "models" / "m.onnx")
    recipe = root / "recipes" / "m.yaml"
    recipe.write_text(recipe.read_text() + "      steps: {min: [1, 4], opt: [2, 8], max: [4, 16]}\n")
    result = trtflow(root, "validate")
    assert result.code == 0, result.err
    assert "integer input 'steps' indexes no table and is used as no mask: trtflow draws 0-7 for it" in result.err
    recipe.write_text(recipe.read_text() + "inputs:\n  steps: {values: [0, 3]}\n")
    assert "steps" not in trtflow(root, "validate").err
    recipe.write_text(recipe.read_text() + "  stpes: {values: [0, 3]}\n")
    refused = trtflow(root, "validate")
    assert refused.code == 3 and "inputs.stpes: 'stpes' is no input of the model" in refused.err


def test_calibration_files_are_held_to_the_values_their_model_accepts(tmp_path: Path) -> None:
    """A token type of 5 for a 2-row table reached ONNX Runtime inside ModelOpt; now the file and input are named."""
    root = attention_project(tmp_path / "p")
    model = onnx.load(root / "models" / "m.onnx")  # without `pos`, which feeds nothing the output needs
    kept = [i for i in model.graph.input if i.name != "pos"]
    del model.graph.input[:]
    model.graph.input.extend(kept)
    kept_nodes = [n for n in model.graph.node if n.name != "embed_positions"]
    del model.graph.node[:]
    model.graph.node.extend(kept_nodes)
    onnx.save(model, root / "models" / "m.onnx")
    recipe = root / "recipes" / "m.yaml"
    text = recipe.read_text().replace("      pos: {min: [1, 4], opt: [2, 8], max: [4, 16]}\n", "")
    recipe.write_text(text + "precisions: [fp16]\ncalibration: {data: calib/*.npz}\n")
    (root / "calib").mkdir()
    rng = np.random.default_rng(0)
    for index, types in enumerate((1, 1, 5)):
        np.savez(
            root / "calib" / f"b{index}.npz",
            ids=rng.integers(0, 100, (2, 8)),
            types=np.full((2, 8), types),
            mask=np.ones((2, 8), np.int64),
        )
    result = trtflow(root, "run")
    assert result.code == 1
    assert (
        "calibration.data: calib/b2.npz: input 'types' holds 5, outside [0, 1] (indexes type_table (2 rows)); fix the "
        "file, or set inputs.types.values if the model does accept it"
    ) in result.err, result.err
