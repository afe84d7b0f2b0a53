"""Verify: prove a build's ONNX equal to the source on ONNX Runtime, check the engine, run it where possible.

Three parts, each recorded for the manifest:
- onnx_compare: the ONNX the engine was built from vs the source model, on ONNX Runtime (CPU), on seeded
  inputs drawn at the min/opt/max shapes of every profile; max abs/rel error per output vs tolerances.
- engine_checks: without a GPU, the engine's I/O names and dtypes match the model, and every profile
  shape fits the engine's static dimensions.
- engine_run: only where a GPU and a runtime can load the engine; otherwise `not run (<reason>)`.
  Nothing is ever reported as passed that did not run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from trtflow.backends.base import get_backend, import_or_explain
from trtflow.device import local_compute_capabilities, no_gpu_reason
from trtflow.errors import StageError
from trtflow.stages import StageOutput, Upstream

ORT_DTYPES = {"tensor(float)": "float32", "tensor(float16)": "float16", "tensor(double)": "float64", "tensor(int64)": "int64",
              "tensor(int32)": "int32", "tensor(int8)": "int8", "tensor(uint8)": "uint8", "tensor(bool)": "bool"}


def run(params: dict, inputs: dict[str, Upstream], workdir: Path) -> StageOutput:
    ort = import_or_explain("onnxruntime", "verify")
    source = _session(ort, inputs["source"].files["source"])
    candidate = _session(ort, inputs["model"].files["model"])
    feeds = sample_feeds(candidate, params["profiles"], params["samples"], params["seed"])
    expected = [dict(zip(_output_names(source), source.run(None, feed))) for feed in feeds]
    record = {
        "onnx_compare": _compare_onnx(candidate, feeds, expected, params),
        "engine_checks": check_engine_io(inputs["engine"].record["tensors"], candidate, params["profiles"]),
        "engine_run": _engine_run(params, inputs["engine"], feeds, expected),
    }
    _raise_on_failure(record, params["on_fail"])
    report = workdir / "verify.json"
    report.write_text(json.dumps(record, indent=2, sort_keys=True))
    return StageOutput(files={"report": report}, record=record)


def _session(ort: Any, path: Path) -> Any:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1  # verification runs beside parallel builds; keep it to one core
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _output_names(session: Any) -> list[str]:
    return [o.name for o in session.get_outputs()]


def sample_feeds(session: Any, profiles: list[dict], samples: int, seed: int) -> list[dict[str, np.ndarray]]:
    """Seeded inputs: sample i uses profile i % P at its min, opt or max shape in turn (static shapes if no profile)."""
    rng = np.random.default_rng(seed)
    feeds = []
    for index in range(samples):
        profile = profiles[index % len(profiles)] if profiles else {}
        which = ("opt", "min", "max")[(index // max(len(profiles), 1)) % 3]
        feeds.append({i.name: _random(rng, i, profile.get(i.name, {}).get(which)) for i in session.get_inputs()})
    return feeds


def _random(rng: np.random.Generator, meta: Any, shape: list[int] | None) -> np.ndarray:
    shape = shape or [d if isinstance(d, int) else 1 for d in meta.shape]
    dtype = ORT_DTYPES.get(meta.type)
    if dtype is None:
        raise StageError(f"input {meta.name!r} has type {meta.type}, which verification cannot generate yet")
    if dtype.startswith("float"):
        return rng.standard_normal(shape).astype(dtype)
    if dtype == "bool":
        return rng.integers(0, 2, shape).astype(bool)
    return rng.integers(0, 8, shape).astype(dtype)


def compare_outputs(actual: dict[str, np.ndarray], expected: dict[str, np.ndarray], rtol: float, atol: float) -> list[dict]:
    """Per output: max abs error, max rel error, and whether |a-e| <= atol + rtol*|e| everywhere."""
    results = []
    for name, want in expected.items():
        got = np.asarray(actual[name], dtype=np.float64)
        want = np.asarray(want, dtype=np.float64)
        if got.shape != want.shape:
            results.append({"name": name, "max_abs_error": None, "max_rel_error": None, "passed": False, "problem": f"shape {list(got.shape)} != {list(want.shape)}"})
            continue
        error = np.abs(got - want)
        results.append({"name": name, "max_abs_error": float(error.max(initial=0.0)),
                        "max_rel_error": float((error / np.maximum(np.abs(want), 1e-12)).max(initial=0.0)),
                        "passed": bool(np.all(error <= atol + rtol * np.abs(want)))})
    return results


def _worst(per_sample: list[list[dict]]) -> list[dict]:
    """Fold per-sample results into one row per output: the largest errors, passed only if every sample passed."""
    worst: dict[str, dict] = {}
    for rows in per_sample:
        for row in rows:
            seen = worst.setdefault(row["name"], dict(row))
            for key in ("max_abs_error", "max_rel_error"):
                if row[key] is None or seen[key] is None:
                    seen[key] = None
                else:
                    seen[key] = max(seen[key], row[key])
            seen["passed"] = seen["passed"] and row["passed"]
    return list(worst.values())


def _compare_onnx(candidate: Any, feeds: list[dict], expected: list[dict], params: dict) -> dict:
    names = _output_names(candidate)
    per_sample = [compare_outputs(dict(zip(names, candidate.run(None, feed))), want, params["rtol"], params["atol"]) for feed, want in zip(feeds, expected)]
    outputs = _worst(per_sample)
    return {"runtime": "onnxruntime CPUExecutionProvider", "samples": len(feeds), "rtol": params["rtol"], "atol": params["atol"],
            "outputs": outputs, "passed": all(o["passed"] for o in outputs)}


def check_engine_io(tensors: list[dict], candidate: Any, profiles: list[dict]) -> dict:
    """Engine I/O vs the model it was built from, and profiles vs the engine's static dims."""
    model = {m.name: ("input", ORT_DTYPES.get(m.type, m.type)) for m in candidate.get_inputs()}
    model.update({m.name: ("output", ORT_DTYPES.get(m.type, m.type)) for m in candidate.get_outputs()})
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


def _engine_run(params: dict, engine: Upstream, feeds: list[dict], expected: list[dict]) -> dict:
    """Execute the engine where this machine can; otherwise say why it did not run."""
    gpus = local_compute_capabilities()
    if not gpus:
        return {"status": f"not run ({no_gpu_reason()})"}
    if not set(gpus) & set(params["compute_capabilities"]) and params["hardware_compatibility"] == "none":
        return {"status": f"not run (local GPU {', '.join(gpus)} is not a target of this engine)"}
    first_profile = [feed for index, feed in enumerate(feeds) if not params["profiles"] or index % len(params["profiles"]) == 0]
    backend = get_backend(params["backend"])
    try:
        actual = [backend.outputs_from_engine(engine.files["engine"], feed) for feed in first_profile]
    except StageError as exc:
        return {"status": f"failed ({exc})", "passed": False}
    outputs = _worst([compare_outputs(a, e, params["rtol"], params["atol"]) for a, e in zip(actual, expected)])
    passed = all(o["passed"] for o in outputs)
    return {"status": "ran", "gpu": ", ".join(gpus), "samples": len(actual), "outputs": outputs, "passed": passed}


def _raise_on_failure(record: dict, on_fail: str) -> None:
    checks = record["engine_checks"]
    if checks["problems"]:
        raise StageError("the engine does not match its model: " + "; ".join(checks["problems"]))
    for part in ("onnx_compare", "engine_run"):
        if record[part].get("passed") is False and on_fail == "fail":
            bad = [o for o in record[part].get("outputs", []) if not o["passed"]]
            detail = ", ".join(f"{o['name']} max abs {o['max_abs_error']} max rel {o['max_rel_error']}" for o in bad) or record[part].get("status", "")
            raise StageError(f"{part} out of tolerance (rtol {record['onnx_compare']['rtol']}, atol {record['onnx_compare']['atol']}): first differing output {detail}")
