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
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trtflow.errors import StageError, required
from trtflow.recipe.pymodule import import_root
from trtflow.stages.base import (
    Node,
    NodeId,
    ProofSettings,
    RecipeContext,
    StageOutput,
    Upstream,
)
from trtflow.stages.export.common import KIND, VERSION, dynamic_axes, one_line
from trtflow.stages.export.torch_module import ExampleInput, ModuleExport, export_checked
from trtflow.util.versions import tool_version


class Params(ModuleExport):
    """What is exported (factory, kwargs, example inputs, dynamic axes) and how (opset, optimizer), plus tool
    versions."""

    FINGERPRINT = ("torch", "onnx", "onnxscript")
    FIELD = "source.torch"
    factory: str
    kwargs: dict[str, Any]
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
    with _user_code(params.factory, inputs["factory"].files["factory"]):
        return export_checked(lambda torch: _model(torch, params, inputs), params, workdir)


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
        raise StageError(f"source.torch.factory: {params.factory} raised {one_line(exc)}") from exc
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
        raise StageError(f"source.torch.factory: cannot import {module_name!r}: {one_line(exc)}") from exc
    try:
        return functools.reduce(getattr, attribute.split("."), module)
    except AttributeError:
        raise StageError(f"source.torch.factory: module {module_name!r} has no {attribute!r}") from None


def _load_weights(torch: Any, model: Any, path: Path) -> None:
    """A state_dict, loaded without unpickling code (weights_only) and strictly: every key must fit."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise StageError(f"source.torch.weights: cannot load {path.name}: {one_line(exc)}") from exc
    if not isinstance(state, dict):
        raise StageError(
            f"source.torch.weights: {path.name} holds a {type(state).__name__}, not a state_dict "
            "(save it with torch.save(model.state_dict(), path))"
        )
    try:
        model.load_state_dict(state, strict=True)
    except Exception as exc:
        raise StageError(f"source.torch.weights: {path.name} does not fit the model: {one_line(exc)}") from exc
