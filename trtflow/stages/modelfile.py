"""How a stage hands an ONNX model to the next: `model.onnx`, plus `model.onnx.data` for external weights.

A model's weights may live beside its graph (`save_as_external_data`), and must above 2 GiB (protobuf's
limit). In the store both files are objects: outputs `model` and `model.data`. The runner places them
side by side under these names before a stage reads them, so ONNX, ONNX Runtime and TensorRT's parser
find the weights by the graph's relative `location`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

MODEL, MODEL_DATA = "model", "model.data"
FILE_NAMES = {MODEL: "model.onnx", MODEL_DATA: "model.onnx.data"}
# Above this many bytes of weights a model is written with external data (protobuf refuses 2 GiB).
EXTERNAL_DATA_THRESHOLD = 1 << 30


def save_model(onnx: Any, model: Any, workdir: Path, external: bool = False) -> dict[str, Path]:
    """Write `model.onnx` (and `model.onnx.data` when `external` or the weights are large); returns the outputs."""
    path = workdir / FILE_NAMES[MODEL]
    if external or weight_bytes(model) > EXTERNAL_DATA_THRESHOLD:
        onnx.save_model(model, path, save_as_external_data=True, all_tensors_to_one_file=True,
                        location=FILE_NAMES[MODEL_DATA], size_threshold=1024)
        return {MODEL: path, MODEL_DATA: workdir / FILE_NAMES[MODEL_DATA]}
    onnx.save_model(model, path)
    return {MODEL: path}


def weight_bytes(model: Any) -> int:
    """Bytes of initializer data held in the graph itself (external tensors count 0)."""
    return sum(len(t.raw_data) for t in model.graph.initializer)


def companions(outputs: dict[str, Any], output: str) -> dict[str, Any]:
    """The outputs that travel with `output` (its external data), keyed by output name."""
    return {name: value for name, value in outputs.items() if name.startswith(output + ".")}
