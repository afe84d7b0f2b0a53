"""Verify: check the engine against the model it was built from, run it where possible, collect the proofs.

Each model transformation already proved itself on ONNX Runtime where it happened (cleanup: cleaned ==
source within fp32 tolerances; precision: reduced precision close to fp32); verify carries those proofs
into the manifest beside its own checks:
- engine_checks: without a GPU, the engine's I/O names and dtypes match the model, and every profile
  shape fits the engine's static dimensions.
- engine_run: only where a GPU and a runtime can load the engine (the recipe's plugin libraries, sources of this
  stage, loaded first), compared with the fp32 model on ONNX
  Runtime; otherwise `not run (<reason>)`. Nothing is ever reported as passed that did not run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trtflow.backends.base import get_backend
from trtflow.device import local_compute_capabilities, no_gpu_reason
from trtflow.errors import StageError, required
from trtflow.stages import build as build_stage
from trtflow.stages import cleanup as cleanup_stage
from trtflow.stages import precision as precision_stage
from trtflow.stages.base import (
    MIB,
    Dep,
    Node,
    RecipeContext,
    Stage,
    StageOutput,
    StageParams,
    Upstream,
    declared_memory,
    plugin_files,
)
from trtflow.util.cc import ComputeCapability
from trtflow.util.versions import ort_version

# 3: carries the precision model's composition; 4: CPU-independent sessions; 5: integer inputs as the graph accepts;
# 6: the engine enters the key by its canonical digest
KIND, VERSION = "verify", 6

# Elementwise engine-vs-fp32 tolerances for reduced precision; the ONNX-level accuracy report is the real gate.
REDUCED_PRECISION_ENGINE_TOLERANCE = {
    "fp16": {"rtol": 1e-2, "atol": 1e-2},
    "bf16": {"rtol": 5e-2, "atol": 5e-2},
    "int8": {"rtol": 1e-1, "atol": 1e-1},
    "fp8": {"rtol": 1e-1, "atol": 1e-1},
}


class Params(StageParams):
    """How an engine run is compared (on a GPU), and what decides whether it can run here: the local GPUs, the
    target."""

    FINGERPRINT = (
        "onnxruntime",
        "local_gpus",
        "backend",
        "backend_version",
        "compute_capabilities",
        "hardware_compatibility",
    )
    profiles: list[dict[str, dict[str, list[int]]]]
    values: dict[str, tuple[int, int]] = {}  # the recipe's integer input values (RecipeContext.input_values)
    samples: int
    # the report carries cleanup's proof (its record, not a file): its sample count keys it here
    cleanup_samples: int
    seed: int
    on_fail: str
    rtol: float
    atol: float
    onnxruntime: str | None
    local_gpus: list[ComputeCapability]
    backend: str
    backend_version: str | None
    compute_capabilities: list[ComputeCapability]
    hardware_compatibility: str


def nodes(ctx: RecipeContext, builds: list[Node], cleanup: Node) -> list[Node]:
    """One verify per build."""
    return [node(ctx, build, cleanup) for build in builds]


def node(ctx: RecipeContext, build: Node, cleanup: Node) -> Node:
    """verify:<recipe>/<precision>/<target>; its fingerprint names the local GPUs, since they decide whether the engine
    runs."""
    verify, target = ctx.recipe.verify, build.params_as(build_stage.Params)
    precision = required(build.info.precision, f"{build.id}: the precision")  # every build node names it
    params = Params(
        profiles=ctx.profiles,
        values=ctx.input_values,
        samples=verify.samples_for(len(ctx.profiles)),
        cleanup_samples=cleanup.params_as(cleanup_stage.Params).proof.samples,
        seed=verify.seed,
        on_fail=verify.on_fail,
        **engine_tolerance(ctx, precision),
        onnxruntime=ort_version(),
        local_gpus=list(local_compute_capabilities()),
        backend=target.backend,
        backend_version=target.backend_version,
        compute_capabilities=target.compute_capabilities,
        hardware_compatibility=target.hardware_compatibility,
    )
    model = build.deps[0]
    deps = (
        Dep("model", model.node, "model"),
        Dep("reference", cleanup.id, "model"),
        Dep("engine", build.id, "engine"),
        *precision_stage.report_dep(ctx, precision, "precision_report"),
    )
    return Node(
        id=build.id.with_kind(KIND), version=VERSION, params=params, deps=deps, sources=build.sources, info=build.info
    )


def engine_tolerance(ctx: RecipeContext, precision: str) -> dict[str, float]:
    """rtol/atol for comparing an engine's outputs with the fp32 model (on a GPU): the recipe's for fp32."""
    if precision == "fp32":
        return {"rtol": ctx.recipe.verify.rtol, "atol": ctx.recipe.verify.atol}
    return dict(REDUCED_PRECISION_ENGINE_TOLERANCE[precision])


def run(params: Params, inputs: dict[str, Upstream], workdir: Path) -> StageOutput:
    """Check the engine's I/O against its model, run it where a GPU allows, and carry the upstream proofs along."""
    model = _model_io(inputs["model"], inputs["reference"])
    record = {
        "cleanup_equality": inputs["reference"].record.get("equality"),
        "precision_accuracy": inputs["model"].record.get("accuracy"),
        "precision_composition": inputs["model"].record.get("composition"),
        **_fallback(inputs["model"].record.get("fallback")),
        "engine_checks": check_engine_io(inputs["engine"].record["tensors"], model, params.profiles),
        "engine_run": _engine_run(params, inputs["engine"], inputs["reference"].files["model"], plugin_files(inputs)),
    }
    _raise_on_failure(record, params.on_fail)
    report = workdir / "verify.json"
    report.write_text(json.dumps(record, indent=2, sort_keys=True))
    return StageOutput(files={"report": report}, record=record)


def _model_io(model: Upstream, cleaned: Upstream) -> Any:
    """The I/O of the model the engine was built from, without a session (ORT's CPU provider cannot run bf16): the
    cleanup's record of it when it is the cleaned model itself (fp32: the same file; reading a ResNet-18's graph
    took 0.06 s a verify), else from its graph."""
    from trtflow.stages import compare
    from trtflow.util.onnxio import ModelIO, TensorInfo

    summary = cleaned.record.get("after") or {}
    digest = model.sha256.get("model")
    if digest is None or digest != cleaned.sha256.get("model") or not {"inputs", "outputs"} <= summary.keys():
        return compare.signature(model.files["model"])
    inputs, outputs = (
        [TensorInfo(t["name"], t["dtype"], t["shape"]) for t in summary[k]] for k in ("inputs", "outputs")
    )
    return compare.signature_of(ModelIO(inputs, outputs))


def _fallback(search: dict | None) -> dict:
    """The precision's fallback search for the manifest (absent when it did not run): what it kept, with what
    sensitivity, accuracy before and after, and its cost; the full ranking stays in the precision record."""
    if search is None:
        return {}
    return {"precision_fallback": {k: v for k, v in search.items() if k != "sensitivity"}}


def check_engine_io(tensors: list[dict], candidate: Any, profiles: list[dict]) -> dict:
    """Engine I/O vs the model it was built from, and profiles vs the engine's static dims."""
    from trtflow.stages import compare

    model = {m.name: ("input", compare.ORT_DTYPES.get(m.type, m.type)) for m in candidate.get_inputs()}
    model.update({m.name: ("output", compare.ORT_DTYPES.get(m.type, m.type)) for m in candidate.get_outputs()})
    engine = {t["name"]: (t["mode"], t["dtype"]) for t in tensors}
    problems = [
        f"{name}: engine {engine.get(name)} vs model {model.get(name)}"
        for name in sorted(set(model) | set(engine))
        if engine.get(name) != model.get(name)
    ]
    problems += _profile_problems(tensors, profiles)
    return {
        "io_names_and_dtypes": "pass" if not any("vs model" in p for p in problems) else "fail",
        "profile_shapes": "pass" if not any("profile" in p for p in problems) else "fail",
        "problems": problems,
    }


def _profile_problems(tensors: list[dict], profiles: list[dict]) -> list[str]:
    problems = []
    for index, profile in enumerate(profiles):
        for tensor in (t for t in tensors if t["mode"] == "input"):
            for which, shape in profile.get(tensor["name"], {}).items():
                fits = len(shape) == len(tensor["shape"]) and all(
                    d in (-1, s) for d, s in zip(tensor["shape"], shape, strict=True)
                )
                if not fits:
                    problems.append(
                        f"profile {index} {tensor['name']}.{which} {shape} does not fit engine shape {tensor['shape']}"
                    )
    return problems


def _engine_run(params: Params, engine: Upstream, reference: Path, plugins: dict[str, Path]) -> dict:
    """Execute the engine where this machine can and compare it with the fp32 model; otherwise say why not."""
    from trtflow.stages import compare

    gpus = local_compute_capabilities()
    if not gpus:
        return {"status": f"not run ({no_gpu_reason()})"}
    if not set(gpus) & set(params.compute_capabilities) and params.hardware_compatibility == "none":
        return {"status": f"not run (local GPU {', '.join(gpus)} is not a target of this engine)"}
    ref = compare.session(reference)
    values = compare.input_values(reference, params.values)
    feeds = compare.sample_feeds(ref, params.profiles[:1], params.samples, params.seed, values)
    backend = get_backend(params.backend)
    try:
        actual = [backend.outputs_from_engine(engine.files["engine"], feed, plugins) for feed in feeds]
    except StageError as exc:
        return {"status": f"failed ({exc})", "passed": False}
    per_sample = [
        compare.compare_outputs(a, e, params.rtol, params.atol)
        for a, e in zip(actual, compare.run_all(ref, feeds), strict=True)
    ]
    outputs = compare.worst(per_sample)
    return {
        "status": "ran",
        "gpu": ", ".join(gpus),
        "samples": len(actual),
        "rtol": params.rtol,
        "atol": params.atol,
        "outputs": outputs,
        "passed": all(o["passed"] for o in outputs),
    }


def _raise_on_failure(record: dict, on_fail: str) -> None:
    checks = record["engine_checks"]
    if checks["problems"]:
        raise StageError("the engine does not match its model: " + "; ".join(checks["problems"]))
    if record["engine_run"].get("passed") is False and on_fail == "fail":
        from trtflow.stages import compare

        raise StageError(compare.failure_message("engine_run", record["engine_run"]))


STAGE = Stage(
    KIND,
    VERSION,
    run,
    warm_imports=("trtflow.stages.verify", "trtflow.stages.compare", "onnx"),  # it reads the model's graph (0.3 s)
    memory=declared_memory(300 * MIB, 2.0),
)
