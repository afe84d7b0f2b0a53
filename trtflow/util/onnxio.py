"""One reader of an ONNX model's inputs and outputs (names, element types, dimensions), from the graph alone.

Initializers listed as graph inputs (IR 3 models do that) are not inputs. External weights are never
loaded. `onnx` is imported only when a model is read.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

Dim = Union[int, str, None]  # a size, a symbolic name, or None when unknown

# numpy names of ONNX element types -> ONNX Runtime's type names where they differ
ORT_TYPE_NAMES = {"float32": "float", "float64": "double"}


@dataclass(frozen=True)
class TensorInfo:
    """One graph input or output: `dtype` is numpy's name (`float32`); `dims` as the graph declares them."""

    name: str
    dtype: Optional[str]
    dims: Optional[list[Dim]]  # None when the graph declares no shape

    @property
    def static_dims(self) -> list[Optional[int]]:
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

    def input(self, name: str) -> Optional[TensorInfo]:
        """The input called `name`, or None."""
        return next((t for t in self.inputs if t.name == name), None)


def load_graph_only(path: Path) -> Any:
    """The ModelProto without external weights (cheap even for a multi-GB model)."""
    import onnx

    return onnx.load(str(path), load_external_data=False)


def model_io(model: Any) -> ModelIO:
    """Inputs and outputs of a loaded ModelProto."""
    initializers = {init.name for init in model.graph.initializer}
    return ModelIO([tensor_info(v) for v in model.graph.input if v.name not in initializers],
                   [tensor_info(v) for v in model.graph.output])


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
