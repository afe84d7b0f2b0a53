"""Cleanup: simplify the source ONNX, normalize its IR (and opset) version, infer shapes, check it, save it, prove it
equal.

Simplification is onnxslim's: constant folding, dead-node elimination (Identity, Dropout, no-op
Cast/Reshape/Pad/Slice), pattern fusion (Conv+BatchNorm, GELU, Gemm...), common-subexpression elimination
and weight tying, iterated to a fixed point with shape inference between rounds. It is pure Python on
onnx-graphsurgeon (folding evaluates on ONNX Runtime), maintained, and removed the most nodes of the three
maintained tools on the test models (see README: Sources and cleanup); every pass has a recipe switch.

Folding never inflates: a constant a node computes is folded only when it is no larger than the seeds it is computed
from (+ 64 KiB for shapes and zero biases; stages.folding), and never larger than `fold_size_limit_mib` (onnxslim's
size threshold): weights a graph computes from small seeds stay computed, as TensorRT builds them, instead of
bloating the model and its engines.
Before onnxslim, a CastLike whose target type is known becomes a Cast (exact): the dynamo exporter's zero conv
biases, CastLike(0, input), otherwise hide every Conv+BatchNorm fusion from it.

Only the graph and small tensors are loaded (modelfile.load_graph): a multi-GB model's weights are copied
into the output file in chunks, never held by a pass. An IR 3 model (every initializer also a graph input)
becomes IR 4 with its initializers constants only, as every pass assumes; the IR version is lowered to one
every consumer reads (onnx 1.23 writes IR 14; ONNX Runtime 1.31 refuses it). The cleaned model is then run
beside its input on ONNX Runtime (CPU) over seeded inputs within the profiles; an output outside the
recipe's fp32 tolerances fails the stage, naming it, unless `verify.on_fail` is warn. on_fail is a policy
over the proof, not part of the key: changing it reruns nothing, and a failed proof cached under warn fails
the run when on_fail is fail again (finish).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any, Literal

from trtflow.errors import StageError
from trtflow.recipe.source import CleanupOptions
from trtflow.stages import folding
from trtflow.stages.base import (
    CACHED_UNDER_WARN,
    MIB,
    SMALL_INPUTS,
    Dep,
    Node,
    NodeId,
    NodeInfo,
    Placement,
    ProofSettings,
    RecipeContext,
    Stage,
    StageOutput,
    StageParams,
    Upstream,
    declared_memory,
    enforce_proof,
)
from trtflow.stages.capture import captured_output
from trtflow.stages.modelfile import load_graph, save_model
from trtflow.stages.weightless import infer_shapes
from trtflow.store.records import StageRecord
from trtflow.util.memory import released_after
from trtflow.util.onnxio import tensor_bytes, tensor_info
from trtflow.util.servers import TOOLS_SERVER
from trtflow.util.versions import ort_version, tool_version

PROOF_FAILED = "the cleaned model differs from the source: onnx_compare"
# versions: 4: IR 3 models upgraded, folding bounded by size, CastLike resolved, initializer_bytes; 5: CPU-independent
# sessions; 6: no fold larger than its seeds (stages.folding); 7: integer inputs drawn as the graph accepts them
KIND, VERSION = "cleanup", 7
# IR 3 lists every initializer as a graph input too; from IR 4 on initializers are constants of their own.
MIN_IR_VERSION = 4
# The newest IR version ONNX Runtime and the TensorRT parsers read; a model needing more keeps its own.
MAX_IR_VERSION = 10
# recipe switch -> onnxslim's name for the optimization it skips
SLIM_PASSES = {
    "fold_constants": "constant_folding",
    "fuse_patterns": "graph_fusion",
    "remove_dead_nodes": "dead_node_elimination",
    "eliminate_common_subexpressions": "subexpression_elimination",
    "tie_weights": "weight_tying",
}


class Proof(ProofSettings):
    """What decides the equality proof's result: the recipe's fp32 tolerances and seed, and how many samples."""

    samples: int


class Params(StageParams):
    """The recipe's cleanup switches, the profiles and the proof's settings; `on_fail` rides along outside the key."""

    FINGERPRINT = ("onnx", "onnxruntime", "onnxslim")
    POLICY = ("on_fail",)
    profiles: list[dict[str, dict[str, list[int]]]]
    proof: Proof
    options: CleanupOptions
    on_fail: Literal["fail", "warn"] = "fail"
    onnx: str | None
    onnxruntime: str | None
    onnxslim: str | None


def node(ctx: RecipeContext, export: Node | None) -> Node:
    """Cleanup of the source ONNX (or of the export's); it proves its output equal to its input within the fp32
    tolerances.

    An ONNX source is read in place, with every external data file its graph names (hashed as inputs
    `model.data:<location>`); `where` lets planning name the recipe field when one of them is missing.
    """
    verify = ctx.recipe.verify
    samples = verify.rewrite_samples_for(ctx.profiles)
    proof = Proof(rtol=verify.rtol, atol=verify.atol, samples=samples, seed=verify.seed, values=ctx.input_values)
    params = Params(
        profiles=ctx.profiles,
        proof=proof,
        options=ctx.recipe.cleanup,
        on_fail=verify.on_fail,
        onnx=tool_version("onnx"),
        onnxruntime=ort_version(),
        onnxslim=tool_version("onnxslim"),
    )
    node_id = NodeId.of(KIND, ctx.name)
    if export is not None:
        return Node(id=node_id, version=VERSION, params=params, deps=(Dep("model", export.id, "model"),))
    return Node(
        id=node_id,
        version=VERSION,
        params=params,
        sources=(("model", ctx.item.source_path(ctx.root)),),
        info=NodeInfo(where=ctx.item.where("source", "onnx")),
    )


def run(params: Params, inputs: dict[str, Upstream], workdir: Path) -> StageOutput:
    """Clean the model, save it (weights copied in chunks), check it, and prove it equal to its input on ONNX
    Runtime."""
    import onnx

    from trtflow.stages import compare

    source, options = inputs["model"], params.options
    model, unloaded = _load(onnx, source.files["model"])
    before = model_summary(model)
    # onnxslim's graph (cycles, with copies of the weights) is freed before the model is written and proven
    with captured_output() as log, released_after():
        model, passes = _clean(onnx, model, options)
    files, serialized = save_model(onnx, model, workdir, unloaded=unloaded)
    _check(onnx, files["model"] if serialized is None else serialized)
    equality = compare.prove_equal(files["model"], source.files["model"], params.profiles, params.proof.model_dump())
    enforce_proof(params.on_fail, equality, PROOF_FAILED)
    record = {
        "source_sha256": source.sha256["model"],
        "source_files": source.sha256,
        "before": before,
        "after": model_summary(model),
        "passes": passes,
        "external_data": serialized is None,
        "equality": equality,
        "log": log,
    }
    return StageOutput(files=files, record=record)


def finish(node: Node, record: StageRecord, place: Placement) -> str | None:
    """A cached cleanup whose proof failed (it ran under on_fail: warn) fails the run when on_fail is fail now."""
    enforce_proof(node.params_as(Params).on_fail, record["record"]["equality"], PROOF_FAILED, CACHED_UNDER_WARN)
    return None


def _load(onnx: Any, path: Path) -> tuple[Any, dict]:
    try:
        return load_graph(onnx, path)
    except Exception as exc:
        raise StageError(f"cannot parse the ONNX model: {type(exc).__name__}: {exc}") from exc


def _clean(onnx: Any, model: Any, options: CleanupOptions) -> tuple[Any, list[str]]:
    """Run the enabled passes in order; returns the model and the names of the passes that ran."""
    passes = _modernize(onnx, model)
    if options.simplify:
        resolved = _castlike_to_cast(onnx, model) if options.fold_constants else 0
        passes += [f"castlike_to_cast {resolved}"] if resolved else []
        typed = _typed_constants(onnx, model)
        passes += [f"typed_constants {typed}"] if typed else []
        model, ran = _simplify(onnx, model, options)
        passes += ran
    if options.opset is not None:
        model = _convert_opset(onnx, model, options.opset)
        passes.append(f"opset {options.opset}")
    model.ir_version = _normalized_ir_version(onnx, model)
    passes.append(f"ir_version {model.ir_version}")
    if options.infer_shapes:
        model = infer_shapes(onnx, model, check_type=True, data_prop=True)
        passes.append("infer_shapes")
    return model, passes


def _simplify(onnx: Any, model: Any, options: CleanupOptions) -> tuple[Any, list[str]]:
    """onnxslim's passes, with the seeds of every fold that would inflate the model hidden from it (stages.folding)."""
    import onnxslim

    skipped = [name for switch, name in SLIM_PASSES.items() if not getattr(options, switch)]
    limit = options.fold_size_limit_mib
    threshold = None if limit is None else max(1, int(limit * MIB))  # bytes; onnxslim folds nothing larger
    hidden, weighed = folding.inflating_seeds(onnx, model) if options.fold_constants and limit is not None else ([], {})
    moved = folding.hide(onnx, model, hidden)
    try:
        slimmed = onnxslim.slim(
            model, no_shape_infer=not options.infer_shapes, skip_optimizations=skipped or None, size_threshold=threshold
        )
    except Exception as exc:
        raise StageError(
            f"cleanup.simplify: onnxslim failed: {type(exc).__name__}: {exc} "
            "(switch the pass off in the recipe's cleanup: block, or simplify: false)"
        ) from exc
    folding.restore(slimmed, moved)
    ran = [switch for switch, name in SLIM_PASSES.items() if name not in skipped]
    kept = [f"fold_kept_computed {weighed['seeds_hidden']} ({weighed['computed_bytes_kept']} bytes)"] if hidden else []
    return slimmed, ran + kept + (["symbolic_shapes"] if options.infer_shapes else [])


def _modernize(onnx: Any, model: Any) -> list[str]:
    """An IR 3 model's initializers leave the graph inputs (IR 4: constants only); then the IR version every reader
    takes."""
    passes = []
    if model.ir_version < MIN_IR_VERSION:
        names = {tensor.name for tensor in model.graph.initializer}
        kept = [value for value in model.graph.input if value.name not in names]
        passes.append(f"initializer_inputs_removed {len(model.graph.input) - len(kept)}")
        del model.graph.input[:]
        model.graph.input.extend(kept)
        model.ir_version = MIN_IR_VERSION
    model.ir_version = _normalized_ir_version(onnx, model)
    return passes


def _castlike_to_cast(onnx: Any, model: Any) -> int:
    """CastLike(x, like) -> Cast(x, to=<like's element type>) wherever that type is known; returns how many."""
    nodes = [node for node in model.graph.node if node.op_type == "CastLike" and node.domain in ("", "ai.onnx")]
    types = _element_types(onnx, model) if nodes else {}
    resolved = [node for node in nodes if types.get(node.input[1])]
    for node in resolved:  # Cast takes the same attributes as CastLike (saturate, ...) in every opset
        node.attribute.append(onnx.helper.make_attribute("to", types[node.input[1]]))
        node.op_type = "Cast"
        del node.input[1:]
    return len(resolved)


# A Constant's list and scalar attributes and the element type the ONNX spec gives them.
CONSTANT_LISTS = {"value_float": "float32", "value_floats": "float32", "value_int": "int64", "value_ints": "int64"}


def _typed_constants(onnx: Any, model: Any) -> int:
    """Constant(value_floats=[...]) -> Constant(value=<float32 tensor>), and likewise for value_float(s)/value_int(s):
    the same values. onnxslim lowers the list forms with numpy's default type when the graph does not say it, so a
    diffusers UNet's Resize scales came out float64 and ONNX Runtime refused the model. Returns how many."""
    import numpy as np
    from onnx import numpy_helper

    count = 0
    for node in model.graph.node:
        attribute = node.attribute[0] if node.op_type == "Constant" and len(node.attribute) == 1 else None
        if attribute is None or attribute.name not in CONSTANT_LISTS:
            continue
        dtype = CONSTANT_LISTS[attribute.name]
        values = onnx.helper.get_attribute_value(attribute)
        array = np.array(values, dtype=dtype)
        del node.attribute[:]
        node.attribute.append(onnx.helper.make_attribute("value", numpy_helper.from_array(array)))
        count += 1
    return count


def _element_types(onnx: Any, model: Any) -> dict[str, int]:
    """Element type by value name: declared in the graph, else inferred (ONNX shape inference, no weights read)."""
    graph = model.graph
    try:
        inferred = infer_shapes(onnx, model).graph.value_info
    except Exception:
        inferred = []
    values = [*inferred, *graph.value_info, *graph.output, *graph.input]
    types = {value.name: value.type.tensor_type.elem_type for value in values if value.type.HasField("tensor_type")}
    types.update({tensor.name: tensor.data_type for tensor in graph.initializer})
    return {name: elem_type for name, elem_type in types.items() if elem_type}


def _convert_opset(onnx: Any, model: Any, opset: int) -> Any:
    try:
        return onnx.version_converter.convert_version(model, opset)
    except Exception as exc:
        raise StageError(
            f"cleanup.opset: cannot convert the model to opset {opset}: {str(exc).strip().splitlines()[-1]}"
        ) from exc


def _check(onnx: Any, model: Path | bytes) -> None:
    """The checker on the model as written: the bytes written when its weights are inline (8x faster than reading the
    file back), by path when they are external (it then reads the graph and finds the weights file)."""
    try:
        onnx.checker.check_model(str(model) if isinstance(model, Path) else model)
    except onnx.checker.ValidationError as exc:
        raise StageError(f"the model fails the ONNX checker: {str(exc).splitlines()[0]}") from exc


def _normalized_ir_version(onnx: Any, model: Any) -> int:
    needed = onnx.helper.find_min_ir_version_for(list(model.opset_import), ignore_unknown=True)
    return int(min(model.ir_version, max(MAX_IR_VERSION, needed)))


def model_summary(model: Any) -> dict:
    """Node counts (in all and per op type) and I/O of a model, recorded before and after cleanup."""
    initializers = {init.name for init in model.graph.initializer}
    return {
        "nodes": len(model.graph.node),
        "initializer_bytes": sum(tensor_bytes(tensor) for tensor in model.graph.initializer),
        "ops": dict(sorted(Counter(node.op_type for node in model.graph.node).items())),
        "ir_version": model.ir_version,
        "opsets": {entry.domain or "ai.onnx": entry.version for entry in model.opset_import},
        "inputs": [tensor_info(v).to_json() for v in model.graph.input if v.name not in initializers],
        "outputs": [tensor_info(v).to_json() for v in model.graph.output],
    }


STAGE = Stage(
    KIND,
    VERSION,
    run,
    finish=finish,
    runs_in=TOOLS_SERVER,
    warm_imports=("trtflow.stages.cleanup", "onnx", "onnxruntime", "onnxslim"),
    memory=declared_memory(400 * MIB, 4.0),
    # measured in cold runs: ResNet-18's (47 MB) 1.3 s without them, 1.8-2.0 s with; BERT-base's (440 MB) 21.9 s with
    # them, 25.9 s without (docs/memory.md)
    huge_pages_above=SMALL_INPUTS,
)
