"""ModelOpt's whole-model passes on stand-ins without the weights (stages.weightless): AutoCast's and PTQ's models are
the same, byte for byte, shape inference gives what ONNX's own would, and the checker still refuses an invalid
graph."""

from __future__ import annotations

import contextlib
import importlib
from pathlib import Path
from typing import Any

import modelopt.onnx.utils
import numpy as np
import onnx
import onnx.version_converter
import pytest
from conftest import shared_dir
from families import family_model
from modelopt.onnx.autocast.precisionconverter import PrecisionConverter
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization.calibrate import HistogramCollector
from zoo import zoo_model

from trtflow.stages import convert, modelopt_passes, weightless
from trtflow.util.settings import PINNED

N = 256  # the weight is N x N fp32: 256 KiB, past SET_ASIDE_BYTES
AUTOCAST = {"keep_io_types": True, "keep_op_types": [], "keep_nodes": []}


def _graph() -> onnx.ModelProto:
    """y = Reshape(x @ w, shape); an If whose branch reads w; a small bias and an int64 shape stay in the stand-in."""
    rng = np.random.default_rng(3)
    weight = numpy_helper.from_array(rng.standard_normal((N, N)).astype(np.float32), "w")
    shape = numpy_helper.from_array(np.array([-1, N], dtype=np.int64), "shape")
    bias = numpy_helper.from_array(np.ones(N, dtype=np.float32), "b")
    branch = helper.make_graph(
        [helper.make_node("Identity", ["w"], ["w_out"])],
        "branch",
        [],
        [helper.make_tensor_value_info("w_out", TensorProto.FLOAT, [N, N])],
    )
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["xw"]),
        helper.make_node("Add", ["xw", "b"], ["biased"]),
        helper.make_node("Reshape", ["biased", "shape"], ["y"]),
        helper.make_node("If", ["flag"], ["chosen"], then_branch=branch, else_branch=branch),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", N]),
            helper.make_tensor_value_info("flag", TensorProto.BOOL, []),
        ],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["rows", N]),
            helper.make_tensor_value_info("chosen", TensorProto.FLOAT, [N, N]),
        ],
        [weight, shape, bias],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_the_stand_in_keeps_the_graph_and_drops_only_the_weights_bytes() -> None:
    model = _graph()
    light = weightless.stand_in(onnx, model)
    assert model.ByteSize() > N * N * 4 > 100 * light.ByteSize()
    kept = {t.name: t for t in light.graph.initializer}
    assert kept["w"].data_location == TensorProto.EXTERNAL and list(kept["w"].dims) == [N, N] and not kept["w"].raw_data
    assert kept["shape"] == model.graph.initializer[1] and kept["b"] == model.graph.initializer[2]
    assert light.graph.node == model.graph.node and light.opset_import == model.opset_import


def test_shape_inference_in_place_writes_what_onnx_would_and_keeps_the_weights() -> None:
    model = _graph()
    expected = onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=True).SerializeToString()
    weights = model.graph.initializer[0].raw_data
    inferred = weightless.infer_shapes_in_place(onnx, model, strict_mode=True, data_prop=True)
    assert inferred is model and model.SerializeToString() == expected
    assert model.graph.initializer[0].raw_data == weights
    assert {v.name for v in model.graph.value_info} >= {"xw", "biased"}


def test_the_inferred_copy_is_what_onnx_returns_and_the_model_stays_as_it_was() -> None:
    model = _graph()
    before = model.SerializeToString()
    expected = onnx.shape_inference.infer_shapes(model, data_prop=True).SerializeToString()
    inferred = weightless.infer_shapes(onnx, model, data_prop=True)
    assert inferred is not model and inferred.SerializeToString() == expected
    assert model.SerializeToString() == before


def test_shape_inference_by_path_writes_the_file_onnx_would(tmp_path: Path) -> None:
    """In place and to another file, the weights kept; ONNX's own call on a copy is the reference."""
    model = _graph()
    for name in ("ours.onnx", "own.onnx", "source.onnx"):
        onnx.save(model, tmp_path / name)
    onnx.shape_inference.infer_shapes_path(tmp_path / "own.onnx", data_prop=True)
    weightless.infer_shapes_path(onnx, tmp_path / "ours.onnx", data_prop=True)
    assert onnx.load(tmp_path / "ours.onnx") == onnx.load(tmp_path / "own.onnx")
    weightless.infer_shapes_path(onnx, tmp_path / "source.onnx", tmp_path / "out.onnx", data_prop=True)
    assert onnx.load(tmp_path / "out.onnx") == onnx.load(tmp_path / "own.onnx")
    assert onnx.load(tmp_path / "source.onnx") == model


def test_the_version_converter_on_the_stand_in_gives_what_onnx_would_with_the_weights() -> None:
    model = _graph()
    expected = onnx.version_converter.convert_version(model, 19)
    converted = weightless.convert_version(onnx, model, 19, onnx.version_converter.convert_version)
    assert converted == expected and converted.opset_import[0].version == 19


def test_shape_inference_that_fails_leaves_the_model_as_it_was() -> None:
    model = _graph()
    model.graph.node[0].input[1] = "shape"  # x @ int64 shape: a type error
    before = model.SerializeToString()
    with pytest.raises(onnx.shape_inference.InferenceError):
        weightless.infer_shapes_in_place(onnx, model, strict_mode=True)
    assert model.SerializeToString() == before


def test_the_checker_on_the_stand_in_still_refuses_an_invalid_graph() -> None:
    model = _graph()
    weightless.check(onnx, model)
    model.graph.node[1].input[0] = "nowhere"
    with pytest.raises(onnx.checker.ValidationError, match="nowhere"):
        weightless.check(onnx, model)


def test_the_checker_by_path_reads_the_file_and_refuses_an_invalid_graph(tmp_path: Path) -> None:
    model = _graph()
    onnx.save(model, tmp_path / "m.onnx")
    weightless.check(onnx, tmp_path / "m.onnx")
    model.graph.node[1].input[0] = "nowhere"
    onnx.save(model, tmp_path / "m.onnx")
    with pytest.raises(onnx.checker.ValidationError, match="nowhere"):
        weightless.check(onnx, str(tmp_path / "m.onnx"))


def _passes() -> tuple:
    """The functions the blocks replace, as they are now."""
    from modelopt.onnx.quantization import ort_patching
    from onnxruntime.quantization.calibrate import CalibraterBase, HistogramCalibrater, MinMaxCalibrater

    return (
        ort_patching._collect_data_histogram_calibrator,
        HistogramCalibrater.collect_data,
        ort_patching._collect_data_minmax_calibrator,
        MinMaxCalibrater.collect_data,
        modelopt.onnx.utils.infer_shapes,
        modelopt.onnx.utils.check_model,
        onnx.checker.check_model,
        onnx.shape_inference.infer_shapes_path,
        onnx.version_converter.convert_version,
        importlib.import_module("modelopt.onnx.quantization.quantize")._preprocess_onnx,
        HistogramCollector.get_entropy_threshold,
        ort_patching._create_inference_session_with_ep_config,
        CalibraterBase.create_inference_session,
        PrecisionConverter._cleanup_no_consumer_nodes,
    )


@pytest.mark.parametrize("block", [modelopt_passes.autocast_passes, modelopt_passes.quantize_passes])
def test_modelopt_and_onnx_get_their_own_passes_back_after_the_block_even_on_an_error(block: Any) -> None:
    before = _passes()
    with contextlib.suppress(RuntimeError), block(*([{}, {}] if block is modelopt_passes.quantize_passes else [])):
        assert _passes()[4] is not before[4] and _passes()[-1] is not before[-1]
        if block is modelopt_passes.quantize_passes:  # with histograms kept and extremes known: the loops wrapped
            assert _passes()[0] is not before[0] and _passes()[2] is not before[2]
            assert _passes()[-3] is not before[-3]  # its sessions in node order
        raise RuntimeError
    assert _passes() == before


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_autocast_makes_the_same_model_byte_for_byte(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch, precision: str
) -> None:
    """The Whisper-tiny encoder (33 MB of weights), converted as the stage converts it, with ModelOpt's own passes
    and with the stand-ins."""
    path = family_model("whisper", shared_dir(tmp_path_factory, "families")).path
    stand_ins, _ = convert.autocast(path, precision, AUTOCAST, {})
    monkeypatch.setattr(modelopt_passes, "autocast_passes", contextlib.nullcontext)
    own, _ = convert.autocast(Path(path), precision, AUTOCAST, {})
    assert stand_ins.SerializeToString() == own.SerializeToString()


@pytest.mark.parametrize(("name", "precision"), [("resnet", "int8"), ("encoder", "fp8")])
def test_ptq_makes_the_same_model_byte_for_byte_writing_only_the_copies_it_reads(
    tmp_path: Path, zoo_dir: Path, monkeypatch: pytest.MonkeyPatch, name: str, precision: str
) -> None:
    """ModelOpt's preprocessing saves a copy of the model after each step (value info cleared, opset 19) and reads
    the last: with the blocks, the copies replaced before anyone read them are not written."""
    quantize = importlib.import_module("modelopt.onnx.quantization.quantize")
    own_save, written = quantize.save_onnx, []

    def save(model: Any, path: str, *rest: Any) -> None:
        written.append(Path(path).name)
        own_save(model, path, *rest)

    monkeypatch.setattr(quantize, "save_onnx", save)
    model = zoo_model(name, zoo_dir)
    feeds = model.random_feeds(3, seed=7)
    method = "max" if precision == "fp8" else "entropy"
    options = {"method": method, "exclude_op_types": [], "exclude_nodes": [], "high_precision": "fp16"}
    options["external_data"] = False
    convert.quantize(model.path, tmp_path / "stand-ins" / "m.onnx", precision, feeds, options)
    with_blocks = written[:]
    written.clear()
    monkeypatch.setattr(modelopt_passes, "quantize_passes", lambda *_: contextlib.nullcontext())
    convert.quantize(model.path, tmp_path / "own" / "m.onnx", precision, feeds, options)
    assert (tmp_path / "stand-ins" / "m.onnx").read_bytes() == (tmp_path / "own" / "m.onnx").read_bytes()
    reconciled = [name for name in written if name.endswith("_reconciled.onnx")]
    assert reconciled and not set(reconciled) & set(with_blocks)
    assert len(with_blocks) < len(written) and written[len(written) - len(with_blocks) :] == with_blocks


def test_a_search_s_modelopt_runs_collect_each_histogram_once_and_quantize_the_same_bytes(
    tmp_path: Path, zoo_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fallback search quantizes the same model on the same data again, nodes excluded: with the histograms of the
    first run kept, the later run calibrates without running the model and writes the model a fresh run writes."""
    from modelopt.onnx.quantization import ort_patching

    own_collect, collected = ort_patching._collect_data_histogram_calibrator, []

    def collect(calibrator: Any, reader: Any) -> None:
        collected.append(len(calibrator.tensors_to_calibrate))
        own_collect(calibrator, reader)

    monkeypatch.setattr(ort_patching, "_collect_data_histogram_calibrator", collect)
    model = zoo_model("resnet", zoo_dir)
    feeds = model.random_feeds(3, seed=7)
    options = {"method": "entropy", "exclude_op_types": [], "high_precision": "fp16", "external_data": False}
    first = [n.name for n in onnx.load(model.path).graph.node if n.op_type == "Conv"][0]
    kept: dict = {}
    convert.quantize(model.path, tmp_path / "first" / "m.onnx", "int8", feeds, {**options, "exclude_nodes": []}, kept)
    assert len(collected) == 1 and len(kept) == collected[0] > 0
    excluding = {**options, "exclude_nodes": [f"^{first}$"]}
    convert.quantize(model.path, tmp_path / "again" / "m.onnx", "int8", feeds, excluding, kept)
    assert len(collected) == 1  # every histogram it needed was kept: the model did not run over the data again
    convert.quantize(model.path, tmp_path / "fresh" / "m.onnx", "int8", feeds, excluding)
    assert len(collected) == 2
    again, fresh = (tmp_path / "again" / "m.onnx").read_bytes(), (tmp_path / "fresh" / "m.onnx").read_bytes()
    assert again == fresh and again != (tmp_path / "first" / "m.onnx").read_bytes()


@pytest.mark.parametrize(("name", "precision"), [("resnet", "int8"), ("encoder", "fp8")])
def test_max_calibration_given_the_fp16_pass_s_extremes_runs_no_model_and_quantizes_the_same_bytes(
    tmp_path: Path, zoo_dir: Path, monkeypatch: pytest.MonkeyPatch, name: str, precision: str
) -> None:
    """A run's fp16 stage measures every float tensor's smallest and largest value over the calibration feeds
    (stages.ranges); max calibration (fp8's default, int8's `method: max`) given them runs no model over the data and
    writes the model it writes running it. Given too few tensors, it runs the model as ModelOpt does."""
    from modelopt.onnx.quantization import ort_patching

    from trtflow.stages.ranges import float_ranges

    own_collect, collected = ort_patching._collect_data_minmax_calibrator, []

    def collect(calibrator: Any, reader: Any) -> None:
        collected.append(len(calibrator.infer_session.get_outputs()))
        own_collect(calibrator, reader)

    monkeypatch.setattr(ort_patching, "_collect_data_minmax_calibrator", collect)
    model = zoo_model(name, zoo_dir)
    feeds = model.random_feeds(3, seed=7)
    options = {"method": "max", "exclude_op_types": [], "exclude_nodes": [], "high_precision": "fp16"}
    options["external_data"] = False
    known = {name: (np.float32(r.low), np.float32(r.high)) for name, r in float_ranges(model.path, feeds).items()}
    convert.quantize(model.path, tmp_path / "known" / "m.onnx", precision, feeds, options, None, known)
    assert not collected
    convert.quantize(model.path, tmp_path / "run" / "m.onnx", precision, feeds, options)
    assert len(collected) == 1
    assert (tmp_path / "known" / "m.onnx").read_bytes() == (tmp_path / "run" / "m.onnx").read_bytes()
    inputs_only = {name: known[name] for name in (i.name for i in onnx.load(model.path).graph.input) if name in known}
    convert.quantize(model.path, tmp_path / "partly" / "m.onnx", precision, feeds, options, None, inputs_only)
    assert len(collected) == 2
    assert (tmp_path / "partly" / "m.onnx").read_bytes() == (tmp_path / "run" / "m.onnx").read_bytes()


_PEAK_OF_FP8 = """
import contextlib, sys
from pathlib import Path
import numpy as np
from trtflow.stages import convert, modelopt_passes
from trtflow.util import memory
if sys.argv[2] == "default":
    modelopt_passes._calibration_in_node_order = contextlib.nullcontext
feeds = [{"input_features": np.random.default_rng(i).standard_normal((1, 80, 3000)).astype(np.float32)} for i in (1, 2)]
options = {"method": "max", "exclude_op_types": [], "exclude_nodes": [], "high_precision": "fp16"}
convert.modelopt_onnx()
memory.reset_peak()
before = memory.rss()
convert.quantize(Path(sys.argv[1]), Path(sys.argv[3]) / "m.onnx", "fp8", feeds, {**options, "external_data": False})
print(memory.peak_rss() - before)
"""


@pytest.mark.slow
def test_max_calibration_runs_in_node_order_holding_less_and_making_the_same_model(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """fp8's max calibration reduces each calibrated tensor beside its first reader: in ONNX Runtime's default order
    the Whisper-tiny encoder's tensors wait for their reductions (its fp8 stage peaked at 1.64 GiB), in node order they
    are freed as they are read (0.86 GiB). The model is the same, byte for byte."""
    import os
    import subprocess
    import sys

    path = family_model("whisper", shared_dir(tmp_path_factory, "families")).path
    peaks = {}
    for order in ("default", "node"):
        (tmp_path / order).mkdir()
        done = subprocess.run(
            [sys.executable, "-c", _PEAK_OF_FP8, str(path), order, str(tmp_path / order)],
            capture_output=True,
            text=True,
            env={**os.environ, **PINNED},  # the hash seed a worker runs with (AutoCast's value info follows it)
        )
        assert done.returncode == 0, done.stderr[-2000:]
        peaks[order] = int(done.stdout.split()[-1])
    assert (tmp_path / "node" / "m.onnx").read_bytes() == (tmp_path / "default" / "m.onnx").read_bytes()
    assert peaks["node"] < 0.75 * peaks["default"], peaks  # 0.62 GB against 0.99 measured, above the imports
