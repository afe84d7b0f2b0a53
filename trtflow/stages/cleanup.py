"""Cleanup: simplify the source ONNX, normalize its IR (and opset) version, infer shapes, check it, save it, prove it equal.

Simplification is onnxslim's: constant folding, dead-node elimination (Identity, Dropout, no-op
Cast/Reshape/Pad/Slice), pattern fusion (Conv+BatchNorm, GELU, Gemm...), common-subexpression elimination
and weight tying, iterated to a fixed point with shape inference between rounds. It is pure Python on
onnx-graphsurgeon (folding evaluates on ONNX Runtime), maintained, and removed the most nodes of the three
maintained tools on the test models (see README: Sources and cleanup); every pass has a recipe switch.

Only the graph and small tensors are loaded (modelfile.load_graph): a multi-GB model's weights are copied
into the output file in chunks, never held by a pass. The IR version is lowered to one every consumer reads
(onnx 1.23 writes IR 14; ONNX Runtime 1.31 refuses it). The cleaned model is then run beside its input on
ONNX Runtime (CPU) over seeded inputs within the profiles; an output outside the recipe's fp32 tolerances
fails the stage, naming it.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any, Optional

from trtflow.errors import StageError
from trtflow.recipe.schema import CleanupOptions, VerifyOptions
from trtflow.stages.base import Dep, Node, NodeId, RecipeContext, StageOutput, StageParams, Upstream
from trtflow.stages.capture import captured_output
from trtflow.stages.modelfile import load_graph, save_model
from trtflow.util.onnxio import tensor_info
from trtflow.util.versions import ort_version, tool_version

KIND, VERSION = "cleanup", 3
# The newest IR version ONNX Runtime and the TensorRT parsers read; a model needing more keeps its own.
MAX_IR_VERSION = 10
# recipe switch -> onnxslim's name for the optimization it skips
SLIM_PASSES = {"fold_constants": "constant_folding", "fuse_patterns": "graph_fusion", "remove_dead_nodes": "dead_node_elimination",
               "eliminate_common_subexpressions": "subexpression_elimination", "tie_weights": "weight_tying"}


class Params(StageParams):
    """The recipe's cleanup switches, and the profiles and fp32 tolerances the equality proof uses."""

    FINGERPRINT = ("onnx", "onnxruntime", "onnxslim")
    profiles: list[dict[str, dict[str, list[int]]]]
    verify: VerifyOptions
    options: CleanupOptions
    onnx: Optional[str]
    onnxruntime: Optional[str]
    onnxslim: Optional[str]


def node(ctx: RecipeContext, export: Optional[Node]) -> Node:
    """Cleanup of the source ONNX (or of the export's); it proves its output equal to its input within the fp32 tolerances.

    An ONNX source is read in place, with every external data file its graph names (hashed as inputs
    `model.data:<location>`); `where` lets planning name the recipe field when one of them is missing.
    """
    params = Params(profiles=ctx.profiles, verify=ctx.recipe.verify, options=ctx.recipe.cleanup,
                    onnx=tool_version("onnx"), onnxruntime=ort_version(), onnxslim=tool_version("onnxslim"))
    node_id, info = NodeId.of(KIND, ctx.name), {"recipe_file": ctx.item.display}
    if export is not None:
        return Node(id=node_id, version=VERSION, params=params, deps=(Dep("model", export.id, "model"),), info=info)
    return Node(id=node_id, version=VERSION, params=params, sources=(("model", ctx.item.source_path(ctx.root)),),
                info={**info, "where": ctx.item.where("source", "onnx")})


def run(params: Params, inputs: dict[str, Upstream], workdir: Path) -> StageOutput:
    """Clean the model, save it (weights copied in chunks), check it, and prove it equal to its input on ONNX Runtime."""
    import onnx

    from trtflow.stages import compare

    source, options = inputs["model"], params.options
    model, unloaded = _load(onnx, source.files["model"])
    before = model_summary(model)
    model.ir_version = _normalized_ir_version(onnx, model)
    with captured_output() as log:
        model, passes = _clean(onnx, model, options)
    files = save_model(onnx, model, workdir, unloaded=unloaded)
    _check(onnx, files["model"])
    equality = compare.prove_equal(files["model"], source.files["model"], params.profiles, params.verify.model_dump())
    if not equality["passed"] and params.verify.on_fail == "fail":
        raise StageError(compare.failure_message("the cleaned model differs from the source: onnx_compare", equality))
    record = {"source_sha256": source.sha256["model"], "source_files": source.sha256, "before": before, "after": model_summary(model),
              "passes": passes, "external_data": bool(unloaded) or "model.data" in files, "equality": equality, "log": log}
    return StageOutput(files=files, record=record)


def _load(onnx: Any, path: Path) -> tuple[Any, dict]:
    try:
        return load_graph(onnx, path)
    except Exception as exc:
        raise StageError(f"cannot parse the ONNX model: {type(exc).__name__}: {exc}") from None


def _clean(onnx: Any, model: Any, options: CleanupOptions) -> tuple[Any, list[str]]:
    """Run the enabled passes in order; returns the model and the names of the passes that ran."""
    passes = []
    if options.simplify:
        model, ran = _simplify(model, options)
        passes += ran
    if options.opset is not None:
        model = _convert_opset(onnx, model, options.opset)
        passes.append(f"opset {options.opset}")
    model.ir_version = _normalized_ir_version(onnx, model)
    passes.append(f"ir_version {model.ir_version}")
    if options.infer_shapes:
        model = onnx.shape_inference.infer_shapes(model, check_type=True, data_prop=True)
        passes.append("infer_shapes")
    return model, passes


def _simplify(model: Any, options: CleanupOptions) -> tuple[Any, list[str]]:
    import onnxslim

    skipped = [name for switch, name in SLIM_PASSES.items() if not getattr(options, switch)]
    try:
        slimmed = onnxslim.slim(model, no_shape_infer=not options.infer_shapes, skip_optimizations=skipped or None)
    except Exception as exc:
        raise StageError(f"cleanup.simplify: onnxslim failed: {type(exc).__name__}: {exc} "
                         "(switch the pass off in the recipe's cleanup: block, or simplify: false)") from None
    ran = [switch for switch, name in SLIM_PASSES.items() if name not in skipped]
    return slimmed, ran + (["symbolic_shapes"] if options.infer_shapes else [])


def _convert_opset(onnx: Any, model: Any, opset: int) -> Any:
    try:
        return onnx.version_converter.convert_version(model, opset)
    except Exception as exc:
        raise StageError(f"cleanup.opset: cannot convert the model to opset {opset}: {str(exc).strip().splitlines()[-1]}") from None


def _check(onnx: Any, path: Path) -> None:
    """The checker on the written file: by path it reads the graph, not the weights, and finds the weights file."""
    try:
        onnx.checker.check_model(str(path))
    except onnx.checker.ValidationError as exc:
        raise StageError(f"the model fails the ONNX checker: {str(exc).splitlines()[0]}") from None


def _normalized_ir_version(onnx: Any, model: Any) -> int:
    needed = onnx.helper.find_min_ir_version_for(list(model.opset_import), ignore_unknown=True)
    return min(model.ir_version, max(MAX_IR_VERSION, needed))


def model_summary(model: Any) -> dict:
    """Node counts (in all and per op type) and I/O of a model, recorded before and after cleanup."""
    initializers = {init.name for init in model.graph.initializer}
    return {
        "nodes": len(model.graph.node),
        "ops": dict(sorted(Counter(node.op_type for node in model.graph.node).items())),
        "ir_version": model.ir_version,
        "opsets": {entry.domain or "ai.onnx": entry.version for entry in model.opset_import},
        "inputs": [tensor_info(v).to_json() for v in model.graph.input if v.name not in initializers],
        "outputs": [tensor_info(v).to_json() for v in model.graph.output],
    }
