"""Verify: check the engine against the model it was built from, run it where possible, collect the proofs.

Each model transformation already proved itself on ONNX Runtime where it happened (cleanup: cleaned ==
source within fp32 tolerances; precision: reduced precision close to fp32); verify carries those proofs
into the manifest beside its own checks:
- engine_checks: without a GPU, the engine's I/O names and dtypes match the model, and every profile
  shape fits the engine's static dimensions.
- engine_run: only where a GPU and a runtime can load the engine, compared with the fp32 model on ONNX
  Runtime; otherwise `not run (<reason>)`. Nothing is ever reported as passed that did not run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trtflow.backends.base import get_backend
from trtflow.device import local_compute_capabilities, no_gpu_reason
from trtflow.errors import StageError
from trtflow.stages import StageOutput, Upstream, compare

def run(params: dict, inputs: dict[str, Upstream], workdir: Path) -> StageOutput:
    model = compare.signature(inputs["model"].files["model"])  # no session: ORT's CPU provider cannot run bf16
    record = {
        "cleanup_equality": inputs["reference"].record.get("equality"),
        "precision_accuracy": inputs["model"].record.get("accuracy"),
        "engine_checks": check_engine_io(inputs["engine"].record["tensors"], model, params["profiles"]),
        "engine_run": _engine_run(params, inputs["engine"], inputs["reference"].files["model"]),
    }
    _raise_on_failure(record, params["on_fail"])
    report = workdir / "verify.json"
    report.write_text(json.dumps(record, indent=2, sort_keys=True))
    return StageOutput(files={"report": report}, record=record)


def check_engine_io(tensors: list[dict], candidate: Any, profiles: list[dict]) -> dict:
    """Engine I/O vs the model it was built from, and profiles vs the engine's static dims."""
    model = {m.name: ("input", compare.ORT_DTYPES.get(m.type, m.type)) for m in candidate.get_inputs()}
    model.update({m.name: ("output", compare.ORT_DTYPES.get(m.type, m.type)) for m in candidate.get_outputs()})
    engine = {t["name"]: (t["mode"], t["dtype"]) for t in tensors}
    problems = [f"{name}: engine {engine.get(name)} vs model {model.get(name)}" for name in sorted(set(model) | set(engine)) if engine.get(name) != model.get(name)]
    problems += _profile_problems(tensors, profiles)
    return {"io_names_and_dtypes": "pass" if not any("vs model" in p for p in problems) else "fail",
            "profile_shapes": "pass" if not any("profile" in p for p in problems) else "fail", "problems": problems}


def _profile_problems(tensors: list[dict], profiles: list[dict]) -> list[str]:
    problems = []
    for index, profile in enumerate(profiles):
        for tensor in (t for t in tensors if t["mode"] == "input"):
            for which, shape in profile.get(tensor["name"], {}).items():
                fits = len(shape) == len(tensor["shape"]) and all(d in (-1, s) for d, s in zip(tensor["shape"], shape))
                if not fits:
                    problems.append(f"profile {index} {tensor['name']}.{which} {shape} does not fit engine shape {tensor['shape']}")
    return problems


def _engine_run(params: dict, engine: Upstream, reference: Path) -> dict:
    """Execute the engine where this machine can and compare it with the fp32 model; otherwise say why not."""
    gpus = local_compute_capabilities()
    if not gpus:
        return {"status": f"not run ({no_gpu_reason()})"}
    if not set(gpus) & set(params["compute_capabilities"]) and params["hardware_compatibility"] == "none":
        return {"status": f"not run (local GPU {', '.join(gpus)} is not a target of this engine)"}
    ref = compare.session(reference)
    feeds = compare.sample_feeds(ref, params["profiles"][:1], params["samples"], params["seed"])
    backend = get_backend(params["backend"])
    try:
        actual = [backend.outputs_from_engine(engine.files["engine"], feed) for feed in feeds]
    except StageError as exc:
        return {"status": f"failed ({exc})", "passed": False}
    per_sample = [compare.compare_outputs(a, e, params["rtol"], params["atol"]) for a, e in zip(actual, compare.run_all(ref, feeds))]
    outputs = compare.worst(per_sample)
    return {"status": "ran", "gpu": ", ".join(gpus), "samples": len(actual), "rtol": params["rtol"], "atol": params["atol"],
            "outputs": outputs, "passed": all(o["passed"] for o in outputs)}


def _raise_on_failure(record: dict, on_fail: str) -> None:
    checks = record["engine_checks"]
    if checks["problems"]:
        raise StageError("the engine does not match its model: " + "; ".join(checks["problems"]))
    if record["engine_run"].get("passed") is False and on_fail == "fail":
        raise StageError(compare.failure_message("engine_run", record["engine_run"]))
