"""The range every float tensor of a model reaches over a set of inputs, measured in bounded memory.

AutoCast keeps a node fp32 when a value it reads or writes exceeds `data_max` (512 by default) on reference data.
ModelOpt's own reference run marks every tensor an output and keeps every activation of every sample until all
have run (polygraphy's Comparator), so its memory grows as activations x samples: 13.8 GB for a 33 MB Whisper-tiny
encoder, past 21 GB for a Stable-Diffusion-like UNet. This pass keeps two numbers per tensor instead: samples run
one at a time, and when one sample's activations would pass `budget` bytes the tensors are measured in groups, a
session each (its weights loaded once per group).

Only float tensors are measured: AutoCast converts nothing else, and judging an index tensor (token ids up to
50,256) against fp16's range kept BERT's word embeddings in fp32 for no reason.
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from trtflow.stages import compare
from trtflow.util.onnxio import load_graph_only

# The bytes of activations one session may hand back per sample; a larger model's tensors are measured in groups.
DEFAULT_BUDGET = 1 << 30


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

    def widened(self, value: np.ndarray) -> Range:
        """This range and `value` together."""
        if value.size == 0:
            return self
        return Range(
            min(self.low, float(value.min())), max(self.high, float(value.max())), max(self.elements, value.size)
        )


EMPTY = Range(math.inf, -math.inf, 0)


def float_ranges(model_path: Path, feeds: list[dict[str, np.ndarray]], budget: int = DEFAULT_BUDGET) -> dict:
    """Tensor name -> Range for the model's float inputs and every float tensor its nodes make, over `feeds`."""
    graph = load_graph_only(model_path)
    inputs = {i.name for i in graph.graph.input} - {i.name for i in graph.graph.initializer}
    ranges: dict[str, Range] = {}
    for feed in feeds:
        for name in inputs:
            value = np.asarray(feed[name])
            if value.dtype.kind == "f":
                ranges[name] = ranges.get(name, EMPTY).widened(value)
    sizes = _tensor_bytes(graph, max(feeds, key=_elements)) if feeds else {}
    for group in _groups(sizes, budget):
        session = _session_returning(model_path, graph, group)
        wanted = [i.name for i in session.get_inputs()]
        for feed in feeds:
            for name, value in zip(group, session.run(group, {k: feed[k] for k in wanted}), strict=True):
                if isinstance(value, np.ndarray) and value.dtype.kind == "f":
                    ranges[name] = ranges.get(name, EMPTY).widened(value)
        del session  # before the next group's session loads the weights again
    return ranges


def _elements(feed: dict[str, np.ndarray]) -> int:
    return sum(np.asarray(v).size for v in feed.values())


def _tensor_bytes(model: Any, feed: dict[str, np.ndarray]) -> dict[str, int]:
    """Node output -> its bytes at `feed`'s shapes, in graph order, for every output not known to be non-float; an
    output whose shape inference cannot tell counts as the largest known one."""
    import onnx

    fixed = onnx.ModelProto()
    fixed.CopyFrom(model)
    for value_info in fixed.graph.input:
        if value_info.name in feed and value_info.type.HasField("tensor_type"):
            shape = value_info.type.tensor_type.shape
            shape.ClearField("dim")
            for size in np.asarray(feed[value_info.name]).shape:
                shape.dim.add().dim_value = size
    inferred = onnx.shape_inference.infer_shapes(fixed)
    known = {v.name: v.type.tensor_type for v in (*inferred.graph.value_info, *inferred.graph.output)}
    floats = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16, onnx.TensorProto.DOUBLE}
    sizes: dict[str, int | None] = {}
    for node in model.graph.node:
        for name in node.output:
            tensor = known.get(name)
            if not name or (tensor is not None and tensor.elem_type and tensor.elem_type not in floats):
                continue
            sizes[name] = _bytes(tensor) if tensor is not None else None
    largest = max((s for s in sizes.values() if s is not None), default=0)
    return {name: size if size is not None else largest for name, size in sizes.items()}


def _bytes(tensor: Any) -> int | None:
    dims = [d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim]
    if not tensor.HasField("shape") or None in dims:
        return None
    return math.prod(dims) * (2 if tensor.elem_type in (10, 16) else 8 if tensor.elem_type == 11 else 4)


def _groups(sizes: dict[str, int], budget: int) -> Iterator[list[str]]:
    """The tensors in graph order, cut into runs of at most `budget` bytes (a larger tensor alone)."""
    group: list[str] = []
    total = 0
    for name, size in sizes.items():
        if group and total + size > budget:
            yield group
            group, total = [], 0
        group.append(name)
        total += size
    if group:
        yield group


def _session_returning(model_path: Path, graph: Any, tensors: list[str]) -> Any:
    """An ONNX Runtime session of the model that also returns `tensors`. The weights stay in their external file,
    read from beside the model through a temporary model file there."""
    import onnx

    marked = onnx.ModelProto()
    marked.CopyFrom(graph)
    outputs = {o.name for o in marked.graph.output}
    marked.graph.output.extend(onnx.ValueInfoProto(name=t) for t in tensors if t not in outputs)
    handle, name = tempfile.mkstemp(suffix=".onnx", prefix=".ranges-", dir=model_path.parent)
    try:
        with os.fdopen(handle, "wb") as file:
            file.write(marked.SerializeToString())
        return compare.session(Path(name), threads=0)  # 0: ONNX Runtime's default, every core
    finally:
        os.unlink(name)
