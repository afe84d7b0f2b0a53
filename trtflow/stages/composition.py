"""What a reduced-precision model really is: the share of its weights and MACs in the requested precision, and the
nodes kept in higher precision, each with the reason the tool gave.

AutoCast kept 40 of VGG-19's 48 nodes in fp32 (96 MB of fp32 weights): an "fp16" engine the size of the fp32 one.
Weights are counted in elements (so fp16, int8 and fp32 weigh alike), MACs from inferred shapes (a symbolic
dimension counts 1: the shares are ratios); nodes without MACs count only from SMALL_WEIGHTS elements on (an
embedding Gather counts, a bias Add does not). A node is in the requested precision when it computes in fp16/bf16
(AutoCast) or is fed by a DequantizeLinear (PTQ).

    composition(model, "fp16", {"conv1": "data range: ..."})
    -> {"weight_share": 0.97, "mac_share": 0.99, "kept": [{"name": "conv1", "op": "Conv", "weights": 864, ...}], ...}
"""

from __future__ import annotations

import math
from typing import Any

from trtflow.stages.weightless import infer_shapes
from trtflow.util.onnxio import composition as counts

TOP_KEPT = 10  # kept nodes listed in the record, by weights then MACs
SMALL_WEIGHTS = 1024  # elements: a node without MACs holding fewer (a bias Add, a scale Mul) is not weighed
PASS_THROUGH = (
    "DequantizeLinear",
    "QuantizeLinear",
    "Cast",
    "Transpose",
    "Reshape",
    "Identity",
    "Unsqueeze",
    "Squeeze",
)
RECURRENT = ("LSTM", "GRU", "RNN")
LOW_TYPES = {"fp16": 10, "bf16": 16}  # onnx.TensorProto.FLOAT16, BFLOAT16
AUTOCAST_RULES = {
    "DisabledOpTypes": "autocast.keep_op_types (recipe)",
    "DisabledNodeNameRegexRule": "autocast.keep_nodes (recipe)",
    "DepthOfReductionRule": "depth of reduction",
    "InitializerRangeRule": "initializer range",
}


def composition(model: Any, precision: str, reasons: dict[str, str] | None = None, excluded: tuple = ()) -> dict:
    """The counts of onnxio.composition plus shares and the top nodes kept in higher precision, with reasons."""
    rows = compute_nodes(model, precision)
    weights = sum(r["weights"] for r in rows)
    macs = sum(r["macs"] for r in rows)
    kept = [r for r in rows if not r.pop("low")]
    for row in kept:
        row["reason"] = _reason(row, precision, reasons or {}, excluded)
    kept.sort(key=lambda r: (-r["weights"], -r["macs"], r["name"]))
    return {
        **counts(model),
        "precision": precision,
        "weight_share": _share(weights - sum(r["weights"] for r in kept), weights),
        "mac_share": _share(macs - sum(r["macs"] for r in kept), macs),
        "kept_nodes": len(kept),
        "kept": kept[:TOP_KEPT],
    }


def shares_keeping(model: Any, precision: str, names: set[str]) -> dict[str, float]:
    """The weight and MAC shares left in `precision` if the named nodes of `model` were kept in high precision too."""
    rows = compute_nodes(model, precision)
    weights, macs = sum(r["weights"] for r in rows), sum(r["macs"] for r in rows)
    low = [r for r in rows if r["low"] and r["name"] not in names]
    return {
        "weight_share": _share(sum(r["weights"] for r in low), weights),
        "mac_share": _share(sum(r["macs"] for r in low), macs),
    }


def _share(part: int, whole: int) -> float:
    return round(part / whole, 6) if whole else 1.0


def autocast_reason(message: str) -> tuple[str, str] | None:
    """(node, reason) from AutoCast's `Skipping node <name>: <rule or detail>` log line, else None."""
    if not message.startswith("Skipping node "):
        return None
    name, _, detail = message[len("Skipping node ") :].partition(": ")
    if detail.startswith("reference IO out of range"):
        return name, "data range: " + detail[len("reference IO ") :]
    if detail.startswith("initializer "):
        return name, "initializer range: " + detail
    return name, AUTOCAST_RULES.get(detail, detail)


def _reason(row: dict, precision: str, reasons: dict[str, str], excluded: tuple) -> str:
    if row["name"] in reasons:
        return reasons[row["name"]]
    if precision in LOW_TYPES:
        return "kept by AutoCast (op or type not supported in reduced precision)"
    import re

    ops, names = excluded or ((), ())
    if row["op"] in ops or any(re.search(pattern, row["name"]) for pattern in names):
        return "excluded (quantize.exclude_op_types / exclude_nodes)"
    return "not quantized by ModelOpt (op not quantizable, or too small to gain)"


def compute_nodes(model: Any, precision: str) -> list[dict]:
    """Every node holding weights or doing MACs: name, op, weight elements, MACs, whether it runs in `precision`."""
    graph = model.graph
    dims = _dims(model)
    inits = {init.name: math.prod(init.dims) for init in graph.initializer}
    producer = {out: node for node in graph.node for out in node.output}
    dequantized = {node.output[0] for node in graph.node if node.op_type == "DequantizeLinear"}
    rows = []
    for node in graph.node:
        if node.op_type in PASS_THROUGH:
            continue
        weight_inputs = [w for w in (_weight_of(i, inits, producer) for i in node.input if i) if w]
        weights = sum(inits[w] for w in weight_inputs)
        macs = _macs(node, dims, inits, weight_inputs)
        if not macs and weights < SMALL_WEIGHTS:
            continue
        low = (
            bool(dequantized.intersection(node.input))
            if precision not in LOW_TYPES
            else dims.get(("type", node.output[0])) == LOW_TYPES[precision]
        )
        rows.append(
            {"name": node.name or node.output[0], "op": node.op_type, "weights": weights, "macs": macs, "low": low}
        )
    return rows


def value_types(model: Any) -> dict[str, int]:
    """Tensor name -> ONNX element type of every value shape inference types, and of every initializer."""
    found = {key[1]: elem for key, elem in _dims(model).items() if isinstance(key, tuple)}
    return found | {init.name: init.data_type for init in model.graph.initializer}


def _weight_of(value: str, inits: dict, producer: dict) -> str | None:
    """The initializer behind an input, through Q/DQ, Cast, Transpose, Reshape... chains; None for an activation."""
    for _ in range(8):
        if value in inits:
            return value
        node = producer.get(value)
        if node is None or node.op_type not in PASS_THROUGH:
            return None
        value = node.input[0]
    return None


def _macs(node: Any, dims: dict, inits: dict[str, int], weights: list[str]) -> int:
    out: list[int] | None = dims.get(node.output[0]) if node.output else None
    if node.op_type in ("Conv", "ConvTranspose") and out and weights:
        channels: list[int] = dims.get(weights[0]) or dims.get(node.input[1]) or [1]
        return math.prod(out) * inits[weights[0]] // max(channels[0], 1)
    if node.op_type in ("MatMul", "Gemm") and out:
        inner: list[int] = dims.get(node.input[0]) or [1]
        transposed = node.op_type == "Gemm" and any(a.name == "transA" and a.i for a in node.attribute)
        return math.prod(out) * (inner[0] if transposed and len(inner) > 1 else inner[-1])
    if node.op_type in RECURRENT and weights:
        sequence: list[int] = dims.get(node.input[0]) or [1, 1]
        return sum(inits[w] for w in weights) * math.prod(sequence[:2])
    return 0


def _dims(model: Any) -> dict:
    """Static dims (symbolic ones as 1) of every value and initializer, and ("type", name) -> element type."""
    import onnx

    try:
        graph = infer_shapes(onnx, model).graph
    except Exception:  # what shape inference cannot follow counts no MACs
        graph = model.graph
    found: dict = {init.name: list(init.dims) for init in graph.initializer}
    for value in [*graph.input, *graph.value_info, *graph.output]:
        tensor = value.type.tensor_type
        found[("type", value.name)] = tensor.elem_type
        if tensor.HasField("shape"):
            found[value.name] = [
                d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else 1 for d in tensor.shape.dim
            ]
    return found
