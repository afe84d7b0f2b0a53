"""Export: a PyTorch model to ONNX with torch.onnx.export's torch.export-based exporter (`dynamo=True`).

Why that exporter: the TorchScript one is deprecated (torch 2.9 made this one the default; the old one
warns that it will be removed), and it traces, silently freezing Python control flow and any axis the
code happens to treat as constant. torch.export captures the program with guards: a profile asking for
a dynamic axis the model fixes fails here, naming the axis, instead of producing an engine that is wrong
for other shapes. It takes about 3 s more per process (onnxscript and torch.export warm up).

Its own graph optimizer is off unless the recipe asks (`optimize: true`): cleanup is the one place graphs
are rewritten, where every pass can be switched off and is proven equal on ONNX Runtime. The export itself
is checked here: ONNX Runtime on the exported model against torch on the example inputs. With it off, what the
optimizer would fuse is fused by cleanup all the same (ResNet-18: 178 nodes exported, 48 after cleanup, as with it on).
`verify.on_fail` decides whether a failed check fails the stage; it is not part of the key (see cleanup).

The factory runs with the folder its module was found in first on sys.path and torch seeded (a factory
that initializes randomly exports the same bytes every time).
Node stack traces (file paths, line numbers) are removed, so the bytes depend on the model, not on where
the project lives or on a comment moving a line. Every failure is one line naming the recipe field.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import re
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict

from trtflow.backends.base import import_or_explain
from trtflow.errors import StageError, required
from trtflow.recipe.pymodule import import_root
from trtflow.stages.base import (
    CACHED_UNDER_WARN,
    Node,
    NodeId,
    Placement,
    ProofSettings,
    RecipeContext,
    StageOutput,
    StageParams,
    Upstream,
    enforce_proof,
)
from trtflow.stages.capture import ANSI_ESCAPES, captured_output
from trtflow.stages.export.common import KIND, VERSION, dynamic_axes, one_line
from trtflow.stages.modelfile import FILE_NAMES, MODEL, MODEL_DATA
from trtflow.util.versions import tool_version

if TYPE_CHECKING:
    import numpy as np

PROOF_FAILED = "source.torch: the exported ONNX differs from torch"
EXPORTER = "torch.onnx.export(dynamo=True)"
STRIPPED_METADATA = ("pkg.torch.onnx.stack_trace",)


class ExampleInput(BaseModel):
    """One example tensor the model is traced with: name, dtype and shape."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str
    dtype: str
    shape: list[int]


class Params(StageParams):
    """What is exported (factory, kwargs, example inputs, dynamic axes) and how (opset, optimizer), plus tool
    versions."""

    FINGERPRINT = ("torch", "onnx", "onnxscript")
    POLICY = ("on_fail",)
    factory: str
    kwargs: dict[str, Any]
    inputs: list[ExampleInput]
    dynamic: dict[str, dict[str, list[int]]]
    outputs: list[str] | None
    opset: int
    optimize: bool
    check: ProofSettings
    on_fail: Literal["fail", "warn"] = "fail"
    torch: str | None
    onnx: str | None
    onnxscript: str | None


def node(ctx: RecipeContext) -> Node | None:
    """PyTorch -> ONNX for torch sources, else None. Its inputs are
    the factory's module file, the weights and the listed
    `files`, not the whole project: editing an unrelated file re-exports nothing."""
    spec = ctx.recipe.source.torch
    if spec is None:
        return None
    sources = [("factory", ctx.item.factory_file(ctx.root))]
    sources += [("weights", (ctx.root / spec.weights).resolve())] if spec.weights else []
    sources += [(f"files[{index}]", (ctx.root / path).resolve()) for index, path in enumerate(spec.files)]
    inputs, dynamic = export_dims(ctx)
    verify = ctx.recipe.verify
    params = Params(
        factory=spec.factory,
        kwargs=spec.kwargs,
        inputs=inputs,
        dynamic=dynamic,
        outputs=spec.outputs,
        opset=spec.opset,
        optimize=spec.optimize,
        check=ProofSettings(rtol=verify.rtol, atol=verify.atol, seed=verify.seed, values=ctx.input_values),
        on_fail=verify.on_fail,
        torch=tool_version("torch"),
        onnx=tool_version("onnx"),
        onnxscript=tool_version("onnxscript"),
    )
    return Node(
        id=NodeId.of(KIND, ctx.name),
        version=VERSION,
        params=params,
        sources=tuple(sources),
    )


def export_dims(ctx: RecipeContext) -> tuple[list[ExampleInput], dict[str, dict[str, list[int]]]]:
    """The example inputs (shape: given, else the first profile's opt) and the dynamic axes with their ranges."""
    profiles, specs = ctx.profiles, required(ctx.recipe.source.torch, "source.torch").inputs
    inputs = [
        ExampleInput(name=spec.name, dtype=spec.dtype, shape=spec.shape or profiles[0][spec.name]["opt"])
        for spec in specs
    ]
    dynamic = dynamic_axes(profiles)
    return inputs, {spec.name: dynamic[spec.name] for spec in specs if spec.name in dynamic}


def run(params: Params, inputs: dict[str, Upstream], workdir: Path) -> StageOutput:
    """Import and call the factory, export with the dynamo exporter, check the ONNX against torch on ONNX Runtime."""
    torch = import_or_explain("torch", "torch")
    import_or_explain("onnxscript", "torch", "torch's dynamo exporter writes ONNX with it")
    with _user_code(params.factory, inputs["factory"].files["factory"]):
        with captured_output() as log, warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model = _model(torch, params, inputs)
            examples = _examples(torch, params)
            expected = _eager_outputs(torch, model, examples, params)
            program = _export(torch, model, examples, params)
    files = _save(program, workdir)
    check = _check_against_torch(files[MODEL], params, model, examples, expected)
    enforce_proof(params.on_fail, check, PROOF_FAILED)
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


def finish(node: Node, record: dict, place: Placement) -> str | None:
    """A cached export whose check failed (it ran under on_fail: warn) fails the run when on_fail is fail now."""
    params = node.params_as(Params)
    enforce_proof(params.on_fail, record["record"]["torch_equality"], PROOF_FAILED, CACHED_UNDER_WARN)
    return None


@contextlib.contextmanager
def _user_code(factory: str, module_file: Path) -> Iterator[None]:
    """The factory's folder first on sys.path for the block, as planning searched it.

    What the factory imported stays imported: a worker may export another recipe from the same module in
    this run (the files cannot have changed), and re-running a module that registers torch ops would fail.
    """
    saved_path = list(sys.path)
    sys.path.insert(0, str(import_root(factory.split(":")[0], module_file)))
    try:
        yield
    finally:
        sys.path[:] = saved_path


def _model(torch: Any, params: Params, inputs: dict[str, Upstream]) -> Any:
    """Import the factory, call it (torch seeded), load the weights, switch to eval mode."""
    factory = _factory(params.factory)
    torch.manual_seed(0)
    try:
        model = factory(**params.kwargs)
    except Exception as exc:
        raise StageError(f"source.torch.factory: {params.factory} raised {one_line(exc)}") from None
    if not isinstance(model, torch.nn.Module):
        raise StageError(
            f"source.torch.factory: {params.factory} returned {type(model).__name__}, not a torch.nn.Module"
        )
    if "weights" in inputs:
        _load_weights(torch, model, inputs["weights"].files["weights"])
    return model.eval()


def _factory(spec: str) -> Any:
    module_name, attribute = spec.split(":")
    try:
        module = importlib.import_module(module_name)
    except BaseException as exc:  # a module may even call sys.exit on import
        raise StageError(f"source.torch.factory: cannot import {module_name!r}: {one_line(exc)}") from None
    try:
        return functools.reduce(getattr, attribute.split("."), module)
    except AttributeError:
        raise StageError(f"source.torch.factory: module {module_name!r} has no {attribute!r}") from None


def _load_weights(torch: Any, model: Any, path: Path) -> None:
    """A state_dict, loaded without unpickling code (weights_only) and strictly: every key must fit."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise StageError(f"source.torch.weights: cannot load {path.name}: {one_line(exc)}") from None
    if not isinstance(state, dict):
        raise StageError(
            f"source.torch.weights: {path.name} holds a {type(state).__name__}, not a state_dict "
            "(save it with torch.save(model.state_dict(), path))"
        )
    try:
        model.load_state_dict(state, strict=True)
    except Exception as exc:
        raise StageError(f"source.torch.weights: {path.name} does not fit the model: {one_line(exc)}") from None


def _examples(torch: Any, params: Params) -> list[Any]:
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


def _eager_outputs(torch: Any, model: Any, examples: list[Any], params: Params) -> list[np.ndarray]:
    """Run the model once in torch: inputs it rejects are the recipe's inputs' fault, not the exporter's."""
    try:
        with torch.no_grad():
            result = model(*examples)
    except Exception as exc:
        shown = ", ".join(f"{s.name} {s.dtype} {s.shape}" for s in params.inputs)
        raise StageError(f"source.torch.inputs: the model does not accept ({shown}): {one_line(exc)}") from None
    leaves = [leaf for leaf in torch.utils._pytree.tree_leaves(result) if isinstance(leaf, torch.Tensor)]
    names = params.outputs
    if names is not None and len(names) != len(leaves):
        raise StageError(
            f"source.torch.outputs: names {len(names)} output(s) but the model returns {len(leaves)} tensor(s)"
        )
    return [leaf.detach().float().numpy() if leaf.is_floating_point() else leaf.numpy() for leaf in leaves]


def _export(torch: Any, model: Any, examples: list[Any], params: Params) -> Any:
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
        raise StageError(export_failure(exc)) from None
    opset = program.model.opset_imports.get("")
    if opset != params.opset:
        raise StageError(
            f"source.torch.opset: the exporter could not convert the model to opset {params.opset} "
            f"(it stayed at {opset}): use opset: {opset} or newer"
        )
    return program


def export_failure(exc: BaseException) -> str:
    """One line from the exporter's multi-page error: its exception summary, naming the recipe field at fault."""
    text = ANSI_ESCAPES.sub("", str(exc))
    summary = text.split("## Exception summary", 1)[-1]
    causes = re.findall(r"<class '([\w.]+)'>: (.*?)(?=\n⬆️|\n\n|\n\(Refer|$)", summary, flags=re.S)
    name, message = (causes[0][0].rsplit(".", 1)[-1], causes[0][1]) if causes else (type(exc).__name__, text)
    detail = f"{name}: {' '.join(message.split())}"[:400]
    if "dim hint" in detail or "Constraints violated" in detail:
        return f"profiles: the model fixes an axis the profiles make dynamic: {detail}"
    step = (
        "cannot trace the model (torch.export)"
        if "TorchExportError" in type(exc).__name__
        else "cannot convert the model to ONNX"
    )
    return f"source.torch.factory: the exporter {step}: {detail}"


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


def _check_against_torch(path: Path, params: Params, model: Any, examples: list[Any], expected: list[Any]) -> dict:
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
            f"source.torch: the exported ONNX has {len(names)} output(s) but torch returned {len(expected)} tensor(s)"
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


def _integer_feed(session: Any, path: Path, params: Params, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """`feed` with each integer input the recipe gives no values for drawn as the exported graph accepts; `feed`
    itself when there is none."""
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
