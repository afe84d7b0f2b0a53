"""The samples a precision stage reads: the recipe's calibration and held-out files (checked against the model), or
seeded random inputs within the profiles."""

from __future__ import annotations

from pathlib import Path

from trtflow import calibration
from trtflow.errors import StageError, required
from trtflow.stages.base import Upstream
from trtflow.stages.precision_params import Params
from trtflow.util.inputvalues import out_of_range


def range_samples(source: Path, params: Params) -> list:
    """Without calibration files, AutoCast's ranges come from seeded random inputs, one at each distinct shape among
    the profiles' opt, min and max (valid integer values included: polygraphy's own random ids overran BERT's 2-row
    type table)."""
    from trtflow.stages import compare

    profiles = required(params.profiles, "profiles")
    seed = required(params.accuracy, "accuracy").seed
    values = compare.input_values(source, params.values)
    feeds = compare.sample_feeds(compare.signature(source), profiles, 3 * max(len(profiles), 1), seed, values)
    shapes: set[tuple] = set()
    kept = []
    for feed in feeds:
        shape = tuple((name, array.shape) for name, array in sorted(feed.items()))
        if shape not in shapes:
            shapes.add(shape)
            kept.append(feed)
    return [calibration.Sample(f"random #{i}", feed) for i, feed in enumerate(kept)]


def declared_samples(
    params: Params, inputs: dict[str, Upstream], model_inputs: dict, source: Path
) -> tuple[list, list | None]:
    """(held-out samples, calibration samples) read from the node's source files; calibration None if it has none.
    Integer inputs must hold values the model accepts (a token type of 5 for a 2-row table crashed ONNX Runtime)."""
    from trtflow.stages import compare

    reading = params.data
    if reading is None:
        return [], None
    values = compare.input_values(source, params.values)
    groups = []
    for prefix in (calibration.HELD_OUT_ROLE, calibration.CALIBRATION_ROLE):
        files = {
            role[len(prefix) :]: upstream.files[role] for role, upstream in inputs.items() if role.startswith(prefix)
        }
        groups.append(
            _checked(
                calibration.samples_from_inputs(files, reading, model_inputs), model_inputs, params, reading, values
            )
        )
    return groups[0], groups[1]


def _checked(samples: list, model_inputs: dict, params: Params, reading: dict, values: dict) -> list:
    field = "calibration.data" if reading["kind"] == "arrays" else "calibration.images"
    for sample in samples:
        problem = calibration.check_sample(sample, model_inputs, required(params.profiles, "profiles"))
        if problem:
            raise StageError(f"{field}: {problem}")
        wrong = out_of_range(sample.feed, values)
        if wrong:
            name, said = wrong
            raise StageError(
                f"{field}: {sample.origin}: input {name!r} {said}; fix the file, or set inputs.{name}.values if the "
                "model does accept it"
            )
    return samples


def random_samples(source: Path, params: Params) -> list:
    """`calibration: {random: true}`: seeded random batches at the profiles' opt/min/max shapes."""
    from trtflow.stages import compare

    quantize = required(params.quantize, "quantize")
    count, seed = quantize.samples or calibration.RANDOM_CALIBRATION_SAMPLES, quantize.seed
    values = compare.input_values(source, params.values)
    feeds = compare.sample_feeds(compare.signature(source), required(params.profiles, "profiles"), count, seed, values)
    return [calibration.Sample(f"random #{i}", feed) for i, feed in enumerate(feeds)]


def accuracy_samples(params: Params, source: Path, held_out: list, calibrating: list | None) -> tuple[list, str]:
    """Held-out files when there are any; else the calibration files (said so); else seeded random inputs."""
    from trtflow.stages import compare

    options = required(params.accuracy, "accuracy")
    if held_out:
        samples, data = held_out, held_out_said(params, len(held_out))
    elif calibrating:
        samples, data = calibrating[: options.samples], "the calibration samples (too few files to hold any out)"
    else:
        profiles = required(params.profiles, "profiles")
        values = compare.input_values(source, params.values)
        feeds = compare.sample_feeds(compare.signature(source), profiles, options.samples, options.seed, values)
        samples, data = (
            [calibration.Sample("random", f) for f in feeds],
            f"seeded random inputs within the profiles (seed {options.seed})",
        )
    return samples, data


def held_out_said(params: Params, count: int) -> str:
    """`16 images held out from the calibration set (4 batch(es) of 4)`, or `3 file(s) held out ...`."""
    reading = params.data or {}
    if reading.get("kind") == "images" and reading.get("batch", 1) > 1:
        batch = reading["batch"]
        return f"{count * batch} images held out from the calibration set ({count} batch(es) of {batch})"
    return f"{count} file(s) held out from the calibration set"


def autocast_data_record(params: Params, samples: list, declared: bool) -> dict:
    """Which inputs AutoCast's value ranges were measured on, to decide what stays fp32."""
    if not declared:
        seed = required(params.accuracy, "accuracy").seed
        return {"source": f"seeded random inputs within the profiles (seed {seed})", "samples": len(samples)}
    return {
        "source": "the recipe's calibration samples",
        "samples": len(samples),
        "data_digest": calibration.samples_digest(samples),
    }


def calibration_record(params: Params, samples: list, random: bool) -> dict:
    """What the manifest says about calibration: method, how many samples, the digest of the exact arrays."""
    quantize = required(params.quantize, "quantize")
    return {
        "method": quantize.method,
        "percentile": quantize.percentile,
        "random": random,
        "source": "random" if random else required(params.data, "data")["kind"],
        "seed": quantize.seed,
        "samples": len(samples),
        "rows": calibration.rows(samples),
        "data_digest": calibration.samples_digest(samples),
    }
