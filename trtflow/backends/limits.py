"""What a backend cannot build for an architecture, found in the actual graph before the builder is asked.

TensorRT-RTX's support matrix: Turing (sm_75) runs FP32 and FP16 but "does not support FP32 GEMMs and 3D
convolutions" (its footnote), and no BF16, FP8 or FP4; FP8 GEMMs need sm_89, FP4 GEMMs sm_120 (precisions are
checked when a recipe loads: recipe.precision.PRECISION_MIN_COMPUTE_CAPABILITY). Measured here with TensorRT-RTX
1.7.1: an fp32 Gemm, MatMul or LSTM fails for sm_75 with `FP32 GEMM is not supported`; convolutions (depthwise,
squeeze-excitation 1x1) and fp16 GEMMs build.

A node's element type comes from the graph after shape inference; a node whose type cannot be told is not
refused here (the builder still has the last word).
"""

from __future__ import annotations

from typing import Any

from trtflow.util.cc import ComputeCapability
from trtflow.util.onnxio import value_types

# Ops a backend's builder implements for no architecture at all, each with the way out. Measured with TensorRT-RTX
# 1.7.1 on a detector ending in NonMaxSuppression: `nms_20 has no runners that implement it`, for every target (full
# TensorRT's parser maps the op to its INMSLayer).
UNBUILDABLE_OPS = {
    "tensorrt-rtx": {
        "NonMaxSuppression": "export the model up to its boxes and scores and run NMS after the engine, or build "
        "this recipe with full TensorRT (its NMS layer)",
    },
}
GEMM_OPS = ("Gemm", "MatMul", "LSTM", "GRU", "RNN", "Attention")
CONV_OPS = ("Conv", "ConvTranspose")
TURING = ComputeCapability("sm_75")
FLOAT32 = 1  # onnx.TensorProto.FLOAT


def has_limits(backend: str, cc: str) -> bool:
    """Whether `backend` has graph limits for `cc` at all (when not, nothing needs to read the graph)."""
    return backend == "tensorrt-rtx" and ComputeCapability.parse(cc) == TURING


def unsupported_nodes(backend: str, cc: str, model: Any) -> dict[str, list[str]]:
    """{limit: [node names]} of what `backend` cannot compile for `cc` in the ONNX `model` (a ModelProto)."""
    if not has_limits(backend, cc):
        return {}
    types, ranks = value_types(model)
    found = {
        "FP32 GEMM is not supported on Turing (sm_75)": [
            _name(n) for n in model.graph.node if n.op_type in GEMM_OPS and types.get(n.input[0]) == FLOAT32
        ],
        "3D convolutions are not supported on Turing (sm_75)": [
            _name(n)
            for n in model.graph.node
            if n.op_type in CONV_OPS and len(n.input) > 1 and ranks.get(n.input[1]) == 5
        ],
    }
    return {limit: nodes for limit, nodes in found.items() if nodes}


def unbuildable_nodes(backend: str, model: Any) -> dict[str, list[str]]:
    """{"<op> has no <backend> implementation": [node names]} for the ops `backend` builds for no architecture."""
    limits = UNBUILDABLE_OPS.get(backend, {})
    found: dict[str, list[str]] = {}
    for node in model.graph.node:
        if node.op_type in limits:
            found.setdefault(f"{node.op_type} has no {backend} implementation", []).append(_name(node))
    return found


def way_out(backend: str, found: dict[str, list[str]]) -> str:
    """What to do about the first op of `unbuildable_nodes`' answer."""
    op = next(iter(found)).split(" ", 1)[0]
    return UNBUILDABLE_OPS[backend][op]


def describe(found: dict[str, list[str]], most: int = 3) -> str:
    """`FP32 GEMM is not supported on Turing (sm_75): /fc/Gemm, /head/MatMul (+4 more)`."""
    parts = []
    for limit, nodes in found.items():
        more = f" (+{len(nodes) - most} more)" if len(nodes) > most else ""
        parts.append(f"{limit}: {', '.join(nodes[:most])}{more}")
    return "; ".join(parts)


def _name(node: Any) -> str:
    return node.name or f"{node.op_type}({node.output[0]})"
