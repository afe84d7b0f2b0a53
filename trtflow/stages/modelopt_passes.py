"""What trtflow replaces inside ModelOpt while AutoCast or PTQ runs: passes that compute the same result for less.

ModelOpt's whole-model passes serialize the whole model, weights included, and parse it again in C++. Neither shape
inference nor the checker reads a weight's values, so while a conversion runs they run on a stand-in without the
weights (stages.weightless):
- AutoCast (fp16/bf16, `autocast_passes`): `modelopt.onnx.utils.infer_shapes` (five calls) in place, and
  `check_model` (two). On a 142M-parameter UNet the conversion peaked at 1.95 GiB instead of 4.49.
- PTQ (int8/fp8, `quantize_passes`): the same `infer_shapes`, with the weights copied into its result (PTQ keeps the
  model it passed in), `check_model` in the fp16 conversion that follows quantization, and ONNX's own
  `shape_inference.infer_shapes_path` and `checker.check_model`, which ModelOpt calls on its files (loading the
  model, and on the quantized model it writes), and its `version_converter.convert_version` (opset 19 for Q/DQ).
PTQ's per-channel int8 weight scales are computed a weight at a time, not a channel at a time (stages.weight_scales),
and its entropy calibration's ranges without ONNX Runtime's Python loops (stages.entropy_calibration). A fallback
search's later PTQ runs take the histograms its first run collected (`_histograms_remembered`). PTQ's calibration
sessions run the graph in node order (`_calibration_in_node_order`): fp8's max calibration held every tensor it
measured until its reduction ran (the Whisper-tiny encoder's fp8 stage: 1.64 GiB, 0.86 GiB in node order).
PTQ's preprocessing writes the whole model to a new file after each step that changed it and reads only the last
(`_preprocessing_writes_its_last_copy`): the copies another replaces are not written.
Both: AutoCast's cleanup looks up each node's consumers by scanning every node (`_cleanup_no_consumer_nodes`,
quadratic: 7.9 s of BERT-base's int8); here it scans once, into a set.

Every result is the same, byte for byte: tests/stages/test_weightless.py converts with and without these blocks.
The functions are replaced only for the length of the call, one block at a time in a process (a stage runs in a
forked child, so nothing else in that process sees them).
"""

from __future__ import annotations

import contextlib
import importlib
import threading
from collections.abc import Iterator, Mapping
from typing import Any

from trtflow.stages import entropy_calibration, weight_scales, weightless

_PATCHED = threading.RLock()  # a block inside another (same thread) restores in turn


@contextlib.contextmanager
def autocast_passes() -> Iterator[None]:
    """While the block runs, AutoCast's shape inference and checker run on stand-ins and its cleanup scans once.
    AutoCast assigns each inference's result back (`model = infer_types(model)`), so inference in place is what it
    sees."""
    import onnx

    with (
        _replaced(
            _modelopt_utils(),
            infer_shapes=lambda model, **options: weightless.infer_shapes_in_place(onnx, model, **options),
            check_model=lambda model: weightless.check(onnx, model),
        ),
        _cleanup_scanning_once(),
    ):
        yield


@contextlib.contextmanager
def quantize_passes(calibrated: dict | None = None, known: Mapping[str, tuple] | None = None) -> Iterator[None]:
    """While the block runs, PTQ's shape inference and checks (its own and ONNX's, on files) run on stand-ins, and
    the fp16 conversion's cleanup scans once, and calibration runs in node order. With `calibrated` (a dict kept
    across the calls of one stage on the same model and calibration data), histogram calibration collects each
    activation's histogram once (`_histograms_remembered`); with `known` (each tensor's extremes over the same data),
    max calibration takes them instead of running the model (`_extremes_known`)."""
    import onnx
    import onnx.version_converter

    own_check, own_convert = onnx.checker.check_model, onnx.version_converter.convert_version
    with (
        _replaced(
            _modelopt_utils(),
            infer_shapes=lambda model, **options: weightless.infer_shapes(onnx, model, **options),
            check_model=lambda model: weightless.check(onnx, model, own_check),
        ),
        _replaced(
            onnx.checker,
            check_model=lambda model, full_check=False, **options: (
                own_check(model, full_check, **options)
                if full_check
                else weightless.check(onnx, model, own_check, **options)
            ),
        ),
        _replaced(
            onnx.version_converter,
            convert_version=lambda model, target: weightless.convert_version(onnx, model, target, own_convert),
        ),
        _replaced(
            onnx.shape_inference,
            infer_shapes_path=lambda model_path, output_path="", **options: weightless.infer_shapes_path(
                onnx, model_path, output_path, **options
            ),
        ),
        _cleanup_scanning_once(),
        _weight_scales_at_once(),
        _entropy_thresholds_at_once(),
        _preprocessing_writes_its_last_copy(),
        _histograms_remembered(calibrated),
        _extremes_known(known),
        _calibration_in_node_order(),
    ):
        yield


def _modelopt_utils() -> Any:
    """ModelOpt's ONNX utilities, through which AutoCast and PTQ call their whole-model passes."""
    import modelopt.onnx.utils as utils

    return utils


@contextlib.contextmanager
def _cleanup_scanning_once() -> Iterator[None]:
    """AutoCast's `_cleanup_no_consumer_nodes` replaced by `_without_unread_nodes` while the block runs."""
    from modelopt.onnx.autocast.precisionconverter import PrecisionConverter

    with _replaced(PrecisionConverter, _cleanup_no_consumer_nodes=_without_unread_nodes):
        yield


@contextlib.contextmanager
def _weight_scales_at_once() -> Iterator[None]:
    """ONNX Runtime's QDQ quantizer computes per-channel integer weight scales a weight at a time (stages.weight_scales)
    while the block runs."""
    from onnxruntime.quantization.qdq_quantizer import QDQQuantizer

    own = QDQQuantizer._calc_initializer_quant_params
    with _replaced(
        QDQQuantizer,
        _calc_initializer_quant_params=lambda quantizer: weight_scales.calc_initializer_quant_params(quantizer, own),
    ):
        yield


@contextlib.contextmanager
def _entropy_thresholds_at_once() -> Iterator[None]:
    """ONNX Runtime's entropy calibration finds each activation's range without its Python loops while the block runs
    (stages.entropy_calibration)."""
    from onnxruntime.quantization.calibrate import HistogramCollector

    with _replaced(
        HistogramCollector,
        get_entropy_threshold=lambda _collector, histogram, levels: entropy_calibration.entropy_threshold(
            histogram, levels
        ),
    ):
        yield


@contextlib.contextmanager
def _preprocessing_writes_its_last_copy() -> Iterator[None]:
    """PTQ's `_preprocess_onnx` saves the whole model to a new file after each step that changed it (`_reconciled`
    once it clears the value info, `_opset19` after the opset conversion, `_named` after naming nodes or duplicating
    shared constants), changes it in memory between them, and returns the last file's path: nothing reads the others.
    While the block runs, each save waits for the next, which drops it, and the last is written as the preprocessing
    returns, from the same model (every later change to it is followed by a save). A path returned that is not the
    last saved one would mean ModelOpt's preprocessing works otherwise now: the call fails rather than go on with a
    file that was not written."""
    quantize = importlib.import_module("modelopt.onnx.quantization.quantize")  # the package's `quantize` is a function
    preprocess, save = quantize._preprocess_onnx, quantize.save_onnx

    def last_copy_only(*args: Any, **kwargs: Any) -> Any:
        pending: list[tuple[tuple, dict]] = []

        def later(*saving: Any, **options: Any) -> None:
            pending[:] = [(saving, options)]  # the copy it replaces was never read

        with _replaced(quantize, save_onnx=later):
            result = preprocess(*args, **kwargs)
        if pending:
            saving, options = pending[0]
            if (saving[1] if len(saving) > 1 else options.get("onnx_path")) != result[0]:
                raise RuntimeError(f"ModelOpt's preprocessing returned {result[0]}, not the model it saved last")
            save(*saving, **options)
        return result

    with _replaced(quantize, _preprocess_onnx=last_copy_only):
        yield


@contextlib.contextmanager
def _histograms_remembered(calibrated: dict | None) -> Iterator[None]:
    """Histogram calibration (int8's default, entropy) through `calibrated` while the block runs: a call whose every
    activation's histogram is there takes them, without running the model over the data; any other collects as
    ModelOpt does and keeps what it collected there (max calibration, fp8's default, is left as it is). A fallback
    search's ModelOpt runs calibrate the same fp32 model on the same data, and quantize a subset of the first run's
    nodes: their histograms are the first run's, value for value (each depends only on its activation's values, batch
    after batch). The key holds what else a histogram depends on: the graph's nodes, the collector's settings, the
    tensors ONNX Runtime merges into it (a Q/DQ group).

    ModelOpt installs its calibration loop on ONNX Runtime's calibrator in every call (`patch_ort_modules`, from its
    module's globals): the loop is wrapped there, and the calibrator's own restored after the block."""
    if calibrated is None:
        yield
        return
    from modelopt.onnx.quantization import ort_patching
    from onnxruntime.quantization.calibrate import HistogramCalibrater, HistogramCollector

    collect = ort_patching._collect_data_histogram_calibrator

    def remembering(calibrator: Any, data_reader: Any) -> None:
        keys = _histogram_keys(calibrator)
        if keys and all(key in calibrated for key in keys.values()):
            calibrator.collector = HistogramCollector(
                method=calibrator.method,
                symmetric=calibrator.symmetric,
                num_bins=calibrator.num_bins,
                num_quantized_bins=calibrator.num_quantized_bins,
                percentile=calibrator.percentile,
                scenario=calibrator.scenario,
            )
            calibrator.collector.histogram_dict = {name: calibrated[key] for name, key in keys.items()}
            return
        collect(calibrator, data_reader)
        collected = calibrator.collector.histogram_dict if calibrator.collector else {}
        calibrated.update({key: collected[name] for name, key in keys.items() if name in collected})

    with (
        _replaced(HistogramCalibrater, collect_data=HistogramCalibrater.collect_data),
        _replaced(ort_patching, _collect_data_histogram_calibrator=remembering),
    ):
        yield


@contextlib.contextmanager
def _extremes_known(known: Mapping[str, tuple] | None) -> Iterator[None]:
    """Max calibration (fp8's default, int8's `method: max`) takes each tensor's smallest and largest value over the
    data from `known` while the block runs, instead of running the model over the data, when it holds every tensor the
    calibrator measures (what the run's fp16 stage measured on the same model and the same feeds, stages.ranges and
    stages.shared_outputs: the same kernels, ONNX Runtime with no graph rewrite, so the same values, and an extreme is
    exact whichever pass finds it). ModelOpt's own reduction then runs over one batch holding those extremes: its
    minimum of minima and maximum of maxima come out as over the batches one by one, value for value and type for
    type. Any other calibrator (a tensor not held, a moving average, a type but float32) collects as ModelOpt does.

    ModelOpt installs its collection loop on ONNX Runtime's calibrator in every call (`patch_ort_modules`, from its
    module's globals): the loop is wrapped there."""
    if known is None:
        yield
        return
    import numpy as np
    from modelopt.onnx.quantization import ort_patching
    from onnxruntime.quantization.calibrate import MinMaxCalibrater

    collect = ort_patching._collect_data_minmax_calibrator

    def from_known(calibrator: Any, data_reader: Any) -> None:
        added = calibrator.infer_session.get_outputs()[calibrator.num_model_outputs :]
        measured = [output.name.rpartition("_") for output in added]  # (tensor, "_", ReduceMin or ReduceMax)
        if (
            calibrator.moving_average
            or any(output.type != "tensor(float)" for output in added)
            or any(op not in EXTREMES or tensor not in known for tensor, _, op in measured)
        ):
            collect(calibrator, data_reader)
            return
        extremes = [np.array([known[tensor][EXTREMES[op]]], np.float32) for tensor, _, op in measured]
        calibrator.intermediate_outputs.append([np.empty(0, np.float32)] * calibrator.num_model_outputs + extremes)
        calibrator.compute_data()
        calibrator.clear_collected_data()

    with (
        _replaced(MinMaxCalibrater, collect_data=MinMaxCalibrater.collect_data),
        _replaced(ort_patching, _collect_data_minmax_calibrator=from_known),
    ):
        yield


EXTREMES = {"ReduceMin": 0, "ReduceMax": 1}  # what each of max calibration's reductions measures: (low, high)[i]


@contextlib.contextmanager
def _calibration_in_node_order() -> Iterator[None]:
    """ModelOpt's calibration sessions run the graph in its node order (ONNX Runtime's priority-based order) while the
    block runs: each node computes what it computes in any order, so every range and histogram is the same. Max
    calibration (fp8's default) places a ReduceMin and a ReduceMax beside each tensor it calibrates, before the
    tensor's first reader; ONNX Runtime's default order (a reverse depth-first walk from the outputs, stages.compare)
    runs them far from it and keeps the tensors alive until then: the Whisper-tiny encoder's max calibration session
    peaked 1.63 GiB above what the process held before, 0.20 GiB in node order.

    ModelOpt installs its session factory on ONNX Runtime's calibrators in every call (`patch_ort_modules`, from its
    module's globals): the factory is wrapped there, and the calibrators' own restored after the block."""
    import onnxruntime as ort
    from modelopt.onnx.quantization import ort_patching
    from onnxruntime.quantization.calibrate import CalibraterBase

    create, options = ort_patching._create_inference_session_with_ep_config, ort.SessionOptions

    def in_node_order() -> Any:
        made = options()
        made.execution_order = ort.ExecutionOrder.PRIORITY_BASED
        return made

    def creating(calibrator: Any, *args: Any, **kwargs: Any) -> Any:
        with _replaced(ort, SessionOptions=in_node_order):  # the options ModelOpt makes for this session alone
            return create(calibrator, *args, **kwargs)

    with (
        _replaced(CalibraterBase, create_inference_session=CalibraterBase.create_inference_session),
        _replaced(ort_patching, _create_inference_session_with_ep_config=creating),
    ):
        yield


def _histogram_keys(calibrator: Any) -> dict[str, tuple]:
    """Each activation a histogram calibrator collects, keyed by what its histogram depends on besides the data."""
    import hashlib

    nodes = hashlib.sha256(b"".join(node.SerializeToString() for node in calibrator.model.graph.node)).hexdigest()
    settings = (
        calibrator.method,
        calibrator.symmetric,
        calibrator.num_bins,
        calibrator.num_quantized_bins,
        calibrator.percentile,
        calibrator.scenario,
    )
    groups = getattr(calibrator, "group_qdq_tensors", None) or {}
    return {
        name: (nodes, settings, name, tuple(sorted(groups.get(name, ()))))
        for name in sorted(calibrator.tensors_to_calibrate or ())
    }


def _without_unread_nodes(converter: Any) -> None:
    """ModelOpt's `_cleanup_no_consumer_nodes`: remove each node none of whose outputs is a graph output or read by a
    node, all decided before any is removed. The readers are one set, not a scan of every node per output."""
    graph = converter.model.graph
    wanted = {output.name for output in graph.output} | {name for node in graph.node for name in node.input}
    for node in [node for node in graph.node if not any(name in wanted for name in node.output)]:
        graph.node.remove(node)


@contextlib.contextmanager
def _replaced(owner: Any, **replacements: Any) -> Iterator[None]:
    """`owner`'s named attributes replaced while the block runs, restored after it (on an error too)."""
    with _PATCHED:
        own = {name: getattr(owner, name) for name in replacements}
        for name, value in replacements.items():
            setattr(owner, name, value)
        try:
            yield
        finally:
            for name, value in own.items():
                setattr(owner, name, value)
