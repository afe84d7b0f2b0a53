"""Folding never inflates: constants a graph computes from small seeds stay computed unless folding them is no larger.

onnxslim folds every constant subgraph under one size threshold; ONNX's legacy zoo (AlexNet, VGG-19, ZFNet-512)
computes its weights with ConstantOfShape from 32-byte shapes, so under a 16 MiB threshold it materialized every
weight but the largest, and their engines came out 13-21x the direct build's. Here each constant a node computes
is weighed against the seeds (initializers) it is computed from: when it is larger than they are by more than
GROWTH_ALLOWANCE (shapes, zero biases: the folds that unlock fusions), its seeds are hidden from onnxslim as
graph inputs for the duration of the pass, then put back. Example: ConstantOfShape([4096, 9216]) from a 16-byte
shape makes 151 MB: its shape is hidden, the weight stays computed (TensorRT computes it at build time).
"""

from __future__ import annotations

import math
from typing import Any

from trtflow.stages.weightless import infer_shapes

GROWTH_ALLOWANCE = 64 << 10  # bytes a fold may add over its seeds: zero biases and shape tensors stay foldable


def inflating_seeds(onnx: Any, model: Any) -> tuple[list[str], dict]:
    """Initializers whose folded descendants would be larger than them (+ the allowance), and what was weighed."""
    graph = model.graph
    seeds = {init.name: _bytes(onnx, init.data_type, list(init.dims)) for init in graph.initializer}
    seeds.update({node.output[0]: _bytes(onnx, t.data_type, list(t.dims)) for node, t in _constant_nodes(model)})
    sizes = _value_sizes(onnx, model)
    cone: dict[str, frozenset[str]] = {name: frozenset([name]) for name in seeds}  # constant value -> its seeds
    hidden: set[str] = set()
    kept_bytes = 0
    for node in graph.node:
        if node.op_type == "Constant" or not node.input or not all(i in cone for i in node.input if i):
            continue
        leaves = frozenset().union(*(cone[i] for i in node.input if i))
        for output in node.output:
            cone[output] = leaves
            size = sizes.get(output)
            if size is not None and size > sum(seeds[s] for s in leaves) + GROWTH_ALLOWANCE:
                kept_bytes += size if not leaves <= hidden else 0
                hidden |= leaves
    return sorted(hidden), {"seeds_hidden": len(hidden), "computed_bytes_kept": kept_bytes}


def hide(onnx: Any, model: Any, names: list[str]) -> list[Any]:
    """Move the named initializers (or Constant nodes' tensors) to graph inputs (onnxslim folds nothing fed by an
    input); returns them as initializers."""
    wanted = set(names)
    constants = [(node, tensor) for node, tensor in _constant_nodes(model) if node.output[0] in wanted]
    for node, tensor in constants:  # a Constant node becomes the initializer it is equivalent to
        model.graph.initializer.append(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(tensor), node.output[0]))
        model.graph.node.remove(node)
    moved = [init for init in model.graph.initializer if init.name in wanted]
    kept = [init for init in model.graph.initializer if init.name not in wanted]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    model.graph.input.extend(
        onnx.helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)) for init in moved
    )
    return moved


def restore(model: Any, moved: list[Any]) -> None:
    """Put hidden initializers back (those a pass left in use), and take them out of the graph inputs."""
    names = {init.name for init in moved}
    present = {value.name for value in model.graph.input if value.name in names}
    kept = [value for value in model.graph.input if value.name not in names]
    del model.graph.input[:]
    model.graph.input.extend(kept)
    model.graph.initializer.extend(init for init in moved if init.name in present)


def _constant_nodes(model: Any) -> list[tuple[Any, Any]]:
    """(node, tensor) of each Constant node holding a plain tensor (`value`)."""
    found = []
    for node in model.graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            found += [
                (node, attribute.t)
                for attribute in node.attribute
                if attribute.name == "value" and attribute.HasField("t")
            ]
    return found


def _value_sizes(onnx: Any, model: Any) -> dict[str, int]:
    """Bytes of every value whose type and shape shape inference knows (with data propagation, graph only)."""
    try:
        graph = infer_shapes(onnx, model, data_prop=True).graph
    except Exception:  # a graph inference cannot follow: weigh nothing, fold as onnxslim would
        return {}
    sizes = {}
    for value in graph.value_info:
        tensor = value.type.tensor_type
        dims = (
            [d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim]
            if tensor.HasField("shape")
            else None
        )
        if dims is not None and None not in dims and tensor.elem_type:
            sizes[value.name] = _bytes(onnx, tensor.elem_type, [d for d in dims if d is not None])
    return sizes


def _bytes(onnx: Any, data_type: int, dims: list[int]) -> int:
    try:
        itemsize = onnx.helper.tensor_dtype_to_np_dtype(data_type).itemsize
    except (KeyError, ValueError, TypeError):
        itemsize = 1
    size: int = math.prod(dims) * itemsize
    return size
