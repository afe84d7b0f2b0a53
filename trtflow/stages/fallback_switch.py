"""Every trial of an int8/fp8 fallback search made from one model, switched by its inputs.

Each candidate reads each input that comes through QuantizeLinear -> DequantizeLinear through a `Where` on a
boolean scalar input of its own: true, the tensor before the QuantizeLinear (what keeping the node out of
quantization computes); false, the DequantizeLinear's output. The search emulates that model once (ort_runnable)
and wires it per trial (`resolved`: each fixed switch's Where and its rounding casts gone, its reader reading the
chosen branch), since a Where copies its activation on every run (+45% per run on EfficientNet-B0). Only a
ranking's group keeps its own switches free, in the part of the model they reach (`downstream`, fallback_cuts).

The numbers are those of a copy rewired by hand, bit for bit: a wired switch reads the very tensor, a free one copies
it unchanged, and the check's sessions run every node as written (no graph optimization, so no fusion sees a Where).
Which tensors a keep reads off their Q/DQ is what ModelOpt's own model keeping those nodes reads (`switched`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

SWITCH = "trtflow_keep_high_"  # the boolean input of candidate i is SWITCH + str(i)


def switched(graph: Any, names: list[str]) -> tuple[Any, dict[str, str]]:
    """(a copy of `graph` in which each named node's quantized inputs are switched, {node name: its switch input}).
    A named node with no input through Quantize -> Dequantize gets no switch (keeping it high changes nothing).

    A switch reads a tensor off its Q/DQ as ModelOpt's model keeping those nodes does (`nodes_to_exclude`): a kept
    Conv, MatMul or Gemm reads its inputs before their QuantizeLinear; any other node reads a tensor before it only
    once no reader of it that is quantized for its own sake is quantized (`free`): ONNX Runtime's quantizer gives a
    tensor one Q/DQ, which every reader then reads, and a residual Add, Sum or ReduceMean is quantized only beside
    such a reader where it has one. BERT-base: keeping a residual Add whose other input, a LayerNorm's output, is
    also read by the next attention's projections reads that input quantized while they are; a trial reading it
    before its Q/DQ met cosine 0.995 where ModelOpt's model keeping the same nodes reached 0.991."""
    import onnx

    made_by = {o: n for n in graph.graph.node for o in n.output}
    model = onnx.ModelProto()
    model.CopyFrom(graph)
    order = {name: index for index, name in enumerate(names)}
    quantized: dict[str, dict[int, str]] = {}  # named node -> {input index: the tensor before its QuantizeLinear}
    readers: dict[str, list[str]] = {}  # a quantized tensor -> the named nodes reading it, in graph order
    ops: dict[str, str] = {}
    for node in model.graph.node:
        if node.name in order:
            for index, name in enumerate(node.input):
                before = _before_quantize(made_by, name)
                if before is not None:
                    quantized.setdefault(node.name, {})[index] = before
                    ops[node.name] = node.op_type
                    if node.name not in readers.setdefault(before, []):
                        readers[before].append(node.name)
    inputs = {name: f"{SWITCH}{order[name]}" for name in quantized}  # graph order
    free = _Conditions(inputs)
    nodes: list[Any] = []
    for node in model.graph.node:
        for index, before in quantized.get(node.name, {}).items():
            name = node.input[index]
            if ops[node.name] in LINEAR:
                condition = inputs[node.name]
            else:
                own = [r for r in readers[before] if ops[r] not in BESIDE] or readers[before]
                condition = free.all_of(own, nodes)
            chosen = f"{name}__switched_{order[node.name]}_{index}"
            nodes.append(onnx.helper.make_node("Where", [condition, before, name], [chosen], name=f"{chosen}/where"))
            node.input[index] = chosen
        nodes.append(node)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    model.graph.input.extend(
        onnx.helper.make_tensor_value_info(switch, onnx.TensorProto.BOOL, []) for switch in inputs.values()
    )
    return model, inputs


FREE = "__free"  # the suffix of an And of switches (a tensor read off its Q/DQ only when every one is set)


class _Conditions:
    """The boolean tensor that holds when every named node's switch is set: the switch itself for one, an And chain
    made once per set of nodes for more."""

    def __init__(self, inputs: dict[str, str]):
        self.inputs = inputs
        self.made: dict[tuple[str, ...], str] = {}

    def all_of(self, names: list[str], nodes: list[Any]) -> str:
        import onnx

        switches = [self.inputs[name] for name in names]
        condition = switches[0]
        for count in range(2, len(switches) + 1):
            key = tuple(switches[:count])
            if key not in self.made:
                made = f"{'_'.join(s.removeprefix(SWITCH) for s in key)}{FREE}"
                nodes.append(onnx.helper.make_node("And", [condition, key[-1]], [made], name=f"{made}/and"))
                self.made[key] = made
            condition = self.made[key]
        return condition


LINEAR = ("Conv", "ConvTranspose", "MatMul", "Gemm")  # kept out, ModelOpt takes every input of one off its Q/DQ
BESIDE = ("Add", "Sum", "ReduceMean")  # ModelOpt quantizes what they read only for another reader of it


def wiring(inputs: dict[str, str], high: Iterable[str]) -> dict[str, bool]:
    """Each switch's setting: true for the nodes in `high` (kept out of quantization), false for the rest."""
    kept = set(high)
    return {switch: name in kept for name, switch in inputs.items()}


def switches(inputs: dict[str, str], high: Iterable[str]) -> dict[str, np.ndarray]:
    """The feed of every switch (`wiring`, as the arrays a session takes)."""
    return {switch: np.array(value) for switch, value in wiring(inputs, high).items()}


def _before_quantize(made_by: dict[str, Any], name: str) -> str | None:
    """The tensor a QuantizeLinear reads, where `name` is the output of a DequantizeLinear of it; else None."""
    dequantize = made_by.get(name)
    if dequantize is None or dequantize.op_type != "DequantizeLinear":
        return None
    quantize = made_by.get(dequantize.input[0])
    if quantize is None or quantize.op_type != "QuantizeLinear":
        return None
    return str(quantize.input[0])


def resolved(model: Any, fixed: dict[str, bool]) -> Any:
    """A copy of a switched model (as ort_runnable emulates it, or not) in which each switch of `fixed` is wired: its
    Wheres, and the casts the emulation rounds their outputs by, are gone, and what read them reads the chosen branch
    (the same values: the branches were rounded where they were made). No copy per run, unlike a Where."""
    import onnx

    known, same = _folded(model, fixed)
    wired: dict[str, str] = {}
    for node in model.graph.node:
        condition = same.get(node.input[0], node.input[0]) if node.op_type == "Where" else None
        if condition in known:
            made = node.output[0].removesuffix("__fp32")
            branch = node.input[1] if known[condition] else node.input[2]
            wired.update({made: branch, f"{made}__fp32": branch, f"{made}__reduced": branch})
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    folded = set(known) | set(same)
    nodes = [node for node in copy.graph.node if not all(o in wired or o in folded for o in node.output)]
    for node in nodes:
        node.input[:] = [wired.get(name, same.get(name, name)) for name in node.input]
    del copy.graph.node[:]
    copy.graph.node.extend(nodes)
    gone = set(fixed)
    kept_inputs = [i for i in copy.graph.input if i.name not in gone]
    del copy.graph.input[:]
    copy.graph.input.extend(kept_inputs)
    return copy


def _folded(model: Any, fixed: dict[str, bool]) -> tuple[dict[str, bool], dict[str, str]]:
    """(every switch and condition whose value `fixed` decides, {a condition `fixed` reduces to one free switch or
    condition: that one}): an And of a set switch is its other input, of an unset one false."""
    known: dict[str, bool] = dict(fixed)
    same: dict[str, str] = {}
    for node in model.graph.node:
        if node.op_type == "And" and node.output[0].endswith(FREE):
            first, second = (same.get(name, name) for name in node.input)
            values = (known.get(first), known.get(second))
            if False in values or values == (True, True):
                known[node.output[0]] = values == (True, True)
            elif values[0] is True or values[1] is True:
                same[node.output[0]] = second if values[0] is True else first
    return known, same


def prunable(model: Any) -> bool:
    """Whether `downstream` may cut the model: no node holds a subgraph (which may read any tensor of the graph)."""
    import onnx

    graphs = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
    return not any(a.type in graphs for n in model.graph.node for a in n.attribute)


def downstream(model: Any, free: list[str]) -> tuple[Any, list[str]]:
    """(the part of `model` the switch inputs `free` reach, the tensors it reads that the rest computes): a trial that
    differs from another only in those switches computes the rest as that one did, so it runs from the cut, fed what
    the other computed there (declared by `declare`). Its outputs are the graph outputs the switches reach."""
    import onnx

    reached = set(free)
    nodes = []
    for node in model.graph.node:
        if any(name in reached for name in node.input):
            nodes.append(node)
            reached.update(o for o in node.output if o)
    weights = {init.name for init in model.graph.initializer}
    cut = list(dict.fromkeys(n for node in nodes for n in node.input if n and n not in reached and n not in weights))
    part = onnx.ModelProto()
    part.CopyFrom(model)
    read = {name for node in nodes for name in node.input}
    kept = [init for init in part.graph.initializer if init.name in read]
    switches_in = [i for i in part.graph.input if i.name in free]
    outputs = [o for o in part.graph.output if o.name in reached]
    for field, values in (("node", nodes), ("initializer", kept), ("input", switches_in), ("output", outputs)):
        del getattr(part.graph, field)[:]
        getattr(part.graph, field).extend(values)
    del part.graph.value_info[:]
    return part, cut


def declare(part: Any, kinds: list[Any], cut: list[str]) -> Any:
    """`part` (downstream's, its own copy) with its cut tensors declared as inputs: each as a graph input's ValueInfo
    declares it, or typed as the array that will feed it."""
    import onnx

    for name, kind in zip(cut, kinds, strict=True):
        if isinstance(kind, np.ndarray):
            kind = onnx.helper.make_tensor_value_info(name, onnx.helper.np_dtype_to_tensor_dtype(kind.dtype), None)
        part.graph.input.append(kind)
    return part
