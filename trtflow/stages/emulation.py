"""Reduced-precision models as ONNX Runtime's CPU provider can run them the way a GPU rounds.

ONNX Runtime's CPU provider has no bf16 kernels, and computes most fp16 ops in fp32 without rounding between them
(measured: x * 1e-4 * 1e-4 * 1e4 * 1e4 in fp16 gives 1, where fp16 arithmetic underflows to 0). So a model holding
bf16 or fp16 is rewritten: every such tensor (graph inputs, every op's output) becomes fp32 rounded to the reduced
type (a Cast to it and back, which ONNX Runtime keeps), weights stay stored in the reduced type and are cast to fp32
at their first use, so values carry the reduced precision, range and underflow while the arithmetic inside each op
is fp32, as on tensor cores.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from trtflow.stages.weightless import infer_shapes


def ort_runnable(model: Any) -> tuple[Any, list[str]]:
    """(a model ONNX Runtime's CPU provider runs as the GPU would round, the reduced types it emulates: bf16, fp16)."""
    import onnx

    reduced = [(onnx.TensorProto.BFLOAT16, "bf16"), (onnx.TensorProto.FLOAT16, "fp16")]
    held = [(elem, name) for elem, name in reduced if _holds(model, elem)]
    if not held:
        return model, []
    emulated = true_shapes(onnx, model)
    for elem, _ in held:
        _emulate(onnx, emulated, elem)
    return emulated, [name for _, name in held]


def true_shapes(onnx: Any, model: Any) -> Any:
    """`model` with its shapes inferred again from its inputs alone: value_info and output dimensions are set aside
    while shape inference runs (and put back into `model`), so the copy it returns holds only shapes that are true.

    AutoCast writes every dimension it does not know as one symbol `unk`, so unrelated tensors appear to share a
    size (and hundreds of value_info entries name tensors that no longer exist); ONNX Runtime's memory planner trusts
    that and reuses one buffer for both ("Shape mismatch attempting to re-use buffer {4,1,768} != {4,197,768}" on
    ViT-B/16, GPT-2 and a UNet).
    """
    graph = model.graph
    value_info = list(graph.value_info)
    outputs = [onnx.ValueInfoProto() for _ in graph.output]
    for saved, output in zip(outputs, graph.output, strict=True):
        saved.CopyFrom(output)
        output.type.tensor_type.ClearField("shape")
    del graph.value_info[:]
    try:
        return infer_shapes(onnx, model)
    finally:
        graph.value_info.extend(value_info)
        for saved, output in zip(outputs, graph.output, strict=True):
            output.CopyFrom(saved)


def _emulate(onnx: Any, model: Any, elem: int) -> None:
    """Retype every `elem` tensor as fp32 and round it to `elem` where it is made: graph inputs and op outputs.
    Weights stay stored as `elem` (never read here) and are cast to fp32 right before their first use."""
    typed = _typed(model, elem)
    inputs = [v.name for v in model.graph.input if v.type.tensor_type.elem_type == elem]
    stored = _stored_weights(model, elem)
    _to_fp32(model, elem)
    nodes = [n for name in inputs for n in _round(onnx, name, name + "__rounded", elem)]
    renamed = {name: name + "__rounded" for name in inputs}
    for node in model.graph.node:
        node.input[:] = [renamed.get(name, name) for name in node.input]
        for name in node.input:
            if name in stored:
                nodes.append(_widen(onnx, stored.pop(name), name))
        nodes.append(node)
        for index, output in enumerate(node.output):
            if output in typed:
                node.output[index] = output + "__fp32"
                nodes += _round(onnx, output + "__fp32", output, elem)
    nodes[:0] = [_widen(onnx, kept, name) for name, kept in stored.items()]  # read by subgraphs only
    del model.graph.node[:]
    model.graph.node.extend(nodes)


def _stored_weights(model: Any, elem: int) -> dict[str, str]:
    """Renames each `elem` initializer to `<name>__stored`; returns name -> stored name."""
    stored = {}
    for init in model.graph.initializer:
        if init.data_type == elem:
            stored[init.name] = f"{init.name}__stored"
            init.name = stored[init.name]
    return stored


def _widen(onnx: Any, source: str, target: str) -> Any:
    """Cast a stored reduced-precision weight to fp32 (exact: fp16 and bf16 values are fp32 values)."""
    return onnx.helper.make_node("Cast", [source], [target], to=onnx.TensorProto.FLOAT)


def _holds(model: Any, elem_type: int) -> bool:
    return (
        any(i.data_type == elem_type for i in model.graph.initializer)
        or any(a.i == elem_type for n in model.graph.node for a in n.attribute if a.name == "to")
        or any(v.type.tensor_type.elem_type == elem_type for v in [*model.graph.input, *model.graph.output])
    )


def _typed(model: Any, elem_type: int) -> set[str]:
    values = list(model.graph.value_info) + list(model.graph.input) + list(model.graph.output)
    found = {v.name for v in values if v.type.tensor_type.elem_type == elem_type}
    return found | {
        o
        for n in model.graph.node
        if n.op_type == "Cast" and any(a.name == "to" and a.i == elem_type for a in n.attribute)
        for o in n.output
    }


def _to_fp32(model: Any, elem: int) -> None:
    """Every `elem` (bf16 or fp16) type of a Constant or a Cast, and of value types, becomes fp32, exactly: both are
    subsets of fp32."""
    import onnx
    from onnx import numpy_helper

    fp32 = onnx.TensorProto.FLOAT
    for node in model.graph.node:
        for attribute in node.attribute:
            if attribute.name == "to" and attribute.i == elem:
                attribute.i = fp32
            if attribute.type == onnx.AttributeProto.TENSOR and attribute.t.data_type == elem:
                attribute.t.CopyFrom(numpy_helper.from_array(_fp32_values(attribute.t, elem), attribute.t.name))
    for value in list(model.graph.value_info) + list(model.graph.input) + list(model.graph.output):
        if value.type.tensor_type.elem_type == elem:
            value.type.tensor_type.elem_type = fp32


def _fp32_values(tensor: Any, elem: int) -> np.ndarray:
    import onnx
    from onnx import numpy_helper

    if elem == onnx.TensorProto.FLOAT16:
        return numpy_helper.to_array(tensor).astype(np.float32)
    raw = (
        np.frombuffer(tensor.raw_data, dtype=np.uint16)
        if tensor.raw_data
        else np.asarray(tensor.int32_data, dtype=np.uint16)
    )
    return (raw.astype(np.uint32) << 16).view(np.float32).reshape(tuple(tensor.dims))


def _round(onnx: Any, source: str, target: str, elem: int) -> list[Any]:
    """Cast `source` (fp32) to the reduced type and back into `target`: its value as that type holds it."""
    return [
        onnx.helper.make_node("Cast", [source], [target + "__reduced"], to=elem),
        onnx.helper.make_node("Cast", [target + "__reduced"], [target], to=onnx.TensorProto.FLOAT),
    ]
