"""`fallback: auto` for fp16/bf16: the candidates of an AutoCast model and what keeping some of them in fp32 computes.

A candidate is a node that computes in the reduced type: what holds weights or does MACs, and what rounds between them
(a LayerNorm, a Softmax, an activation, a residual Add). Keeping nodes in fp32 is what AutoCast does with them in
`nodes_to_exclude`, done here on its model, without running it again: each kept node reads its reduced-type inputs in
fp32 (what AutoCast cast down, before the cast; its weights from the fp32 model, unrounded), computes in fp32, and
hands its output on cast back to the reduced type (a kept node after it, and a graph output, read it unrounded). The
accuracy check's emulation then runs the variant as a GPU would round it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trtflow.stages.composition import LOW_TYPES, PASS_THROUGH, value_types

KEPT = "__kept_fp32"  # the suffix of every tensor and initializer a kept node computes or reads in fp32


def candidates(graph: Any, precision: str) -> list[tuple[str, str]]:
    """(name, op) of every named node that computes in `precision`, in graph order: what holds weights or does MACs,
    and what rounds between them (a LayerNorm, a Softmax, an activation, a residual Add). Moves (a Reshape, a
    Transpose) and AutoCast's own Casts change no value."""
    low, types = LOW_TYPES[precision], value_types(graph)
    return [
        (node.name, node.op_type)
        for node in graph.graph.node
        if node.name and node.op_type not in PASS_THROUGH and any(types.get(o) == low for o in node.output if o)
    ]


def keep_high(graph: Any, names: list[str], precision: str, source: Path) -> Any:
    """A copy of the AutoCast model `graph` where the named nodes compute in fp32 (weights read from the fp32 model at
    `source`, initializer by initializer, as AutoCast left their names)."""
    import onnx

    low = LOW_TYPES[precision]
    types = value_types(graph)
    variant = onnx.ModelProto()
    variant.CopyFrom(graph)
    wanted = set(names)
    rounded = {init.name for init in variant.graph.initializer if init.data_type == low}
    weights = _fp32_weights(source, {i for n in variant.graph.node if n.name in wanted for i in n.input} & rounded)
    cast_down = {
        n.output[0]: n.input[0]
        for n in variant.graph.node
        if n.op_type == "Cast" and types.get(n.input[0]) == onnx.TensorProto.FLOAT and types.get(n.output[0]) == low
    }
    nodes: list[Any] = []
    for node in variant.graph.node:
        if node.name not in wanted:
            nodes.append(node)
            continue
        for index, name in enumerate(node.input):
            if name.endswith(KEPT) or types.get(name) != low:
                continue
            if name in weights:
                node.input[index] = name + KEPT
            elif name in cast_down:  # AutoCast's cast of an fp32 value (a graph input): the value before it
                node.input[index] = cast_down[name]
            else:  # an activation in the reduced type: its value in fp32 (exact)
                nodes.append(_cast(onnx, name, f"{name}{KEPT}_{node.name}", onnx.TensorProto.FLOAT))
                node.input[index] = f"{name}{KEPT}_{node.name}"
        nodes.append(node)
        for index, name in enumerate(node.output):
            if name and types.get(name) == low:
                node.output[index] = name + KEPT
                nodes.append(_cast(onnx, name + KEPT, name, low))
    _read_unrounded(nodes, wanted)
    del variant.graph.node[:]
    variant.graph.node.extend(nodes)
    variant.graph.initializer.extend(
        onnx.numpy_helper.from_array(value, name + KEPT) for name, value in sorted(weights.items())
    )
    return variant


def _read_unrounded(nodes: list[Any], kept: set[str]) -> None:
    """What a kept node made is read in fp32, before its Cast back to the reduced type, by a kept node after it and by
    a Cast to fp32 (AutoCast's own, before a graph output that keeps its type): as AutoCast leaves it."""
    import onnx

    made_kept = {n.output[0]: n.input[0] for n in nodes if n.op_type == "Cast" and n.input[0].endswith(KEPT)}
    widened = {n.output[0]: n.input[0] for n in nodes if n.op_type == "Cast" and KEPT + "_" in n.output[0]}
    for node in nodes:
        if node.name in kept:
            for index, name in enumerate(node.input):
                reduced = widened.get(name)
                if reduced is not None and reduced in made_kept:
                    node.input[index] = made_kept[reduced]
        elif node.op_type == "Cast" and node.input[0] in made_kept:
            if any(a.name == "to" and a.i == onnx.TensorProto.FLOAT for a in node.attribute):
                node.input[0] = made_kept[node.input[0]]


def _fp32_weights(source: Path, names: set[str]) -> dict[str, Any]:
    """The named initializers of the fp32 model, as float32 arrays (external data read from beside it)."""
    import numpy as np
    import onnx

    model = onnx.load(str(source), load_external_data=False)
    found = {}
    for init in model.graph.initializer:
        if init.name in names:
            if init.data_location == onnx.TensorProto.EXTERNAL:
                onnx.external_data_helper.load_external_data_for_tensor(init, str(source.parent))
            found[init.name] = onnx.numpy_helper.to_array(init).astype(np.float32)
    return found


def _cast(onnx: Any, source: str, target: str, to: int) -> Any:
    return onnx.helper.make_node("Cast", [source], [target], name=f"{target}/cast", to=to)
