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


class Keeper:
    """Keeps named nodes of one AutoCast model in fp32 (`keeper(graph, names)`: a copy of the graph). What every trial
    of a search shares is read once: the graph's types, AutoCast's casts of fp32 values, and the fp32 model's weights
    (kept as the model holds them: inline, or read from its external data when a trial first needs them)."""

    def __init__(self, graph: Any, precision: str, source: Path):
        import onnx

        self.low, self.types, self.source = LOW_TYPES[precision], value_types(graph), source
        self.rounded = {init.name for init in graph.graph.initializer if init.data_type == self.low}
        self.cast_down = {
            n.output[0]: n.input[0]
            for n in graph.graph.node
            if n.op_type == "Cast"
            and self.types.get(n.input[0]) == onnx.TensorProto.FLOAT
            and self.types.get(n.output[0]) == self.low
        }
        model = onnx.load(str(source), load_external_data=False)
        self._fp32 = {init.name: init for init in model.graph.initializer if init.name in self.rounded}
        self._arrays: dict[str, Any] = {}

    def __call__(self, graph: Any, names: list[str]) -> Any:
        """A copy of `graph` (this keeper's model) with the named nodes computing in fp32."""
        import onnx

        low, types = self.low, self.types
        variant = onnx.ModelProto()
        variant.CopyFrom(graph)
        wanted = set(names)
        weights = {
            name: self._weight(name)
            for node in variant.graph.node
            if node.name in wanted
            for name in node.input
            if name in self.rounded and name in self._fp32
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
                elif name in self.cast_down:  # AutoCast's cast of an fp32 value (a graph input): the value before it
                    node.input[index] = self.cast_down[name]
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

    def _weight(self, name: str) -> Any:
        """The fp32 model's initializer `name` as a float32 array (read once)."""
        import numpy as np
        import onnx

        if name not in self._arrays:
            init = self._fp32[name]
            if init.data_location == onnx.TensorProto.EXTERNAL:
                onnx.external_data_helper.load_external_data_for_tensor(init, str(self.source.parent))
            self._arrays[name] = onnx.numpy_helper.to_array(init).astype(np.float32)
        return self._arrays[name]


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


def _cast(onnx: Any, source: str, target: str, to: int) -> Any:
    return onnx.helper.make_node("Cast", [source], [target], name=f"{target}/cast", to=to)
