"""Cleanup: load and check the source ONNX, normalize its IR version, infer shapes, save it, prove it equal.

The IR version is lowered to one every consumer here reads: onnx 1.23 writes IR 14, which ONNX Runtime
1.31 refuses. The cleaned model is then run beside the source on ONNX Runtime (CPU) over seeded inputs
within the profiles; an output outside the recipe's fp32 tolerances fails the stage, naming it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trtflow.errors import StageError
from trtflow.stages import StageOutput, Upstream, compare
from trtflow.stages.modelfile import save_model

# The newest IR version ONNX Runtime and the TensorRT parsers read; a model needing more keeps its own.
MAX_IR_VERSION = 10


def run(params: dict, inputs: dict[str, Upstream], workdir: Path) -> StageOutput:
    import onnx

    source = inputs["model"]
    model = _load(onnx, source.files["model"])
    before = model_summary(model)
    model.ir_version = _normalized_ir_version(onnx, model)
    model = onnx.shape_inference.infer_shapes(model, check_type=True, data_prop=True)
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as exc:
        raise StageError(f"the model fails the ONNX checker: {str(exc).splitlines()[0]}") from None
    files = save_model(onnx, model, workdir)
    equality = compare.prove_equal(files["model"], source.files["model"], params["profiles"], params["verify"])
    if not equality["passed"] and params["verify"]["on_fail"] == "fail":
        raise StageError(compare.failure_message("the cleaned model differs from the source: onnx_compare", equality))
    record = {"source_sha256": source.sha256["model"], "before": before, "after": model_summary(model), "equality": equality}
    return StageOutput(files=files, record=record)


def _load(onnx: Any, path: Path) -> Any:
    try:
        return onnx.load(path)
    except Exception as exc:
        raise StageError(f"cannot parse the ONNX model: {type(exc).__name__}: {exc}") from None


def _normalized_ir_version(onnx: Any, model: Any) -> int:
    needed = onnx.helper.find_min_ir_version_for(list(model.opset_import), ignore_unknown=True)
    return min(model.ir_version, max(MAX_IR_VERSION, needed))


def model_summary(model: Any) -> dict:
    """Counts and I/O of a model, recorded before and after cleanup."""
    initializers = {init.name for init in model.graph.initializer}
    return {
        "nodes": len(model.graph.node),
        "ir_version": model.ir_version,
        "opsets": {entry.domain or "ai.onnx": entry.version for entry in model.opset_import},
        "inputs": [_value_info(v) for v in model.graph.input if v.name not in initializers],
        "outputs": [_value_info(v) for v in model.graph.output],
    }


def _value_info(value: Any) -> dict:
    """Name, element type and shape (a dimension is an int, a symbolic name, or None if unknown)."""
    import onnx

    tensor = value.type.tensor_type
    dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tensor.shape.dim]
    dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type).name if tensor.elem_type else None
    return {"name": value.name, "dtype": dtype, "shape": dims if tensor.HasField("shape") else None}
