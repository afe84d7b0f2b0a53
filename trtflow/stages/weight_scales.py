"""ONNX Runtime's per-channel weight scales (int8 and fp8), a weight at a time instead of a channel at a time.

ModelOpt's PTQ has ONNX Runtime's QDQ quantizer compute each weight's scales, and that computes them one channel at a
time in Python (`_calc_initializer_quant_params`): 83,712 calls for BERT-base, 7.5 s of its 47 s int8 call, and 9,216
calls (0.8 s) for a 4-layer encoder's fp8. `calc_initializer_quant_params` computes per-channel weights' scales here
with ONNX Runtime's own arithmetic and hands every other tensor to ONNX Runtime's method: the same arrays, bit for bit
(tests/stages/test_weight_scales.py).
- A symmetric integer scale needs each channel's minimum and maximum, which numpy reduces exactly in any order: all
  channels at once (`compute_scale_zp`'s steps, element by element).
- An fp8 scale is the channel's standard deviation over that of the fp8 values. numpy's sum over a 2-D array's rows
  does not add in the order of its sum over one row (the last bit differed in 11,060 of the channels tried), so each
  channel's deviation is taken alone, as ONNX Runtime takes it; what is saved is the rest of its per-call work (the
  fp8 values' own deviation, recomputed at every call).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

_INTEGER_TYPES = ("INT8", "UINT8", "INT16", "UINT16")  # the types ONNX Runtime's integer scales take (not int4)
_FP8 = "FLOAT8E4M3FN"


def calc_initializer_quant_params(quantizer: Any, own: Any) -> dict[str, Any]:
    """`QDQQuantizer._calc_initializer_quant_params` (`own`, ONNX Runtime's): tensor name -> QuantizationParams, in
    the order ONNX Runtime gives them; per-channel weights (`per_channel_params`) computed here."""
    from onnxruntime.quantization.qdq_quantizer import QuantizationParams
    from onnxruntime.quantization.quant_utils import find_by_name, tensor_proto_to_array

    computed: dict[str, Any] = {}
    for name, info in quantizer.tensors_to_quantize.items():
        initializer = find_by_name(name, quantizer.model.initializer())
        if not initializer or not _plain_per_channel(quantizer, name, info):
            continue
        data = tensor_proto_to_array(initializer)
        axis = info.axis + data.ndim if info.axis < 0 else info.axis
        quant_type = quantizer.weight_qType if _is_weight(info) else quantizer.activation_qType
        found = per_channel_params(data, axis, quant_type, quantizer.reduce_range)
        if found is not None:
            computed[name] = QuantizationParams(zero_point=found[0], scale=found[1], quant_type=quant_type, axis=axis)
    rest = {name: info for name, info in quantizer.tensors_to_quantize.items() if name not in computed}
    everything = quantizer.tensors_to_quantize
    quantizer.tensors_to_quantize = rest
    try:
        theirs = own(quantizer)
    finally:
        quantizer.tensors_to_quantize = everything
    both = {**theirs, **computed}
    return {name: both[name] for name in everything if name in both}


def per_channel_params(
    data: np.ndarray, axis: int, quant_type: int, reduce_range: bool
) -> tuple[np.ndarray, np.ndarray] | None:
    """(zero points, scales) of each channel along `axis` as ONNX Runtime's `compute_data_quant_params` gives them
    for symmetric quantization to `quant_type` (an integer type or fp8 E4M3FN); None where it must decide (another
    type, an empty channel, a value that is not finite, fp8 with reduce_range: it raises or takes its own path)."""
    import numpy as np
    from onnx import TensorProto

    integer = quant_type in {getattr(TensorProto, name) for name in _INTEGER_TYPES}
    fp8 = quant_type == getattr(TensorProto, _FP8) and not reduce_range
    if not (integer or fp8) or not (0 <= axis < data.ndim and data.dtype.kind == "f"):
        return None
    rows = np.moveaxis(data, axis, 0).reshape(data.shape[axis], -1)  # row i: data.take(i, axis).ravel()
    if rows.shape[1] == 0 or not np.isfinite(rows).all():
        return None
    return _integer_params(rows, quant_type, reduce_range) if integer else _fp8_params(rows, quant_type)


def _integer_params(rows: np.ndarray, quant_type: int, reduce_range: bool) -> tuple[np.ndarray, np.ndarray]:
    """`compute_scale_zp(rmin, rmax, qmin, qmax, symmetric=True)` of each row, all rows at once."""
    import numpy as np
    from onnxruntime.quantization.quant_utils import get_qmin_qmax_for_qType

    qmin, qmax = get_qmin_qmax_for_qType(quant_type, reduce_range, symmetric=True)
    zero = np.array(0, dtype=rows.dtype)
    absmax = np.maximum(np.abs(np.minimum(rows.min(axis=1), zero)), np.abs(np.maximum(rows.max(axis=1), zero)))
    spread = np.asarray(absmax - -absmax, dtype=np.float64)
    scale = spread / (np.array(qmax, dtype=np.float64) - np.array(qmin, dtype=np.float64))
    tiny = scale < np.finfo(rows.dtype).tiny
    middle = np.array(np.round((qmin + qmax) / np.array(2.0, dtype=np.float64)), dtype=qmin.dtype)
    zero_points = np.where(tiny, np.array(0, dtype=qmin.dtype), middle)
    scales = np.where(tiny, np.array(1.0, dtype=rows.dtype), scale.astype(rows.dtype))
    return zero_points, scales


def _fp8_params(rows: np.ndarray, quant_type: int) -> tuple[np.ndarray, np.ndarray]:
    """`compute_scale_zp_float8(quant_type, np.std(row))` of each row: the row's deviation taken alone (a copy, as
    ONNX Runtime's `take` makes), the fp8 values' deviation once."""
    import numpy as np
    from onnxruntime.quantization import quant_utils

    deviations = [np.std(row.copy()) for row in rows]
    zero, _ = quant_utils.compute_scale_zp_float8(quant_type, deviations[0])  # also fills its table of fp8 values
    fp8_spread = np.std(quant_utils.FLOAT8_DISTRIBUTIONS[quant_type])
    scales = np.asarray([np.array(std / fp8_spread, dtype=std.dtype) for std in deviations])
    return np.asarray([zero] * len(deviations)), scales


def _plain_per_channel(quantizer: Any, name: str, info: Any) -> bool:
    """A per-channel tensor with no override of any kind and no minimum range: symmetric by ONNX Runtime's rule."""
    overrides = quantizer.tensor_quant_overrides
    return (
        info.axis is not None
        and quantizer.min_real_range is None
        and not overrides.overrides_scale_zp(name)
        and overrides.get(name, [{}]) == [{}]
    )


def _is_weight(info: Any) -> bool:
    """Whether ONNX Runtime quantizes the tensor as a weight (else with the activations' type)."""
    from onnxruntime.quantization.qdq_quantizer import QDQQuantTensorType

    return info.tensor_type is QDQQuantTensorType.WEIGHT
