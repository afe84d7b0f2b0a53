"""Reduced precision with NVIDIA ModelOpt on the CPU: AutoCast (fp16/bf16) and post-training quantization (int8/fp8).

ModelOpt, ONNX Runtime's calibrator and polygraphy print progress bars, log lines and warnings on
stdout/stderr, some from native code; a stage must not (only the CLI prints), so every call runs inside
`quiet`, which keeps what they print and turns warnings off.
ModelOpt and onnx are imported inside the functions: planning must never pay for them (seconds).
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from trtflow.backends.base import import_or_explain
from trtflow.errors import StageError
from trtflow.stages import modelopt_passes
from trtflow.stages.capture import captured_output

QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")
# The largest magnitude each quantized type represents: a scale maps amax onto it.
QUANT_MAX = {"int8": 127.0, "fp8": 448.0}
HISTOGRAM_BINS = 2048


@contextlib.contextmanager
def quiet() -> Iterator[list[str]]:
    """Run noisy library code with its output kept (the yielded list holds its last lines afterwards), warnings off.

    captured_output moves file descriptors 1 and 2; Python's streams are pointed there too, since a test
    runner may have replaced sys.stdout with an object that bypasses them.
    """
    with captured_output() as lines, open(1, "w", closefd=False) as stream, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            with contextlib.redirect_stdout(stream), contextlib.redirect_stderr(stream):
                yield lines
        finally:
            stream.flush()
            _drop_handlers_on(stream)


def _drop_handlers_on(stream: Any) -> None:
    """ModelOpt binds a log handler to sys.stdout as it was during the call: never leave one on a closed stream."""
    for name in ("modelopt.onnx", "modelopt.onnx.autocast", "modelopt.onnx.quantization"):
        logger = logging.getLogger(name)
        for handler in list(logger.handlers):
            if getattr(handler, "stream", None) is stream:
                logger.removeHandler(handler)


# What a reduced precision imports: ModelOpt, which imports torch (2-3 s); a worker server imports it once, before it
# forks the first such stage (executors.forking)
MODELOPT_MODULES = ("modelopt.onnx.autocast", "modelopt.onnx.quantization")


def modules_for(precision: str) -> tuple[str, ...]:
    """The modules a precision stage imports beyond its usual ones: ModelOpt's, for any precision but fp32."""
    return () if precision == "fp32" else MODELOPT_MODULES


def modelopt_onnx() -> Any:
    """ModelOpt's ONNX package, or an EnvironmentProblem saying which extra to install."""
    return import_or_explain("modelopt.onnx", "quant")


def autocast(model_path: Path, precision: str, options: dict, ranges: dict) -> tuple[Any, dict[str, str]]:
    """fp16/bf16 by AutoCast. A node that reads or writes a value past `data_max` in `ranges` (stages.ranges, measured
    by trtflow in bounded memory, handed to AutoCast's own range rule) stays fp32. Returns the model and why each
    node it kept stayed fp32."""
    modelopt_onnx()
    import numpy as np
    from modelopt.onnx.autocast import convert_to_mixed_precision
    from modelopt.onnx.autocast.convert import DEFAULT_DATA_MAX, DEFAULT_INIT_MAX
    from modelopt.onnx.autocast.nodeclassifier import IORangeRule
    from modelopt.onnx.autocast.referencerunner import TensorStats

    data_max = DEFAULT_DATA_MAX if options.get("data_max") is None else options["data_max"]
    measured = {
        name: TensorStats(absmax=r.absmax, min_val=r.low, max_val=r.high, shape=(r.elements,))
        for name, r in ranges.items()
    }
    with _autocast_decisions() as reasons, modelopt_passes.autocast_passes():
        model = convert_to_mixed_precision(
            onnx_path=str(model_path),
            low_precision_type=precision,
            keep_io_types=options["keep_io_types"],
            op_types_to_exclude=list(options["keep_op_types"]),
            nodes_to_exclude=list(options["keep_nodes"]),
            op_types_to_include=list(options.get("include_op_types", ())),
            nodes_to_include=list(options.get("include_nodes", ())),
            init_max=DEFAULT_INIT_MAX if options.get("init_max") is None else options["init_max"],
            data_max=np.inf,  # AutoCast's own reference run (every activation of every sample kept) is skipped
            custom_rule=IORangeRule(data_max, measured, {}) if measured else None,
            providers=["cpu"],
        )
    return model, reasons


@contextlib.contextmanager
def _autocast_decisions() -> Iterator[dict[str, str]]:
    """AutoCast's `Skipping node <name>: <why>` log lines during the block, as node -> reason (stages.composition)."""
    from trtflow.stages.composition import autocast_reason

    reasons: dict[str, str] = {}

    class Decisions(logging.Handler):
        """Keeps the reason of each node AutoCast kept in high precision."""

        def emit(self, record: logging.LogRecord) -> None:
            """Parse one log record; other lines are ignored."""
            found = autocast_reason(record.getMessage())
            if found:
                reasons.setdefault(*found)

    logger = logging.getLogger("modelopt.onnx.autocast")
    handler, level = Decisions(logging.INFO), logger.level
    logger.addHandler(handler)
    logger.setLevel(min(level or logging.INFO, logging.INFO))
    try:
        yield reasons
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def quantize(
    model_path: Path,
    output: Path,
    precision: str,
    feeds: list[dict],
    options: dict,
    calibrated: dict | None = None,
    known: Mapping[str, tuple] | None = None,
) -> Any:
    """int8/fp8 Q/DQ by ModelOpt PTQ, calibrated on ONNX Runtime's CPU provider over exactly `feeds`, in order.
    `calibrated`: histograms kept across the calls of one stage on this model and these feeds; `known`: each tensor's
    extremes over these feeds, for max calibration (modelopt_passes.quantize_passes)."""
    modelopt_onnx()
    import onnx
    from modelopt.onnx.quantization import quantize as modelopt_quantize

    method = "max" if options["method"] == "percentile" else options["method"]
    output.parent.mkdir(parents=True, exist_ok=True)
    with modelopt_passes.quantize_passes(calibrated, known):
        modelopt_quantize(
            onnx_path=str(model_path),
            quantize_mode=precision,
            calibration_data_reader=_reader(feeds),
            calibration_method=method,
            calibration_eps=["cpu"],
            op_types_to_exclude=list(options["exclude_op_types"]) or None,
            nodes_to_exclude=list(options["exclude_nodes"]) or None,
            high_precision_dtype=options["high_precision"],
            use_external_data_format=options["external_data"],
            output_path=str(output),
            log_level="WARNING",
        )
    model = onnx.load(output)
    if options["method"] == "percentile":
        set_percentile_scales(model, model_path, feeds, options["percentile"])
    return model


def _reader(feeds: list[dict]) -> Any:
    """ONNX Runtime's calibration reader over our feeds; ModelOpt also peeks at the first one (`get_first`)."""
    from onnxruntime.quantization import CalibrationDataReader

    class Reader(CalibrationDataReader):
        """Hands ONNX Runtime the calibration feeds one at a time; rewind starts them over."""

        def __init__(self) -> None:
            self.rewind()

        def get_next(self) -> Any:
            """The next feed (input name -> array), or None when all have been read."""
            return next(self._feeds, None)

        def get_first(self) -> dict:
            """The first feed, without moving the position."""
            return feeds[0]

        def rewind(self) -> None:
            """Start again from the first feed."""
            self._feeds = iter(feeds)

    return Reader()


def qdq_summary(model: Any) -> dict:
    """How many Q/DQ nodes a model holds and whether every zero point is 0 (TensorRT needs symmetric scales)."""
    from onnx import numpy_helper

    initializers = {init.name: init for init in model.graph.initializer}
    quantize_nodes = [n for n in model.graph.node if n.op_type == "QuantizeLinear"]
    zero_points = [initializers[n.input[2]] for n in quantize_nodes if len(n.input) > 2 and n.input[2] in initializers]
    asymmetric = [zp.name for zp in zero_points if numpy_helper.to_array(zp).astype("float64").any()]
    return {
        "quantize_nodes": len(quantize_nodes),
        "dequantize_nodes": sum(n.op_type == "DequantizeLinear" for n in model.graph.node),
        "asymmetric_zero_points": asymmetric,
    }


class NothingQuantized(StageError):
    """ModelOpt left every node in high precision: the model would not be int8/fp8 at all."""


def check_quantized(summary: dict, precision: str) -> None:
    """A quantized model must hold Q/DQ nodes (else it silently is not int8/fp8) with zero points of 0."""
    if summary["quantize_nodes"] == 0:
        raise NothingQuantized(
            f"{precision}: ModelOpt quantized no node of this model (it skips layers too small to gain, e.g. "
            f"fp8 convolutions with <= 16 channels and GEMV-shaped MatMuls); drop {precision} from precisions"
        )
    if summary["asymmetric_zero_points"]:
        raise StageError(
            f"{precision}: zero point {summary['asymmetric_zero_points'][0]} is not 0; TensorRT needs symmetric "
            "quantization"
        )


def set_percentile_scales(model: Any, fp32_path: Path, feeds: list[dict], percentile: float) -> None:
    """Shrink each activation's Q and DQ scales from max calibration to the `percentile` of |x| over the same feeds.

    ModelOpt 0.47's ONNX PTQ offers entropy and max only. Its max scale is proportional to the largest
    |x| seen, so scaling it by percentile_amax / max_amax gives the percentile range in whatever scale
    convention the quantized type uses (int8 or fp8), without re-deriving that convention here.
    """
    from onnx import numpy_helper

    initializers = {init.name: init for init in model.graph.initializer}
    casts = {n.output[0]: n.input[0] for n in model.graph.node if n.op_type == "Cast"}
    dequantizers = {n.input[0]: n for n in model.graph.node if n.op_type == "DequantizeLinear"}
    activations = [
        n
        for n in model.graph.node
        if n.op_type == "QuantizeLinear" and n.input[0] not in initializers and n.input[1] in initializers
    ]
    tensors = sorted({_uncast(n.input[0], casts) for n in activations})
    maxima, thresholds = activation_ranges(fp32_path, tensors, feeds, percentile)
    ratios: dict[str, float] = {}
    for node in activations:
        tensor = _uncast(node.input[0], casts)
        ratio = thresholds[tensor] / maxima[tensor] if maxima[tensor] > 0 else 1.0
        partner = dequantizers.get(node.output[0])  # ModelOpt gives the DQ its own copy of the scale
        for scale_name in (node.input[1], *([partner.input[1]] if partner is not None else [])):
            # a scale shared by a concat group keeps the widest
            ratios[scale_name] = max(ratios.get(scale_name, 0.0), ratio)
    for scale_name, ratio in ratios.items():
        old = numpy_helper.to_array(initializers[scale_name])
        initializers[scale_name].CopyFrom(
            numpy_helper.from_array((old.astype("float64") * ratio).astype(old.dtype), scale_name)
        )


def _uncast(tensor: str, casts: dict[str, str]) -> str:
    """The fp32 tensor behind the Casts ModelOpt inserts for high_precision fp16/bf16 (same values, rounded)."""
    while tensor in casts:
        tensor = casts[tensor]
    return tensor


def activation_ranges(fp32_path: Path, tensors: list[str], feeds: list[dict], percentile: float) -> tuple[dict, dict]:
    """(max |x|, percentile of |x|) per tensor over the feeds: one pass for the maxima, one for histograms over [0,
    max]."""
    import numpy as np

    session = _session_with_outputs(fp32_path, tensors)
    wanted = [i.name for i in session.get_inputs()]
    maxima = dict.fromkeys(tensors, 0.0)
    for feed in feeds:
        for name, value in zip(tensors, session.run(tensors, {k: feed[k] for k in wanted}), strict=True):
            maxima[name] = max(maxima[name], float(np.abs(value).max(initial=0.0)))
    counts = {name: np.zeros(HISTOGRAM_BINS, dtype=np.int64) for name in tensors}
    for feed in feeds:
        for name, value in zip(tensors, session.run(tensors, {k: feed[k] for k in wanted}), strict=True):
            counts[name] += np.histogram(np.abs(value), bins=HISTOGRAM_BINS, range=(0.0, maxima[name] or 1.0))[0]
    return maxima, {name: _threshold(counts[name], maxima[name], percentile) for name in tensors}


def _threshold(counts: Any, amax: float, percentile: float) -> float:
    """The upper edge of the first bin at which the cumulative share of |x| reaches `percentile`%."""
    import numpy as np

    total = counts.sum()
    if total == 0 or amax == 0:
        return amax
    index = int(np.searchsorted(np.cumsum(counts), total * percentile / 100.0))
    return amax * min(index + 1, len(counts)) / len(counts)


def _session_with_outputs(path: Path, tensors: list[str]) -> Any:
    """A CPU session of the fp32 model that also returns the given intermediate tensors."""
    import onnx

    from trtflow.stages import compare

    model = onnx.load(path)
    known = {o.name for o in model.graph.output}
    produced = {out for node in model.graph.node for out in node.output} | {i.name for i in model.graph.input}
    missing = [t for t in tensors if t not in produced]
    if missing:
        raise StageError(
            f"calibration.method percentile: tensor {missing[0]!r} of the quantized model is not in the fp32 model"
        )
    model.graph.output.extend(onnx.ValueInfoProto(name=t) for t in tensors if t not in known)
    return compare.session(model.SerializeToString(), threads=0)  # 0: ONNX Runtime's default, every core
