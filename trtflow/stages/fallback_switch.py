"""Every trial of an int8/fp8 fallback search made from one model, switched by its inputs.

Each candidate reads each input that comes through QuantizeLinear -> DequantizeLinear through a `Where` on a
boolean scalar input of its own: true, the tensor before the QuantizeLinear (what keeping the node out of
quantization computes); false, the DequantizeLinear's output. The search emulates that model once (ort_runnable)
and wires it per trial (`resolved`: each fixed switch's Where and its rounding casts gone, its reader reading the
chosen branch), since a Where copies its activation on every run (+45% per run on EfficientNet-B0). Only a
ranking's group keeps its own switches free, in the part of the model they reach (`downstream`, fallback_cuts).

The numbers are those of a copy rewired by hand, bit for bit: a wired switch reads the very tensor, a free one copies
it unchanged, and the check's sessions run every node as written (no graph optimization, so no fusion sees a Where).
`as_modelopt_keeps` says which switches a keep sets as ModelOpt's own model keeping those nodes would read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
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


LINEAR = ("Conv", "ConvTranspose", "MatMul", "Gemm")  # kept out, ModelOpt takes every input of one off its Q/DQ
BESIDE = ("Add", "Sum", "ReduceMean")  # ModelOpt quantizes what they read only for another reader of it
# Where as_modelopt_keeps was measured to name what ModelOpt's model reads off its Q/DQ, bit for bit: convolutional
# networks. In a transformer ModelOpt's attention partitions place more than that (the zoo encoder: a kept Add took a
# Transpose off its Q/DQ too), so there the search judges no keep as ModelOpt will make it.
FORESEEABLE = frozenset(
    ("Conv", "ConvTranspose", "Gemm", "Mul", "Relu", "Clip", "HardSwish", "HardSigmoid", "Sigmoid", "MaxPool")
    + ("AveragePool", "GlobalAveragePool", *BESIDE)
)


def as_modelopt_keeps(graph: Any, names: list[str]) -> Callable[[Iterable[str]], list[str]] | None:
    """What reads off its Q/DQ in ModelOpt's model when `nodes_to_exclude` keeps some of the named nodes (`graph`
    quantized with none kept): a kept Conv, MatMul or Gemm (ModelOpt removes its inputs' Q/DQ), and every named node
    whose every quantized input is quantized no more, a tensor being quantized while a reader of it that is not kept
    is quantized for its own sake (ONNX Runtime's quantizer then has every reader of it read its DequantizeLinear).
    A residual Add or a ReduceMean is quantized only beside another reader where it has one.

    Measured: on EfficientNet-B0's int8, ModelOpt's model keeping 35 nodes had 11 more off their Q/DQ (the Adds and
    ReduceMeans beside kept convolutions), each one so explained, and no other. On the zoo's MobileNetV3-,
    EfficientNet- and ResNet-style models, 5 keeps each: int8 names exactly what ModelOpt's model reads off its Q/DQ
    in all 15, whose trials compute ModelOpt's models bit for bit (tests/stages/test_fallback.py); fp8 in 14 (in the
    15th ModelOpt also took the residual Add of a downsampling block off, beside its kept convolution: no rule found
    that holds for both). A wrong foresight costs a ModelOpt run or keeps a node more, never a wrong result: ModelOpt's
    model is checked. None where a named node is of a type outside FORESEEABLE (a MatMul: a transformer)."""
    made_by = {o: n for n in graph.graph.node for o in n.output}
    wanted = set(names)
    ops: dict[str, str] = {}
    sources: dict[str, set[str]] = {}
    readers: dict[str, set[str]] = {}
    for node in graph.graph.node:
        if node.name in wanted:
            ops[node.name] = node.op_type
            for name in node.input:
                before = _before_quantize(made_by, name)
                if before is not None:
                    sources.setdefault(node.name, set()).add(before)
                    readers.setdefault(before, set()).add(node.name)
    if any(op not in FORESEEABLE for op in ops.values()):
        return None
    own = {t: {r for r in rs if ops[r] not in BESIDE} or rs for t, rs in readers.items()}

    def high(kept: Iterable[str]) -> list[str]:
        out = set(kept)
        still = {t for t, rs in own.items() if rs - out}  # quantized for a reader not kept
        return sorted(
            name
            for name in names
            if (name in out and ops.get(name) in LINEAR) or (name in sources and not sources[name] & still)
        )

    return high


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

    wired: dict[str, str] = {}
    for node in model.graph.node:
        if node.op_type == "Where" and node.input[0] in fixed:
            made = node.output[0].removesuffix("__fp32")
            branch = node.input[1] if fixed[node.input[0]] else node.input[2]
            wired.update({made: branch, f"{made}__fp32": branch, f"{made}__reduced": branch})
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    nodes = [node for node in copy.graph.node if not all(o in wired for o in node.output)]
    for node in nodes:
        node.input[:] = [wired.get(name, name) for name in node.input]
    del copy.graph.node[:]
    copy.graph.node.extend(nodes)
    gone = set(fixed)
    kept_inputs = [i for i in copy.graph.input if i.name not in gone]
    del copy.graph.input[:]
    copy.graph.input.extend(kept_inputs)
    return copy


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
