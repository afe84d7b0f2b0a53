"""Every trial of an int8/fp8 fallback search as one ONNX Runtime model, switched by its inputs.

Each candidate reads each input that comes through QuantizeLinear -> DequantizeLinear through a `Where` on a
boolean scalar input of its own: true, the tensor before the QuantizeLinear (what keeping the node out of
quantization computes, as `bypass_qdq` rewires it); false, the DequantizeLinear's output. One session per thread
then serves every trial of a search, each fed its switches beside the samples, instead of a copy of the model
rewritten, serialized and loaded per trial (on BERT-base, a session over 440 MB of weights each time).

The numbers are those of the rewired copy, bit for bit: `Where` copies one of its inputs unchanged, and the check's
sessions run every node as written (no graph optimization, so no fusion sees the `Where`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

SWITCH = "trtflow_keep_high_"  # the boolean input of candidate i is SWITCH + str(i)


def switched(graph: Any, names: list[str]) -> tuple[Any, dict[str, str]]:
    """(a copy of `graph` in which each named node's quantized inputs are switched, {node name: its switch input}).
    A named node with no input through Quantize -> Dequantize gets no switch (keeping it high changes nothing)."""
    import onnx

    made_by = {o: n for n in graph.graph.node for o in n.output}
    model = onnx.ModelProto()
    model.CopyFrom(graph)
    order = {name: index for index, name in enumerate(names)}
    inputs: dict[str, str] = {}
    nodes: list[Any] = []
    for node in model.graph.node:
        if node.name in order:
            for index, name in enumerate(node.input):
                before = _before_quantize(made_by, name)
                if before is None:
                    continue
                switch = inputs.setdefault(node.name, f"{SWITCH}{order[node.name]}")
                chosen = f"{name}__switched_{order[node.name]}_{index}"
                nodes.append(onnx.helper.make_node("Where", [switch, before, name], [chosen], name=f"{chosen}/where"))
                node.input[index] = chosen
        nodes.append(node)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    model.graph.input.extend(
        onnx.helper.make_tensor_value_info(switch, onnx.TensorProto.BOOL, []) for switch in inputs.values()
    )
    return model, inputs


def switches(inputs: dict[str, str], high: Iterable[str]) -> dict[str, np.ndarray]:
    """The feed of every switch: true for the nodes in `high` (kept out of quantization), false for the rest."""
    kept = set(high)
    return {switch: np.array(name in kept) for name, switch in inputs.items()}


def _before_quantize(made_by: dict[str, Any], name: str) -> str | None:
    """The tensor a QuantizeLinear reads, where `name` is the output of a DequantizeLinear of it; else None."""
    dequantize = made_by.get(name)
    if dequantize is None or dequantize.op_type != "DequantizeLinear":
        return None
    quantize = made_by.get(dequantize.input[0])
    if quantize is None or quantize.op_type != "QuantizeLinear":
        return None
    return str(quantize.input[0])
