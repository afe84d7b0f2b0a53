"""The range every float tensor of a model reaches over a set of inputs, measured in the memory of one inference.

AutoCast keeps a node fp32 when a value it reads or writes exceeds `data_max` (512 by default) on reference data.
ModelOpt's own reference run marks every tensor an output and keeps every activation of every sample until all
have run (polygraphy's Comparator), so its memory grows as activations x samples: 13.8 GB for a 33 MB Whisper-tiny
encoder, past 21 GB for a Stable-Diffusion-like UNet. Here the model itself reduces each float tensor to its
minimum, maximum and size as soon as it is made (ReduceMin/ReduceMax/Size nodes placed right after the producer,
so ONNX Runtime frees the tensor as it would without them), and samples run one at a time: the pass costs what one
inference costs, whatever the number of samples.

Only float tensors are measured: AutoCast converts nothing else, and judging an index tensor (token ids up to
50,256) against fp16's range kept BERT's word embeddings in fp32 for no reason.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from trtflow.errors import StageError
from trtflow.stages import compare, weightless
from trtflow.util.onnxio import load_graph_only

_REDUCED = "trtflow.range/"  # the prefix of every node and tensor the pass adds


@dataclass(frozen=True)
class Range:
    """The smallest and largest value a tensor took over the samples, and its largest element count (0: always
    empty)."""

    low: float
    high: float
    elements: int

    @property
    def absmax(self) -> float:
        """The largest magnitude."""
        return max(abs(self.low), abs(self.high))

    def widened(self, low: float, high: float, elements: int) -> Range:
        """This range and another (of a tensor with `elements` elements) together."""
        return Range(min(self.low, low), max(self.high, high), max(self.elements, elements))


EMPTY = Range(math.inf, -math.inf, 0)


def autocast_ranges(model_path: Path, feeds: list[dict[str, np.ndarray]]) -> dict[str, Range]:
    """float_ranges, the value ranges AutoCast judges fp16 safety by; a model ONNX Runtime cannot run is said so in
    one line, not blamed on ModelOpt."""
    try:
        return float_ranges(model_path, feeds)
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [""])[0]
        raise StageError(
            f"ONNX Runtime failed to run the fp32 model to measure its value ranges for AutoCast: {first}"
        ) from exc


def float_ranges(model_path: Path, feeds: list[dict[str, np.ndarray]]) -> dict[str, Range]:
    """Tensor name -> Range for the model's float inputs and every float tensor its nodes make, over `feeds`."""
    graph = load_graph_only(model_path)
    inputs = {i.name for i in graph.graph.input} - {i.name for i in graph.graph.initializer}
    ranges: dict[str, Range] = {}
    for feed in feeds:
        for name in inputs:
            value = np.asarray(feed[name])
            if value.dtype.kind == "f" and value.size:
                ranges[name] = ranges.get(name, EMPTY).widened(float(value.min()), float(value.max()), value.size)
    measured, tensors = _reducing(graph)
    if not tensors or not feeds:
        return ranges
    # threads 0: ONNX Runtime's default, every core. In node order, each reduction runs right after its tensor is
    # made and the tensor is freed as in a plain inference (measured on Whisper-tiny's encoder: 0.37 GB against
    # 1.95 GB in ONNX Runtime's default order, and 0.30 GB for the plain inference)
    session = compare.session_beside(model_path, measured, threads=0)
    wanted = [i.name for i in session.get_inputs()]
    outputs = [f"{_REDUCED}{index}/{part}" for index in range(len(tensors)) for part in ("min", "max", "size")]
    for feed in feeds:
        values = iter(session.run(outputs, {k: feed[k] for k in wanted}))
        for name in tensors:
            low, high, size = (next(values) for _ in range(3))
            if int(size):
                ranges[name] = ranges.get(name, EMPTY).widened(float(low), float(high), int(size))
    return ranges


def _reducing(model: Any) -> tuple[Any, list[str]]:
    """A copy of the graph that also outputs min, max and size of each float tensor its nodes make (placed right after
    the node that makes it), and those tensors' names in that order."""
    import onnx
    from onnx import TensorProto, helper

    types = _elem_types(model)
    floats = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE}
    reducing = onnx.ModelProto()
    reducing.CopyFrom(model)
    nodes: list[Any] = []
    tensors: list[str] = []
    for node in model.graph.node:
        nodes.append(node)
        for name in node.output:
            if not name or types.get(name) not in floats:
                continue
            prefix, source = f"{_REDUCED}{len(tensors)}/", name
            tensors.append(name)
            if types[name] != TensorProto.FLOAT:
                nodes.append(helper.make_node("Cast", [name], [prefix + "fp32"], prefix + "cast", to=TensorProto.FLOAT))
                source = prefix + "fp32"
            for part, op in (("min", "ReduceMin"), ("max", "ReduceMax")):
                nodes.append(helper.make_node(op, [source], [prefix + part], prefix + part, keepdims=0))
            nodes.append(helper.make_node("Size", [name], [prefix + "size"], prefix + "size"))
    del reducing.graph.node[:]
    reducing.graph.node.extend(nodes)
    for index in range(len(tensors)):
        for part, elem in (("min", TensorProto.FLOAT), ("max", TensorProto.FLOAT), ("size", TensorProto.INT64)):
            reducing.graph.output.append(helper.make_tensor_value_info(f"{_REDUCED}{index}/{part}", elem, []))
    return reducing, tensors


def _elem_types(model: Any) -> dict[str, int]:
    """Tensor name -> ONNX element type, as shape inference tells (a tensor it cannot type is left out); inferred on a
    stand-in without the weights (stages.weightless: 0.28 s of ResNet-18's fp16 stage where ONNX serialized them)."""
    import onnx

    inferred = onnx.shape_inference.infer_shapes(weightless.stand_in(onnx, model))
    return {
        v.name: v.type.tensor_type.elem_type
        for v in (*inferred.graph.value_info, *inferred.graph.output, *inferred.graph.input)
        if v.type.HasField("tensor_type")
    } | {init.name: init.data_type for init in model.graph.initializer}
