"""Regenerate the example models (seeded, so the weights are always the same).

    python models/make_models.py

tiny_cnn.onnx: conv-bn-relu x2, global pool, linear head; input [N,3,32,32], dynamic batch.
seq_lstm.onnx: one LSTM layer over a fixed sequence of 50 steps, 32 features in, 64 hidden; static shape.
Both are written with only `onnx` and `numpy`, so no framework is needed to reproduce them.
The tests also build `wide_cnn` (channels wide enough for fp8), `two_input_net` and calibration batches from here.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8  # readable by every ONNX Runtime and TensorRT parser in use


def _init(rng: np.random.Generator, name: str, *shape: int, scale: float = 0.1) -> onnx.TensorProto:
    return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)


def tiny_cnn(rng: np.random.Generator) -> onnx.ModelProto:
    inits = [
        _init(rng, "conv1.w", 16, 3, 3, 3), _init(rng, "conv1.b", 16),
        _init(rng, "conv2.w", 32, 16, 3, 3), _init(rng, "conv2.b", 32),
        _init(rng, "fc.w", 32, 10), _init(rng, "fc.b", 10),
    ]
    nodes = [
        helper.make_node("Conv", ["input", "conv1.w", "conv1.b"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p1", "conv2.w", "conv2.b"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("GlobalAveragePool", ["r2"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"], axis=1),
        helper.make_node("MatMul", ["f", "fc.w"], ["m"]),
        helper.make_node("Add", ["m", "fc.b"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes, "tiny_cnn",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 3, 32, 32])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])],
        inits,
    )
    return _model(graph)


def seq_lstm(rng: np.random.Generator) -> onnx.ModelProto:
    hidden, features, steps = 64, 32, 50
    inits = [
        _init(rng, "W", 1, 4 * hidden, features), _init(rng, "R", 1, 4 * hidden, hidden),
        _init(rng, "B", 1, 8 * hidden), _init(rng, "head.w", hidden, 8), _init(rng, "head.b", 8),
    ]
    nodes = [
        helper.make_node("LSTM", ["sequence", "W", "R", "B"], ["Y", "Y_h"], hidden_size=hidden),
        helper.make_node("Squeeze", ["Y_h", "zero"], ["last"]),
        helper.make_node("MatMul", ["last", "head.w"], ["m"]),
        helper.make_node("Add", ["m", "head.b"], ["scores"]),
    ]
    inits.append(numpy_helper.from_array(np.array([0], dtype=np.int64), "zero"))
    graph = helper.make_graph(
        nodes, "seq_lstm",
        [helper.make_tensor_value_info("sequence", TensorProto.FLOAT, [steps, 1, features])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, 8])],
        inits,
    )
    return _model(graph)


def wide_cnn(rng: np.random.Generator) -> onnx.ModelProto:
    """Convolutions with 32-64 channels and a residual Add: what ModelOpt quantizes in fp8 (it skips <= 16 channels)."""
    inits = [
        _init(rng, "c1.w", 32, 3, 3, 3), _init(rng, "c1.b", 32), _init(rng, "c2.w", 32, 32, 3, 3), _init(rng, "c2.b", 32),
        _init(rng, "c3.w", 64, 32, 3, 3), _init(rng, "c3.b", 64), _init(rng, "fc.w", 64, 32), _init(rng, "fc.b", 32),
    ]
    nodes = [
        helper.make_node("Conv", ["input", "c1.w", "c1.b"], ["a1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["a1"], ["r1"]),
        helper.make_node("Conv", ["r1", "c2.w", "c2.b"], ["a2"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["a2"], ["r2"]),
        helper.make_node("Add", ["r1", "r2"], ["s"]),
        helper.make_node("Conv", ["s", "c3.w", "c3.b"], ["a3"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Relu", ["a3"], ["r3"]),
        helper.make_node("GlobalAveragePool", ["r3"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"], axis=1),
        helper.make_node("MatMul", ["f", "fc.w"], ["m"]),
        helper.make_node("Add", ["m", "fc.b"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes, "wide_cnn",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 3, 32, 32])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 32])],
        inits,
    )
    return _model(graph)


def two_input_net(rng: np.random.Generator) -> onnx.ModelProto:
    """An image [N,3,16,16] and a feature vector [N,32] merged into one head: calibration with several inputs."""
    inits = [
        _init(rng, "c1.w", 16, 3, 3, 3), _init(rng, "c1.b", 16), _init(rng, "c2.w", 32, 16, 3, 3), _init(rng, "c2.b", 32),
        _init(rng, "feat.w", 32, 32), _init(rng, "feat.b", 32), _init(rng, "head.w", 32, 10), _init(rng, "head.b", 10),
    ]
    nodes = [
        helper.make_node("Conv", ["image", "c1.w", "c1.b"], ["a1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["a1"], ["r1"]),
        helper.make_node("Conv", ["r1", "c2.w", "c2.b"], ["a2"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["a2"], ["r2"]),
        helper.make_node("GlobalAveragePool", ["r2"], ["g"]),
        helper.make_node("Flatten", ["g"], ["pooled"], axis=1),
        helper.make_node("MatMul", ["features", "feat.w"], ["fm"]),
        helper.make_node("Add", ["fm", "feat.b"], ["fa"]),
        helper.make_node("Relu", ["fa"], ["fr"]),
        helper.make_node("Add", ["pooled", "fr"], ["merged"]),
        helper.make_node("MatMul", ["merged", "head.w"], ["hm"]),
        helper.make_node("Add", ["hm", "head.b"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes, "two_input_net",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 3, 16, 16]),
         helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", 32])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])],
        inits,
    )
    return _model(graph)


def calibration_batches(rng: np.random.Generator, count: int, shapes: dict[str, tuple[int, ...]]) -> list[dict[str, np.ndarray]]:
    """`count` seeded batches, one float32 array per input name."""
    return [{name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()} for _ in range(count)]


def _model(graph: onnx.GraphProto) -> onnx.ModelProto:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="trtflow-example")
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model, full_check=True)
    return model


def main() -> None:
    here = Path(__file__).parent
    onnx.save(tiny_cnn(np.random.default_rng(0)), here / "tiny_cnn.onnx")
    onnx.save(seq_lstm(np.random.default_rng(1)), here / "seq_lstm.onnx")


if __name__ == "__main__":
    main()
