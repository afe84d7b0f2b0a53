"""A torch.nn.Module to ONNX with torch.onnx.export(dynamo=True), proven against torch on ONNX Runtime: what the torch
and the Hugging Face sources share (they differ only in how the module is made).

The module is traced with example inputs (normal floats; integers within the recipe's values, else zeros, which
every embedding table and mask accepts), every profile axis that varies made dynamic; the saved model loses its node
stack traces (file paths and line numbers); torch and ONNX Runtime then run on the same inputs, integer inputs drawn
as the exported graph says the model takes them.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict

from trtflow.backends.base import import_or_explain
from trtflow.errors import StageError
from trtflow.stages.base import (
    CACHED_UNDER_WARN,
    Node,
    Placement,
    ProofSettings,
    StageOutput,
    StageParams,
    enforce_proof,
)
from trtflow.stages.capture import ANSI_ESCAPES, captured_output
from trtflow.stages.export.common import one_line
from trtflow.stages.modelfile import FILE_NAMES, MODEL, MODEL_DATA
from trtflow.store.records import StageRecord
from trtflow.util.text import clipped

if TYPE_CHECKING:
    import numpy as np

EXPORTER = "torch.onnx.export(dynamo=True)"
# What a torch or Hugging Face export imports before the user's code runs: the export's server imports them once and
# forks each node's child from there (5.4 s of a fresh process's start on these cores). Never the user's modules,
# nor transformers or diffusers: every child then starts from the same state whatever ran before it. The exporter's
# own internals load at its first call (torch.export, dynamo, the decompositions, onnxscript's torch ops: 1.5-1.8 s
# of a tiny GPT-2's export), so the server imports them too: a project's later exports skip them, the same bytes.
EXPORTER_MODULES = (
    "torch",
    "torch.onnx",
    "onnxscript",
    "onnx",
    "onnxruntime",
    "torch._dynamo",
    "torch._decomp",
    "torch._meta_registrations",
    "torch._functorch.aot_autograd",
    "torch.export._trace",
    "torch.onnx._internal.exporter._core",
    "onnxscript.function_libs.torch_lib.ops",
)
STRIPPED_METADATA = ("pkg.torch.onnx.stack_trace",)


class ExampleInput(BaseModel):
    """One example tensor the model is traced with: name, dtype and shape."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str
    dtype: str
    shape: list[int]


class ModuleExport(StageParams):
    """What every module export decides: example inputs, dynamic axes, output names, opset, optimizer, the check."""

    POLICY = ("on_fail",)
    FIELD: ClassVar[str] = "source.torch"  # the recipe field its errors name
    inputs: list[ExampleInput]
    dynamic: dict[str, dict[str, list[int]]]
    outputs: list[str] | None
    opset: int
    optimize: bool
    check: ProofSettings
    on_fail: Literal["fail", "warn"] = "fail"

    @property
    def proof_failed(self) -> str:
        """The check's failure, naming the source field."""
        return f"{self.FIELD}: the exported ONNX differs from torch"


def finish(node: Node, record: StageRecord, place: Placement) -> str | None:
    """A cached export whose check failed (it ran under on_fail: warn) fails the run when on_fail is fail now."""
    params = node.params_as(ModuleExport)
    enforce_proof(params.on_fail, record["record"]["torch_equality"], params.proof_failed, CACHED_UNDER_WARN)
    return None


def export_checked(make: Callable[[Any], Any], params: ModuleExport, workdir: Path) -> StageOutput:
    """`make(torch)` -> a module; exported, saved and checked against torch (the check's failure per on_fail)."""
    torch = import_or_explain("torch", "torch")
    import_or_explain("onnxscript", "torch", "torch's dynamo exporter writes ONNX with it")
    with captured_output() as log, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = make(torch)
        examples = _examples(torch, params)
        expected = _eager_outputs(torch, model, examples, params)
        program = _export(torch, model, examples, params)
    files = _save(program, workdir)
    check = _check_against_torch(files[MODEL], params, model, examples, expected)
    enforce_proof(params.on_fail, check, params.proof_failed)
    record = {
        "exporter": EXPORTER,
        "opset": params.opset,
        "nodes": program.model.graph.num_nodes(),
        "inputs": [spec.model_dump() for spec in params.inputs],
        "dynamic": params.dynamic,
        "outputs": [v.name for v in program.model.graph.outputs],
        "torch_equality": check,
        "warnings": _warning_lines(caught),
        "log": log,
    }
    return StageOutput(files=files, record=record)


def _examples(torch: Any, params: ModuleExport) -> list[Any]:
    """Seeded example tensors to trace with: normal floats; integers within the recipe's `inputs:` values, else
    zeros, which every embedding table and every mask accepts (the check after the export draws values the exported
    graph says the model takes)."""
    generator = torch.Generator().manual_seed(params.check.seed)
    tensors = []
    for spec in params.inputs:
        dtype = getattr(torch, spec.dtype)
        if dtype.is_floating_point:
            tensors.append(torch.randn(spec.shape, generator=generator).to(dtype))
        elif spec.name in params.check.values:
            low, high = params.check.values[spec.name]
            tensors.append(torch.randint(low, high + 1, spec.shape, generator=generator).to(dtype))
        else:
            tensors.append(torch.zeros(spec.shape, dtype=dtype))
    return tensors


def _eager_outputs(torch: Any, model: Any, examples: list[Any], params: ModuleExport) -> list[np.ndarray]:
    """Run the model once in torch: inputs it rejects are the recipe's inputs' fault, not the exporter's."""
    try:
        with torch.no_grad():
            result = model(*examples)
    except Exception as exc:
        shown = ", ".join(f"{s.name} {s.dtype} {s.shape}" for s in params.inputs)
        raise StageError(f"{params.FIELD}.inputs: the model does not accept ({shown}): {one_line(exc)}") from exc
    leaves = [leaf for leaf in torch.utils._pytree.tree_leaves(result) if isinstance(leaf, torch.Tensor)]
    names = params.outputs
    if names is not None and len(names) != len(leaves):
        raise StageError(
            f"{params.FIELD}.outputs: names {len(names)} output(s) but the model returns {len(leaves)} tensor(s)"
        )
    return [leaf.detach().float().numpy() if leaf.is_floating_point() else leaf.numpy() for leaf in leaves]


def _export(torch: Any, model: Any, examples: list[Any], params: ModuleExport) -> Any:
    dims = [params.dynamic.get(spec.name) for spec in params.inputs]
    shapes = tuple(
        {int(axis): torch.export.Dim.DYNAMIC(min=low, max=high) for axis, (low, high) in axes.items()} if axes else None
        for axes in dims
    )
    try:
        program = torch.onnx.export(
            model,
            tuple(examples),
            dynamo=True,
            input_names=[s.name for s in params.inputs],
            output_names=params.outputs,
            opset_version=params.opset,
            optimize=params.optimize,
            dynamic_shapes=shapes if any(dims) else None,
        )
    except Exception as exc:
        raise StageError(export_failure(exc, params.FIELD)) from exc
    opset = program.model.opset_imports.get("")
    if opset != params.opset:
        raise StageError(
            f"{params.FIELD}.opset: the exporter could not convert the model to opset {params.opset} "
            f"(it stayed at {opset}): use opset: {opset} or newer"
        )
    return program


def export_failure(exc: BaseException, field: str = "source.torch") -> str:
    """One line from the exporter's multi-page error: its exception summary, naming the recipe field at fault."""
    text = ANSI_ESCAPES.sub("", str(exc))
    summary = text.split("## Exception summary", 1)[-1]
    causes = re.findall(r"<class '([\w.]+)'>: (.*?)(?=\n⬆️|\n\n|\n\(Refer|$)", summary, flags=re.S)
    name, message = (causes[0][0].rsplit(".", 1)[-1], causes[0][1]) if causes else (type(exc).__name__, text)
    detail = clipped(f"{name}: {' '.join(message.split())}", 400)
    if "dim hint" in detail or "Constraints violated" in detail:
        return f"profiles: the model fixes an axis the profiles make dynamic: {detail}"
    step = (
        "cannot trace the model (torch.export)"
        if "TorchExportError" in type(exc).__name__
        else "cannot convert the model to ONNX"
    )
    return (
        f"{field}: the exporter {step}: {detail}"
        if field != "source.torch"
        else f"{field}.factory: the exporter {step}: {detail}"
    )


def _save(program: Any, workdir: Path) -> dict[str, Path]:
    """model.onnx, and model.onnx.data when the exporter puts the weights beside it (above 2 GB)."""
    for graph in [program.model.graph, *program.model.functions.values()]:
        for node in graph.all_nodes():
            for key in STRIPPED_METADATA:
                node.metadata_props.pop(key, None)
    path = workdir / FILE_NAMES[MODEL]
    program.save(str(path))
    data = workdir / FILE_NAMES[MODEL_DATA]
    return {MODEL: path, MODEL_DATA: data} if data.is_file() else {MODEL: path}


def _check_against_torch(
    path: Path, params: ModuleExport, model: Any, examples: list[Any], expected: list[Any]
) -> dict:
    """ONNX Runtime on the exported model vs torch within the recipe's fp32 tolerances, the relative one taken of
    each output's largest magnitude (a logit near zero beside logits of 10 differs by kernel order alone).

    Integer inputs the recipe gives no values for were traced as zeros; the check draws them anew as the exported
    graph says the model takes them (token ids within their table, padded masks), and runs torch on those too."""
    from trtflow.stages import compare

    torch = import_or_explain("torch", "torch")
    check = params.check
    session = compare.session(path)
    names = compare.output_names(session)
    if len(names) != len(expected):
        raise StageError(
            f"{params.FIELD}: the exported ONNX has {len(names)} output(s) but torch returned {len(expected)} tensor(s)"
        )
    feed = {spec.name: tensor.numpy() for spec, tensor in zip(params.inputs, examples, strict=True)}
    drawn = _integer_feed(session, path, params, feed)
    if drawn is not feed:
        examples = [torch.from_numpy(drawn[spec.name]) for spec in params.inputs]
        expected = _eager_outputs(torch, model, examples, params)
    got = compare.run_all(session, [drawn])[0]
    want = dict(zip(names, expected, strict=True))
    rows = compare.compare_outputs(got, want, check.rtol, check.atol, of_magnitude=True)
    return {
        "runtime": compare.RUNTIME,
        "samples": 1,
        "rtol": check.rtol,
        "atol": check.atol,
        "rtol_of": "each output's largest magnitude",
        "outputs": rows,
        "passed": all(row["passed"] for row in rows),
    }


def _integer_feed(session: Any, path: Path, params: ModuleExport, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """`feed` with each integer input the recipe gives no values for drawn as the exported graph accepts; `feed`
    itself when there is none."""
    import numpy as np

    from trtflow.stages import compare

    values = compare.input_values(path, params.check.values)
    redraw = [name for name in values if name not in params.check.values and name in feed]
    if not redraw:
        return feed
    rng = np.random.default_rng(params.check.seed)
    return {
        name: values[name].draw(rng, list(array.shape), str(array.dtype)) if name in redraw else array
        for name, array in feed.items()
    }


def _warning_lines(caught: list[Any]) -> list[str]:
    """Each distinct warning once: what the exporter and the model's code said (a tracer warning matters)."""
    seen = dict.fromkeys(
        f"{w.category.__name__}: {str(w.message).splitlines()[0] if str(w.message) else ''}" for w in caught
    )
    return list(seen)[:20]
