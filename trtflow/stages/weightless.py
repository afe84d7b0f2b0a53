"""Whole-model passes on a stand-in without the weights: trtflow's own shape inference (`infer_shapes`: cleanup,
folding, composition, the emulation) and ModelOpt's, while AutoCast or PTQ runs.

ONNX shape inference and the checker serialize the whole model, weights included, and parse it again in C++: on a
142M-parameter UNet (570 MB of weights) RSS rose by about 1.4 GB inside each. Neither reads a weight's values: shape
inference reads an initializer's type and dims (and the values of small integer tensors: shapes, axes), the checker
its structure. So they run on a stand-in: the same model with each large floating-point initializer replaced by a
reference to external data (its name, type and dims, no bytes). Inference's result gets the weights back, copied into
a new model (`infer_shapes`, `infer_shapes_path`, and the version converter's, `convert_version`) or written into the
model itself (`infer_shapes_in_place`); the checker reads the stand-in from a temporary folder beside an empty data
file (`check`). stages.modelopt_passes puts them in ModelOpt's place while it converts; the results are the same,
byte for byte.

What the checker no longer sees is the large weights' byte counts; ONNX Runtime, which the accuracy check runs on the
converted model, refuses a tensor whose bytes do not match its dims.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from trtflow.util.onnxio import load_graph_only, tensor_bytes

# Floating-point initializers above this many bytes are weights: shape inference never reads their values.
SET_ASIDE_BYTES = 64 << 10
_DATA_FILE = "weightless.data"  # the stand-in's reference; the checker finds an empty file of this name


def _stands_in(onnx: Any, tensor: Any) -> bool:
    """Whether the stand-in gives `tensor` as a reference: external data already, or a floating-point weight past
    SET_ASIDE_BYTES (no pass but the runtime reads its values)."""
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        return True
    return tensor.data_type in _float_types(onnx) and tensor_bytes(tensor) > SET_ASIDE_BYTES


def _float_types(onnx: Any) -> set[int]:
    """The floating-point element types a weight is stored in."""
    kinds = onnx.TensorProto
    return {kinds.FLOAT, kinds.FLOAT16, kinds.DOUBLE, kinds.BFLOAT16}


def stand_in(onnx: Any, model: Any) -> Any:
    """A copy of `model` whose weights (_stands_in) are external references to one file that need not exist."""
    light = onnx.ModelProto()
    _copy_fields(model, light, but="graph")
    _copy_fields(model.graph, light.graph, but="initializer")
    for tensor in model.graph.initializer:
        copy = light.graph.initializer.add()
        if not _stands_in(onnx, tensor):
            copy.CopyFrom(tensor)
            continue
        copy.name, copy.data_type = tensor.name, tensor.data_type
        copy.dims.extend(tensor.dims)
        copy.data_location = onnx.TensorProto.EXTERNAL
        entry = copy.external_data.add()
        entry.key, entry.value = "location", _DATA_FILE
    return light


def infer_shapes_in_place(onnx: Any, model: Any, **options: Any) -> Any:
    """`onnx.shape_inference.infer_shapes(model, **options)`, run on the stand-in and written into `model` itself
    (everything but its initializers, which inference leaves as they are). Returns `model`. On an error, `model` is
    left as it was."""
    inferred = onnx.shape_inference.infer_shapes(stand_in(onnx, model), **options)
    for field in [field for field, _ in model.ListFields() if field.name != "graph"]:
        model.ClearField(field.name)
    for field in [field for field, _ in model.graph.ListFields() if field.name != "initializer"]:
        model.graph.ClearField(field.name)
    _copy_fields(inferred, model, but="graph")
    _copy_fields(inferred.graph, model.graph, but="initializer")
    return model


def check(onnx: Any, model: Any, checker: Any = None, **options: Any) -> None:
    """`onnx.checker.check_model(model, **options)` (or `checker`, ONNX's function as it was before a block replaced
    it) on the stand-in, read from a temporary folder beside an empty data file. `model` is a ModelProto, or a file
    (read without its external data) or serialized bytes as ONNX's checker takes them."""
    if not isinstance(model, onnx.ModelProto):
        model = onnx.load_model_from_string(model) if isinstance(model, bytes) else load_graph_only(model)
    with tempfile.TemporaryDirectory(prefix="trtflow-check-") as folder:
        (Path(folder) / _DATA_FILE).touch()
        path = Path(folder) / "model.onnx"
        path.write_bytes(stand_in(onnx, model).SerializeToString())
        (checker or onnx.checker.check_model)(str(path), **options)


def infer_shapes_path(onnx: Any, model_path: Any, output_path: Any = "", **options: Any) -> None:
    """`onnx.shape_inference.infer_shapes_path`: the model file at `model_path` (read without its external data,
    which stays where it is) inferred on the stand-in and written to `output_path`, by default over itself."""
    inferred = infer_shapes(onnx, load_graph_only(model_path), **options)
    Path(output_path or model_path).write_bytes(inferred.SerializeToString())


def convert_version(onnx: Any, model: Any, target: int, converter: Any) -> Any:
    """`converter(model, target)` (ONNX's version converter, as it was before a block replaced it) run on the
    stand-in, each weight put back by name into the converted model. An adapter that reads a weight's values cannot
    read a stand-in's: then, or if a weight does not come back under its name, the whole model is converted as it
    is."""
    weights = {t.name: t for t in model.graph.initializer if _stands_in(onnx, t)}
    try:
        converted = converter(stand_in(onnx, model), target)
    except Exception:  # noqa: BLE001 - any failure on the stand-in: the model itself decides
        return converter(model, target)
    returned = [t for t in converted.graph.initializer if t.name in weights]
    if len(returned) != len(weights) or any(t.data_location != onnx.TensorProto.EXTERNAL for t in returned):
        return converter(model, target)
    for tensor in returned:
        tensor.CopyFrom(weights[tensor.name])
    return converted


def infer_shapes(onnx: Any, model: Any, **options: Any) -> Any:
    """`onnx.shape_inference.infer_shapes(model, **options)` as it is: a new model, `model` untouched; inferred on
    the stand-in, the weights copied in once (ONNX serializes and parses them twice more). On torchvision's ResNet-18,
    0.03 s where ONNX's own call takes 0.42 and setting the bytes aside meanwhile took 0.17 (medians of 5, one
    process). Data propagation reads only small integer tensors (shapes, axes)."""
    inferred = onnx.shape_inference.infer_shapes(stand_in(onnx, model), **options)
    del inferred.graph.initializer[:]
    inferred.graph.initializer.extend(model.graph.initializer)
    return inferred


def _copy_fields(source: Any, target: Any, but: str) -> None:
    """Every set field of `source` but one into `target` (of the same message type), as copies."""
    for field, value in source.ListFields():
        if field.name == but:
            continue
        if _repeated(field):
            getattr(target, field.name).extend(value)
        elif field.type == field.TYPE_MESSAGE:
            getattr(target, field.name).CopyFrom(value)
        else:
            setattr(target, field.name, value)


def _repeated(field: Any) -> bool:
    """protobuf 6 has `is_repeated` and deprecates `label`; older releases have `label` only."""
    return bool(field.is_repeated if hasattr(field, "is_repeated") else field.label == field.LABEL_REPEATED)
