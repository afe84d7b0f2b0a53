"""Weights a quantized model turns into values at every run, turned once: the same numbers in a third of the time.

ModelOpt's fp8 and int8 models keep their weights in fp16 and quantize them in the graph (`W -> QuantizeLinear ->
DequantizeLinear -> Conv`). ONNX Runtime's CPU provider runs those chains on every sample, element by element: two
thirds of an emulated fp8 ResNet-18 run (360 ms, 114 ms without them). Their inputs are
constants, so their outputs are too: each chain of QuantizeLinear, DequantizeLinear and Cast over initializers is
computed once, by ONNX Runtime's own kernels (the very arithmetic the run would do), and fed to every run as an input.

Fed, not stored: a constant weight lets ONNX Runtime prepack a convolution, and that changes its sums (the outputs of
the check then move by up to 5e-4); an input is read as the chain's output was, so every output is the same, bit for
bit. A chain's values take 4 bytes a weight where the model stored 1 or 2; past PRECOMPUTED_MAX_BYTES in all (a model
of more than about 250M weights), the model runs as it is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from trtflow.stages import compare
from trtflow.stages.modelfile import graphs_of

CHAIN_OPS = ("QuantizeLinear", "DequantizeLinear", "Cast")
PRECOMPUTED_MAX_BYTES = 1 << 30


@dataclass(frozen=True)
class Prepared:
    """A graph to run beside its model file, and the values fed to each of its runs beside a sample's inputs."""

    graph: Any
    values: dict[str, np.ndarray] = field(default_factory=dict)


def prepared(model_path: Path, graph: Any, memo: dict[bytes, np.ndarray] | None = None) -> Prepared:
    """`graph` (a variant of the model at `model_path`, its weights possibly in the external file beside it) with
    each constant Q/DQ chain computed once: the chain's nodes removed, its outputs graph inputs. `graph` is kept.

    `memo` holds the values of chains computed before, by what computes them (_chain_keys): a fallback search's
    trial models, variants of one model file, share most of their chains."""
    import onnx

    chain = _constant_chains(graph)
    produced = {o for n in chain for o in n.output}
    wanted = [name for name in _read_outside(graph, chain) if name in produced]
    if not wanted or _values_bytes(graph, chain, wanted) > PRECOMPUTED_MAX_BYTES:
        return Prepared(graph)
    values = _computed(model_path, graph, chain, wanted, memo)
    runnable = onnx.ModelProto()
    runnable.CopyFrom(graph)
    inside = {id(n) for n in chain}
    _replace(runnable, {index for index, n in enumerate(graph.graph.node) if id(n) in inside}, values)
    return Prepared(runnable, values)


def session(model_path: Path, made: Prepared) -> Any:
    """A session of `made` (compare.session_beside) that takes only the model's own inputs."""
    runnable = compare.session_beside(model_path, made.graph)
    return FedSession(runnable, made.values) if made.values else runnable


class FedSession:
    """An ONNX Runtime session fed its precomputed values on every run; its inputs are the model's own."""

    def __init__(self, session: Any, values: dict[str, np.ndarray]):
        self._session, self._values = session, values

    def get_inputs(self) -> list[Any]:
        """The inputs a sample gives (the precomputed ones left out)."""
        return [i for i in self._session.get_inputs() if i.name not in self._values]

    def get_outputs(self) -> list[Any]:
        """The model's outputs."""
        return list(self._session.get_outputs())

    def run(self, names: list[str] | None, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        """InferenceSession.run, the precomputed values added to `feed`. An output that is a precomputed value is that
        value: asked for an input as an output, ONNX Runtime can give a buffer it has since reused (a search's baseline,
        its cut tensors captured on two threads, came back as garbage: tests/stages/test_fallback.py)."""
        names = names or [o.name for o in self._session.get_outputs()]
        asked = [name for name in names if name not in self._values]
        got = dict(zip(asked, self._session.run(asked, {**feed, **self._values}), strict=True)) if asked else {}
        return [self._values[name] if name in self._values else got[name] for name in names]


def _constant_chains(graph: Any) -> list[Any]:
    """The top-level nodes of CHAIN_OPS whose inputs are all constants (initializers, or outputs of such nodes),
    kept only where they lead to or come from a DequantizeLinear: a Cast of a shape stays where it is."""
    constant = {i.name for i in graph.graph.initializer} | {""}
    chain = []
    for node in graph.graph.node:
        if node.op_type in CHAIN_OPS and node.domain in ("", "ai.onnx") and all(i in constant for i in node.input):
            chain.append(node)
            constant.update(node.output)
    return _around_dequantize(chain)


def _around_dequantize(chain: list[Any]) -> list[Any]:
    """The nodes of `chain` (in graph order) that are a DequantizeLinear, feed one, or are fed by one."""
    producer = _producers(chain)
    dequantized = [o for n in chain if n.op_type == "DequantizeLinear" for o in n.output if o]
    keep = {id(n) for n in _upstream(chain, producer, dequantized)}  # each DequantizeLinear and what it reads
    for node in chain:  # downstream: what reads a kept node
        if any(i in producer and id(producer[i]) in keep for i in node.input):
            keep.add(id(node))
    return [n for n in chain if id(n) in keep]


def _read_outside(model: Any, chain: list[Any]) -> list[str]:
    """The names the rest of the model reads (its other nodes, every subgraph, the outputs), in a stable order."""
    top, *subgraphs = graphs_of(model.graph)
    inside = {id(n) for n in chain}
    names = [name for node in top.node if id(node) not in inside for name in node.input]
    names += [
        name for sub in subgraphs for name in [*(i for n in sub.node for i in n.input), *(o.name for o in sub.output)]
    ]
    names += [o.name for o in top.output]
    return list(dict.fromkeys(names))


def _values_bytes(graph: Any, chain: list[Any], wanted: list[str]) -> int:
    """What the values would take at 4 bytes an element: each chain is elementwise, so as many as the initializer it
    starts from."""
    sizes: dict[str, int] = {i.name: math.prod(i.dims) for i in graph.graph.initializer}
    for node in chain:
        sizes.update(dict.fromkeys(node.output, sizes.get(node.input[0], 0)))
    return 4 * sum(sizes.get(name, 0) for name in wanted)


def _computed(
    model_path: Path, graph: Any, chain: list[Any], wanted: list[str], memo: dict[bytes, np.ndarray] | None
) -> dict[str, np.ndarray]:
    """The chain's `wanted` outputs, computed by ONNX Runtime beside the model file (its weights read from there);
    those a `memo` holds are taken from it, and the rest added to it."""
    import onnx

    if memo is None:
        memo, keys = {}, {name: name.encode() for name in wanted}
    else:
        keys = _chain_keys(graph, chain, wanted)
    values = {name: memo[keys[name]] for name in wanted if keys[name] in memo}
    missing = [name for name in wanted if name not in values]
    if missing:
        nodes = _upstream(chain, _producers(chain), missing)
        needed = {i for n in nodes for i in n.input}
        part = onnx.helper.make_graph(
            nodes,
            "precomputed",
            [],
            [onnx.ValueInfoProto(name=name) for name in missing],
            [i for i in graph.graph.initializer if i.name in needed],
        )
        model = onnx.helper.make_model(part, opset_imports=graph.opset_import, ir_version=graph.ir_version)
        outputs = compare.session_beside(model_path, model).run(missing, {})
        for value in outputs:
            value.flags.writeable = False  # shared by every session, and given back as an output: never written to
        values.update(zip(missing, outputs, strict=True))
        if sum(v.nbytes for v in memo.values()) + sum(v.nbytes for v in outputs) > PRECOMPUTED_MAX_BYTES:
            memo.clear()  # past the budget, the memo keeps what this variant reads, not what every variant read
        memo.update((keys[name], values[name]) for name in wanted)
    return {name: values[name] for name in wanted}


def _producers(chain: list[Any]) -> dict[str, Any]:
    """Output name -> the node of `chain` that makes it."""
    return {o: n for n in chain for o in n.output}


def _upstream(chain: list[Any], producer: dict[str, Any], names: list[str]) -> list[Any]:
    """The nodes of `chain` (in its order, `producer` its _producers) that `names` are computed from."""
    needed: set[int] = set()
    stack = [producer[name] for name in names]
    while stack:
        node = stack.pop()
        if id(node) not in needed:
            needed.add(id(node))
            stack += [producer[i] for i in node.input if i in producer]
    return [n for n in chain if id(n) in needed]


def _chain_keys(graph: Any, chain: list[Any], wanted: list[str]) -> dict[str, bytes]:
    """Per wanted output, a digest of what computes it: its name, the opsets, the chain's nodes it comes from and the
    weights they read (inline bytes, or the external file's location, offset and length: within one model file's
    variants, the same values)."""
    import hashlib

    weights = {i.name: i for i in graph.graph.initializer}
    producer = _producers(chain)
    keys: dict[str, bytes] = {}
    for name in wanted:
        digest = hashlib.sha256(name.encode())
        for opset in graph.opset_import:
            digest.update(opset.SerializeToString(deterministic=True))
        for node in _upstream(chain, producer, [name]):
            digest.update(node.SerializeToString(deterministic=True))
            for read in node.input:
                if read in weights:
                    digest.update(weights[read].SerializeToString(deterministic=True))
        keys[name] = digest.digest()
    return keys


def _replace(model: Any, chain: set[int], values: dict[str, np.ndarray]) -> None:
    """Drop the chain's nodes (their indices in the graph) and the initializers only they read; declare each value a
    graph input."""
    import onnx

    graph = model.graph
    kept = [n for index, n in enumerate(graph.node) if index not in chain]
    del graph.node[:]
    graph.node.extend(kept)
    read = set(_read_outside(model, []))
    dropped = {i.name for i in graph.initializer if i.name not in read}
    initializers = [i for i in graph.initializer if i.name not in dropped]
    del graph.initializer[:]
    graph.initializer.extend(initializers)
    inputs = [i for i in graph.input if i.name not in dropped]  # IR 3 lists initializers as inputs too
    del graph.input[:]
    graph.input.extend(inputs)
    graph.input.extend(
        onnx.helper.make_tensor_value_info(name, onnx.helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
        for name, v in values.items()
    )
