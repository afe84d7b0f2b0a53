"""Precision: the ONNX a build starts from, one per precision and shared by every target.

TensorRT 11 and TensorRT-RTX build strongly typed networks: reduced precision is baked into the ONNX
(fp16/bf16 by ModelOpt AutoCast, int8/fp8 by ModelOpt PTQ with Q/DQ nodes). fp32 passes the cleaned
model through unchanged (the store deduplicates it: same bytes, same object).

A reduced-precision model then proves itself: it and the fp32 model run on ONNX Runtime (CPU) over
held-out samples (files the calibration did not use), or seeded random inputs within the profiles when
no files are declared; out of the precision's tolerance fails the stage unless `verify: {on_fail: warn}`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

from trtflow import calibration
from trtflow.errors import StageError, TrtflowError
from trtflow.precisionspec import AUTOCAST_PRECISIONS, QUANTIZED_PRECISIONS
from trtflow.stages import StageOutput, Upstream, compare, tool_version
from trtflow.stages.modelfile import FILE_NAMES, MODEL, MODEL_DATA, place_side_by_side, save_model

def run(params: dict, inputs: dict[str, Upstream], workdir: Path) -> StageOutput:
    precision = params["precision"]
    if precision == "fp32":
        return StageOutput(files=_pass_through(inputs["model"], workdir), record={"precision": "fp32", "accuracy": None})
    if precision not in AUTOCAST_PRECISIONS + QUANTIZED_PRECISIONS:
        raise StageError(f"unknown precision {precision}")
    import onnx

    source = _pass_through(inputs["model"], workdir / "source")["model"]
    model_inputs = calibration.model_input_types(source)
    held_out, calibrating = _declared_samples(params, inputs, model_inputs)
    compare.onnxruntime()  # refuse a broken ONNX Runtime install before ModelOpt trips over it
    model, details = _convert(params, source, calibrating, workdir)
    files = save_model(onnx, model, workdir)
    accuracy = _accuracy(params, model, source, held_out, calibrating)
    if not accuracy["passed"] and params["on_fail"] == "fail":
        raise StageError(_failure_message(precision, accuracy))
    record = {"precision": precision, "tool": f"nvidia-modelopt {tool_version('nvidia-modelopt')}", **details, "accuracy": accuracy}
    return StageOutput(files={**files, "report": _report(record, workdir)}, record=record)


def _report(record: dict, workdir: Path) -> Path:
    """The record as an output too: verify and package depend on its digest, so a new accuracy report or
    calibration digest reaches the manifest even when the model came out byte-identical (and builds stay cached)."""
    path = workdir / "precision.json"
    path.write_text(json.dumps(record, sort_keys=True, indent=1) + "\n")
    return path


def _convert(params: dict, source: Path, calibrating: Optional[list], workdir: Path) -> tuple[Any, dict]:
    """The reduced-precision model and what to record about how it was made."""
    from trtflow.stages import convert

    precision, printed = params["precision"], []
    try:
        with convert.quiet() as printed:
            if precision in AUTOCAST_PRECISIONS:
                return convert.autocast(source, precision, params["autocast"]), {"autocast": params["autocast"], "calibration": None}
            samples = calibrating if calibrating is not None else _random_samples(source, params)
            options = {**params["quantize"], "external_data": (source.parent / FILE_NAMES[MODEL_DATA]).exists()}
            model = convert.quantize(source, workdir / "quantized" / "model.onnx", precision, [s.feed for s in samples], options)
    except TrtflowError:
        raise
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [""])[0]
        raise StageError(f"ModelOpt failed to make {precision}: {type(exc).__name__}: {first} [it printed: {' | '.join(printed[-3:])}]") from None
    summary = convert.qdq_summary(model)
    convert.check_quantized(summary, precision)
    return model, {"quantize": params["quantize"], "qdq": summary, "calibration": _calibration_record(params, samples, calibrating is None)}


def _calibration_record(params: dict, samples: list, random: bool) -> dict:
    """What the manifest says about calibration: method, how many samples, the digest of the exact arrays."""
    quantize = params["quantize"]
    return {"method": quantize["method"], "percentile": quantize["percentile"], "random": random,
            "source": "random" if random else params["data"]["kind"], "seed": quantize["seed"],
            "samples": len(samples), "rows": calibration.rows(samples), "data_digest": calibration.samples_digest(samples)}


def _declared_samples(params: dict, inputs: dict[str, Upstream], model_inputs: dict) -> tuple[list, Optional[list]]:
    """(held-out samples, calibration samples) read from the node's source files; calibration None if it has none."""
    reading = params["data"]
    if reading is None:
        return [], None
    groups = []
    for prefix in (calibration.HELD_OUT_ROLE, calibration.CALIBRATION_ROLE):
        files = {role[len(prefix):]: upstream.files[role] for role, upstream in inputs.items() if role.startswith(prefix)}
        groups.append(_checked(calibration.samples_from_inputs(files, reading, model_inputs), model_inputs, params, reading))
    return groups[0], (groups[1] if params["precision"] in QUANTIZED_PRECISIONS else None)


def _checked(samples: list, model_inputs: dict, params: dict, reading: dict) -> list:
    field = "calibration.data" if reading["kind"] == "arrays" else "calibration.images"
    for sample in samples:
        problem = calibration.check_sample(sample, model_inputs, params["profiles"])
        if problem:
            raise StageError(f"{field}: {problem}")
    return samples


def _random_samples(source: Path, params: dict) -> list:
    """`calibration: {random: true}`: seeded random batches at the profiles' opt/min/max shapes."""
    count, seed = params["quantize"]["samples"] or calibration.RANDOM_CALIBRATION_SAMPLES, params["quantize"]["seed"]
    feeds = compare.sample_feeds(compare.session(source), params["profiles"], count, seed)
    return [calibration.Sample(f"random #{i}", feed) for i, feed in enumerate(feeds)]


def _accuracy(params: dict, model: Any, source: Path, held_out: list, calibrating: Optional[list]) -> dict:
    """Held-out files when there are any; else the calibration files (said so); else seeded random inputs."""
    from trtflow.stages import accuracy

    options = params["accuracy"]
    if held_out:
        samples, data = held_out, f"{len(held_out)} file(s) held out from the calibration set"
    elif calibrating:
        samples, data = calibrating[:options["samples"]], "the calibration samples (too few files to hold any out)"
    else:
        feeds = compare.sample_feeds(compare.session(source), params["profiles"], options["samples"], options["seed"])
        samples, data = [calibration.Sample("random", f) for f in feeds], f"seeded random inputs within the profiles (seed {options['seed']})"
    result = accuracy.report(model, source, [s.feed for s in samples], options["tolerance"], data)
    return {**result, "held_out": bool(held_out)}


def _failure_message(precision: str, result: dict) -> str:
    from trtflow.stages import accuracy

    return accuracy.failure_message(precision, result)


def _pass_through(model: Upstream, workdir: Path) -> dict[str, Path]:
    return place_side_by_side(model.files, MODEL, workdir)
