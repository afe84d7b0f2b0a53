"""One reader of an ONNX model's inputs and outputs (names, element types, dimensions), from the graph alone.

Initializers listed as graph inputs (IR 3 models do that) are not inputs. External weights are never
loaded. `onnx` is imported only when a model is read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Dim = int | str | None  # a size, a symbolic name, or None when unknown

# numpy names of ONNX element types -> ONNX Runtime's type names where they differ
ORT_TYPE_NAMES = {"float32": "float", "float64": "double"}


@dataclass(frozen=True)
class TensorInfo:
    """One graph input or output: `dtype` is numpy's name (`float32`); `dims` as the graph declares them."""

    name: str
    dtype: str | None
    dims: list[Dim] | None  # None when the graph declares no shape

    @property
    def static_dims(self) -> list[int | None]:
        """Each dimension as a positive size, or None where it is dynamic or unknown."""
        return [d if isinstance(d, int) and d > 0 else None for d in (self.dims or [])]

    @property
    def ort_type(self) -> str:
        """The type as ONNX Runtime shows it: `tensor(float)`."""
        return f"tensor({ORT_TYPE_NAMES.get(self.dtype or '', self.dtype)})"

    def to_json(self) -> dict:
        """{"name", "dtype", "shape"} as records and summaries store it."""
        return {"name": self.name, "dtype": self.dtype, "shape": self.dims}


@dataclass(frozen=True)
class ModelIO:
    """A model's real inputs (initializers excluded) and its outputs, in graph order."""

    inputs: list[TensorInfo]
    outputs: list[TensorInfo]

    def input(self, name: str) -> TensorInfo | None:
        """The input called `name`, or None."""
        return next((t for t in self.inputs if t.name == name), None)


def load_graph_only(path: Path) -> Any:
    """The ModelProto without external weights (cheap even for a multi-GB model)."""
    import onnx

    return onnx.load(str(path), load_external_data=False)


def model_io(model: Any) -> ModelIO:
    """Inputs and outputs of a loaded ModelProto."""
    initializers = {init.name for init in model.graph.initializer}
    return ModelIO(
        [tensor_info(v) for v in model.graph.input if v.name not in initializers],
        [tensor_info(v) for v in model.graph.output],
    )


def model_io_of_file(path: Path) -> ModelIO:
    """Inputs and outputs of the model file at `path` (graph only)."""
    return model_io(load_graph_only(path))


def tensor_info(value: Any) -> TensorInfo:
    """Name, element type and dimensions of one ValueInfoProto."""
    import onnx

    tensor = value.type.tensor_type
    dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type).name if tensor.elem_type else None
    if not tensor.HasField("shape"):
        return TensorInfo(value.name, dtype, None)
    dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tensor.shape.dim]
    return TensorInfo(value.name, dtype, dims)


def value_types(model: Any) -> tuple[dict[str, int], dict[str, int]]:
    """Element type (onnx.TensorProto code) and rank of every named value, after shape inference on the graph."""
    import onnx

    try:
        graph = onnx.shape_inference.infer_shapes(model).graph
    except Exception:  # a graph shape inference cannot follow: use what it declares
        graph = model.graph
    types, ranks = {}, {}
    for value in [*graph.input, *graph.value_info, *graph.output]:
        tensor = value.type.tensor_type
        types[value.name] = tensor.elem_type
        if tensor.HasField("shape"):
            ranks[value.name] = len(tensor.shape.dim)
    for init in graph.initializer:
        types[init.name], ranks[init.name] = init.data_type, len(init.dims)
    return types, ranks


QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")


def composition(model: Any) -> dict:
    """What a reduced-precision model is made of: nodes by the type they compute in, initializer bytes by type, and
    the ops fed by Q/DQ (int8/fp8) versus those computing in fp32 (what stayed fp32 in an "fp16" or "int8" model)."""
    import onnx

    types, _ = value_types(model)
    name_of = {code: onnx.helper.tensor_dtype_to_np_dtype(code).name for code in set(types.values()) if code}
    dequantized = {out for n in model.graph.node if n.op_type == "DequantizeLinear" for out in n.output}
    nodes: dict[str, int] = {}
    covered: dict[str, int] = {}
    for node in model.graph.node:
        dtype = "q/dq" if node.op_type in QDQ_OPS else name_of.get(types.get(next(iter(node.output), ""), 0), "unknown")
        nodes[dtype] = nodes.get(dtype, 0) + 1
        if node.op_type not in QDQ_OPS and dequantized.intersection(node.input):
            covered[node.op_type] = covered.get(node.op_type, 0) + 1
    weights: dict[str, int] = {}
    for init in model.graph.initializer:
        dtype = onnx.helper.tensor_dtype_to_np_dtype(init.data_type).name
        weights[dtype] = weights.get(dtype, 0) + _nbytes(init)
    return {
        "nodes_by_dtype": dict(sorted(nodes.items())),
        "initializer_bytes_by_dtype": dict(sorted(weights.items())),
        "qdq_covered_ops": dict(sorted(covered.items())),
    }


def tensor_bytes(tensor: Any) -> int:
    """A tensor's size in bytes from its type and dims: in the graph or external, raw or typed fields alike."""
    import onnx

    try:
        itemsize = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
    except (KeyError, ValueError, TypeError):
        return len(tensor.raw_data)
    size: int = math.prod(tensor.dims) * itemsize
    return size


def _nbytes(init: Any) -> int:
    """Bytes of an initializer's data, inline or external, without loading external data."""
    import onnx

    if init.data_location == onnx.TensorProto.EXTERNAL:
        return next((int(entry.value) for entry in init.external_data if entry.key == "length"), 0)
    return len(init.raw_data) if init.raw_data else tensor_bytes(init)
