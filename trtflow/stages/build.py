"""Build: turn a precision node's ONNX into an engine for one (precision, target) with the target's backend.

A target's *name* is not in the key (renaming a target reuses its engines); its compute capabilities,
compatibility settings and the backend's exact version are. Every builder option of the recipe's `build:`
block is a field of these params (inherited from BuildOptions), so it is in the key and reaches the backend
by name without this module knowing it. The recipe's plugin libraries are sources (`plugin:<name>`): their digests
are in the key, never their paths, and the backend loads them into the builder's plugin registry before parsing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from trtflow.backends.base import BuildRequest, backend_version, get_backend
from trtflow.backends.engine_identity import CANONICAL_FORM, canonical_digest
from trtflow.backends.limits import describe, has_limits, unsupported_nodes
from trtflow.errors import StageError
from trtflow.recipe.build import BuildOptions
from trtflow.recipe.schema import TargetSpec
from trtflow.stages.base import (
    MIB,
    Dep,
    Node,
    NodeId,
    NodeInfo,
    RecipeContext,
    Stage,
    StageOutput,
    StageParams,
    Upstream,
    declared_memory,
    plugin_files,
)
from trtflow.util.cc import ComputeCapability
from trtflow.util.servers import BUILD_SERVER

# versions: 2: the record holds the engine's canonical digest; 3: canonical form v2 (bump with CANONICAL_FORM); 4: the
# record holds the network's layers (BuildResult.network)
KIND, VERSION = "build", 4
Profiles = list[dict[str, dict[str, list[int]]]]


class Params(BuildOptions, StageParams):
    """Builder options (inherited from the recipe's `build:`), profiles, precision, and the target's hardware."""

    FINGERPRINT: ClassVar[tuple[str, ...]] = (
        "backend",
        "backend_version",
        "compute_capabilities",
        "hardware_compatibility",
        "version_compatible",
    )
    precision: str
    profiles: Profiles
    backend: str
    backend_version: str | None
    compute_capabilities: list[ComputeCapability]
    hardware_compatibility: str
    version_compatible: bool

    def builder_options(self) -> dict[str, Any]:
        """The recipe's builder options as plain values (what the backend applies and the manifest records)."""
        return {name: getattr(self, name) for name in BuildOptions.model_fields}


def nodes(ctx: RecipeContext, precisions: dict[str, Node]) -> list[Node]:
    """One build per (precision, target) the recipe does not exclude, each from that precision's model."""
    return [node(ctx, precision, target, spec, precisions[precision].id) for precision, target, spec in ctx.pairs()]


def node(ctx: RecipeContext, precision: str, target: str, spec: TargetSpec, model_node: NodeId) -> Node:
    """build:<recipe>/<precision>/<target>."""
    params = Params(
        precision=precision,
        profiles=ctx.profiles,
        **ctx.recipe.build.options(),
        backend=spec.backend,
        backend_version=backend_version(spec.backend),
        compute_capabilities=spec.compute_capabilities,
        hardware_compatibility=spec.hardware_compatibility,
        version_compatible=spec.version_compatible,
    )
    return Node(
        id=NodeId.of(KIND, ctx.name, precision, target),
        version=VERSION,
        params=params,
        deps=(Dep("model", model_node, "model"),),
        sources=ctx.plugin_sources,
        info=NodeInfo(precision=precision, target=target),
    )


def run(params: Params, inputs: dict[str, Upstream], workdir: Path) -> StageOutput:
    """Build the engine with the target's backend; the record holds the backend version and the engine's I/O."""
    request = BuildRequest(
        onnx_path=inputs["model"].files["model"],
        engine_path=workdir / "model.engine",
        compute_capabilities=list(params.compute_capabilities),
        profiles=[{name: (s["min"], s["opt"], s["max"]) for name, s in profile.items()} for profile in params.profiles],
        options=params.builder_options(),
        hardware_compatibility=params.hardware_compatibility,
        version_compatible=params.version_compatible,
        plugins=plugin_files(inputs),
    )
    backend = get_backend(params.backend)
    _check_limits(params, request.onnx_path)
    result = backend.engine_from_onnx(request)
    return StageOutput(files={"engine": request.engine_path}, record=result.to_record())


def identity(files: dict[str, Path]) -> dict[str, Any]:
    """The engine's canonical digest for the record (engines equivalent by it are the same build: reproducible
    releases), where its layout has one; computed by the runner as it stores the engine."""
    canonical = canonical_digest(files["engine"])
    return {"canonical_sha256": {"engine": canonical}, "canonical_form": CANONICAL_FORM} if canonical else {}


def _check_limits(params: Params, onnx_path: Path) -> None:
    """Refuse, naming the nodes, a graph the backend cannot compile for a target architecture (before a long build).
    Only an architecture with limits reads the graph (ResNet-18's: 0.19 s a build)."""
    from trtflow.util.onnxio import load_graph_only

    if not any(has_limits(params.backend, cc) for cc in params.compute_capabilities):
        return
    try:
        model = load_graph_only(onnx_path)
    except Exception:  # unreadable: the parser says why, in its words
        return
    for cc in params.compute_capabilities:
        found = unsupported_nodes(params.backend, cc, model)
        if found:
            raise StageError(f"{params.precision} cannot build for {cc} with {params.backend}: {describe(found)}")


def failure_hint(node: Node, reason: str) -> str:
    """A build its target's architecture cannot take, with the `exclude:` entry that drops exactly this pair (the
    target's name is no part of the stage's key, so the stage itself cannot say it)."""
    if " cannot build for " not in reason or "exclude:" in reason:
        return reason
    precision = node.params_as(Params).precision
    return f"{reason}; drop the pair with exclude: [{{precision: {precision}, target: {node.info.target}}}]"


STAGE = Stage(
    KIND,
    VERSION,
    run,
    failure_hint=failure_hint,
    described=identity,
    runs_in=BUILD_SERVER,
    # not onnx: a build reads the graph only for an architecture with limits, and onnx brings numpy, whose BLAS starts
    # a thread; a build server forks from a single-threaded process
    warm_imports=("trtflow.stages.build", "tensorrt_rtx"),
    memory=declared_memory(500 * MIB, 3.0),
    alone_when_asked=True,  # a shared CPU changes the numbering TensorRT-RTX generates (docs/reproducibility.md)
)
