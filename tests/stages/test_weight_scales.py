"""Per-channel int8 and fp8 weight scales computed a weight at a time are ONNX Runtime's, bit for bit
(stages.weight_scales)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto
from onnxruntime.quantization.quant_utils import compute_data_quant_params

from trtflow.stages.weight_scales import per_channel_params


def _onnxruntime(data: np.ndarray, axis: int, quant_type: int, reduce_range: bool) -> tuple[np.ndarray, np.ndarray]:
    """What ONNX Runtime's QDQ quantizer computes for a per-channel weight: a channel at a time."""
    found = [
        compute_data_quant_params(data.take(i, axis).ravel(), quant_type, True, reduce_range=reduce_range)
        for i in range(data.shape[axis])
    ]
    return np.asarray([zero for zero, _ in found]), np.asarray([scale for _, scale in found])


def _weights(dtype: type) -> np.ndarray:
    """A conv weight (64 out-channels) whose channels are adversarial: all zero, one denormal, negative only,
    positive only, a single huge value; the rest seeded normals at several scales."""
    rng = np.random.default_rng(11)
    data = (rng.standard_normal((64, 16, 3, 3)) * rng.choice([1e-3, 0.02, 1.0, 30.0], (64, 1, 1, 1))).astype(dtype)
    data[0] = 0
    data[1] = 0
    data[1, 0, 0, 0] = np.finfo(dtype).smallest_subnormal
    data[2] = -np.abs(data[2])
    data[3] = np.abs(data[3])
    data[4, 3, 1, 1] = np.finfo(dtype).max / 4
    return data


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("axis", [0, 1, 3])
@pytest.mark.parametrize(
    ("quant_type", "reduce_range"),
    [
        (TensorProto.INT8, False),
        (TensorProto.INT8, True),
        (TensorProto.UINT8, False),
        (TensorProto.INT16, False),
        (TensorProto.FLOAT8E4M3FN, False),
    ],
)
def test_every_channel_gets_onnxruntimes_zero_point_and_scale_bit_for_bit(
    dtype: type, axis: int, quant_type: int, reduce_range: bool
) -> None:
    data = _weights(dtype)
    with np.errstate(over="ignore"):  # fp8: the huge channel's deviation overflows to inf, in both
        found = per_channel_params(data, axis, quant_type, reduce_range)
        expected = _onnxruntime(data, axis, quant_type, reduce_range)
    assert found is not None
    for ours, theirs in zip(found, expected, strict=True):
        assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
        assert ours.tobytes() == theirs.tobytes()


def test_what_onnxruntime_must_decide_is_left_to_it() -> None:
    data = _weights(np.float32)
    assert per_channel_params(data, 0, TensorProto.FLOAT8E4M3FN, True) is None  # ORT raises: no reduce_range
    assert per_channel_params(data, 0, TensorProto.INT4, False) is None
    assert per_channel_params(data, 4, TensorProto.INT8, False) is None  # no such axis: ORT raises
    assert per_channel_params(np.zeros((8, 0), np.float32), 0, TensorProto.INT8, False) is None
    data[5, 0, 0, 0] = np.nan  # ORT's assert on the scale fails
    assert per_channel_params(data, 0, TensorProto.INT8, False) is None
