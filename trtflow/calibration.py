"""Calibration data: which files a precision node uses (decided at plan time, without numpy) and the samples in them.

A recipe declares one of
    calibration: {data: calib/*.npz}        a glob of .npz (one array per input name) or .npy (the only input) files
    calibration: {images: {path: calib/, resize: 256, crop: 224, mean: [...], std: [...]}}   Pillow preprocessing
    calibration: {random: true}              seeded random inputs within the profiles (explicit, and recorded)

A *sample* is one file: one batch for .npy/.npz, one image for an image folder. Which files are used is a
pure function of their relative paths and the seed, so planning names the exact files without reading them:
files are ranked by sha256("<seed>:<relative path>"); the first min(accuracy.samples, N // 2) are held out
for the accuracy report, the next `samples` (default: all the rest) are calibrated on.

    >>> split(["a.npz", "b.npz", "c.npz", "d.npz"], seed=1, held_out=1, samples=2)
    Split(held_out=('b.npz',), calibration=('a.npz', 'd.npz'))

Those files' content digests enter the node's key through the stat cache, so touching a file changes
nothing, while editing, adding or removing a file that is (or becomes) selected reruns the node. The stage
records the sha256 of the exact arrays it fed (after preprocessing); the manifest carries it.
"""

from __future__ import annotations

import glob
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtflow.errors import ProjectError, StageError
from trtflow.util.reads import note_glob

if TYPE_CHECKING:
    import numpy as np

    from trtflow.recipe.precision import Calibration
    from trtflow.recipe.project import RecipeFile

DATA_SUFFIXES = (".npy", ".npz")
IMAGE_SUFFIXES = (".bmp", ".jpeg", ".jpg", ".png", ".ppm", ".tif", ".tiff", ".webp")
CALIBRATION_ROLE, HELD_OUT_ROLE = "calib:", "holdout:"
RANDOM_CALIBRATION_SAMPLES = 16  # batches of seeded random inputs when `random: true` names no `samples`


@dataclass(frozen=True)
class Split:
    """The selected files: those held out for the accuracy report and those calibrated on, each in rank order."""

    held_out: tuple[str, ...]
    calibration: tuple[str, ...]


# plan time: stdlib only -----------------------------------------------------------------------------------


def rank(seed: int, relative: str) -> str:
    """The sort key that decides selection: stable across machines, Python versions and file order."""
    return hashlib.sha256(f"{seed}:{relative}".encode()).hexdigest()


def split(files: list[str], seed: int, held_out: int, samples: int | None) -> Split:
    """Held-out files first in rank order, then up to `samples` calibration files."""
    ranked = sorted(files, key=lambda relative: rank(seed, relative))
    rest = ranked[held_out:]
    return Split(held_out=tuple(ranked[:held_out]), calibration=tuple(rest if samples is None else rest[:samples]))


def declared_pattern(spec: Calibration) -> tuple[str, str] | None:
    """(field, pattern) of the declared files, e.g. ("data", "calib/*.npz"); None for random calibration."""
    if spec.data is not None:
        return "data", spec.data
    if spec.images is not None:
        return "images.path", spec.images.path
    return None


def matching_files(spec: Calibration, root: Path) -> list[str]:
    """Relative paths of every file the declaration matches, sorted (an image folder is searched recursively)."""
    declared = declared_pattern(spec)
    if declared is None:
        return []
    field, pattern = declared
    suffixes = DATA_SUFFIXES if field == "data" else IMAGE_SUFFIXES
    folder = root / pattern
    if field != "data" and folder.is_dir():
        paths = list(folder.rglob("*"))
        note_glob("rglob", str(folder), [str(p) for p in paths])
    else:
        matches = glob.glob(str(root / pattern), recursive=True)
        note_glob("glob", str(root / pattern), matches)
        paths = [Path(p) for p in matches]
    return sorted(
        Path(os.path.relpath(p, root)).as_posix() for p in paths if not p.is_dir() and p.suffix.lower() in suffixes
    )


def plan_split(item: RecipeFile, root: Path) -> Split | None:
    """The files a recipe's precision nodes use; None without calibration files. A declaration that matches
    nothing is a ProjectError when the DAG is made, so validate and run refuse it before any work."""
    spec = item.recipe.calibration
    declared = declared_pattern(spec) if spec is not None else None
    if spec is None or declared is None:
        return None
    files = matching_files(spec, root)
    if not files:
        field, pattern = declared
        kinds = "/".join(DATA_SUFFIXES if field == "data" else IMAGE_SUFFIXES)
        raise ProjectError(f"{item.where('calibration', *field.split('.'))}: no {kinds} file matches {pattern!r}")
    special = next((name for name in files if not (root / name).is_file()), None)
    if special is not None:
        field, _ = declared
        raise ProjectError(
            f"{item.where('calibration', *field.split('.'))}: {special} is not a regular file (a FIFO, a device or a "
            "broken link); calibration reads files only"
        )
    return split(files, spec.seed, min(item.recipe.accuracy.samples, len(files) // 2), spec.samples)


def sources(selection: Split | None, root: Path) -> tuple[tuple[str, Path], ...]:
    """A reduced precision's sources: the held-out files (accuracy report) and the calibration files (AutoCast, PTQ)."""
    if selection is None:
        return ()
    found = [(HELD_OUT_ROLE + relative, root / relative) for relative in selection.held_out]
    found += [(CALIBRATION_ROLE + relative, root / relative) for relative in selection.calibration]
    return tuple(found)


def reading_params(spec: Calibration | None) -> dict | None:
    """How the stage reads the files (part of the key): the kind, the seed that orders them, image preprocessing."""
    if spec is None or declared_pattern(spec) is None:
        return None
    if spec.images is None:
        return {"kind": "arrays", "seed": spec.seed}
    return {"kind": "images", "seed": spec.seed, **spec.images.model_dump(exclude={"path"})}


# stage time: numpy (and Pillow for images) ------------------------------------------------------------------


@dataclass
class Sample:
    """One feed for the model: {input name: array}, from one file (or `batch` images)."""

    origin: str
    feed: dict[str, np.ndarray]


def samples_from_inputs(files: dict[str, Path], reading: dict, model_inputs: dict[str, dict]) -> list[Sample]:
    """The feeds in rank order; `files` maps relative path -> file, `model_inputs` name -> {dtype, dims}."""
    ordered = sorted(files, key=lambda relative: rank(reading["seed"], relative))
    if reading["kind"] == "images":
        return _image_samples(ordered, files, reading, model_inputs)
    return [Sample(relative, arrays_from_file(relative, files[relative], model_inputs)) for relative in ordered]


def arrays_from_file(relative: str, path: Path, model_inputs: dict[str, dict]) -> dict[str, np.ndarray]:
    """One batch per input name from a .npz, or the only input's batch from a .npy (never unpickling anything)."""
    import numpy as np

    try:
        if path.suffix.lower() == ".npy":
            return _npy(relative, np.load(path, allow_pickle=False), model_inputs)
        with np.load(path, allow_pickle=False) as loaded:
            return {name: loaded[name] for name in loaded.files}
    except (ValueError, OSError, EOFError) as exc:
        raise StageError(f"{relative}: cannot read it: {(str(exc).splitlines() or [type(exc).__name__])[0]}") from exc


def _npy(relative: str, array: np.ndarray, model_inputs: dict[str, dict]) -> dict[str, np.ndarray]:
    if len(model_inputs) != 1:
        raise StageError(
            f"{relative}: a .npy file holds one array but the model has inputs "
            f"{', '.join(model_inputs)}: use .npz files with one array per input name"
        )
    return {next(iter(model_inputs)): array}


def _image_samples(
    ordered: list[str], files: dict[str, Path], reading: dict, model_inputs: dict[str, dict]
) -> list[Sample]:
    """Whole batches of `batch` preprocessed images; a last, partial batch is left out."""
    import numpy as np

    name = reading["input"] or next(iter(model_inputs))
    size = reading["batch"]
    samples = []
    for start in range(0, len(ordered) - size + 1, size):
        group = ordered[start : start + size]
        samples.append(
            Sample(
                group[0] if size == 1 else f"{group[0]} (+{size - 1})",
                {name: np.stack([preprocess_image(files[r], reading, r) for r in group])},
            )
        )
    return samples


def preprocess_image(path: Path, reading: dict, relative: str = "") -> np.ndarray:
    """Decode, convert, resize (shorter side or exact), center-crop, scale to [0,1], normalize, lay out, cast."""
    import numpy as np
    from PIL import Image

    try:
        with Image.open(path) as image:
            image = image.convert("L" if reading["color"] == "L" else "RGB")
            image = _center_crop(_resize(image, reading["resize"]), reading["crop"])
            pixels = np.asarray(image)
    except (OSError, ValueError) as exc:
        raise StageError(f"{relative or path.name}: cannot read the image: {exc}") from exc
    pixels = pixels[..., None] if pixels.ndim == 2 else pixels[..., ::-1] if reading["color"] == "BGR" else pixels
    values = pixels if reading["dtype"] == "uint8" else _normalized(pixels, reading)
    values = values.transpose(2, 0, 1) if reading["layout"] == "NCHW" else values
    return np.ascontiguousarray(values.astype(reading["dtype"]))


def _resize(image: Any, size: Any) -> Any:
    from PIL import Image

    if size is None:
        return image
    if isinstance(size, int):  # the shorter side becomes `size`, keeping the aspect ratio (torchvision's Resize(int))
        width, height = image.size
        scale = size / min(width, height)
        size = [max(1, round(height * scale)), max(1, round(width * scale))]
    return image.resize((size[1], size[0]), Image.Resampling.BILINEAR)


def _center_crop(image: Any, size: Any) -> Any:
    if size is None:
        return image
    height, width = (size, size) if isinstance(size, int) else size
    left, top = round((image.size[0] - width) / 2), round((image.size[1] - height) / 2)
    return image.crop((left, top, left + width, top + height))


def _normalized(pixels: np.ndarray, reading: dict) -> np.ndarray:
    import numpy as np

    values: np.ndarray = pixels.astype(np.float32) / 255.0
    if reading["mean"] is not None:
        values = values - np.asarray(reading["mean"], dtype=np.float32)
    if reading["std"] is not None:
        values = values / np.asarray(reading["std"], dtype=np.float32)
    return values


def check_sample(sample: Sample, model_inputs: dict[str, dict], profiles: list[dict]) -> str | None:
    """Why a sample cannot be fed to the model (names, dtypes, shapes within a profile), or None if it can."""
    missing = [name for name in model_inputs if name not in sample.feed]
    extra = [name for name in sample.feed if name not in model_inputs]
    if missing:
        return (
            f"{sample.origin} has no array for input {missing[0]!r} (it holds: {', '.join(sample.feed) or 'nothing'})"
        )
    if extra:
        return f"{sample.origin} holds {extra[0]!r}, which is not a model input (inputs: {', '.join(model_inputs)})"
    for name, meta in model_inputs.items():
        if meta["dtype"] is not None and str(sample.feed[name].dtype) != meta["dtype"]:
            return f"{sample.origin}: input {name!r} is {sample.feed[name].dtype}, the model takes {meta['dtype']}"
    return _shape_problem(sample, model_inputs, profiles) or _non_finite(sample)


def _non_finite(sample: Sample) -> str | None:
    """NaN or infinite values would poison the calibration ranges (and every scale computed from them)."""
    import numpy as np

    for name, array in sample.feed.items():
        if array.dtype.kind in "fc" and not np.isfinite(array).all():
            bad = int(array.size - np.isfinite(array).sum())
            return f"{sample.origin}: input {name!r} holds {bad} NaN or infinite value(s) of {array.size}"
    return None


def _shape_problem(sample: Sample, model_inputs: dict[str, dict], profiles: list[dict]) -> str | None:
    shapes = {name: list(array.shape) for name, array in sample.feed.items()}
    if any(_fits(shapes, profile) for profile in profiles):
        return None
    if not profiles and all(_fits_dims(shapes[name], meta["dims"]) for name, meta in model_inputs.items()):
        return None
    name = next(iter(shapes))
    allowed = "; ".join(
        f"profile {i}: {name} min {p[name]['min']} max {p[name]['max']}" for i, p in enumerate(profiles) if name in p
    )
    allowed = allowed or f"the model's {name} is {['?' if d is None else d for d in model_inputs[name]['dims']]}"
    shown = ", ".join(f"{n} {s}" for n, s in shapes.items())
    return f"{sample.origin}: shapes {shown} fit no profile ({allowed})"


def _fits(shapes: dict[str, list[int]], profile: dict) -> bool:
    return all(
        name in profile
        and len(shape) == len(profile[name]["min"])
        and all(lo <= d <= hi for d, lo, hi in zip(shape, profile[name]["min"], profile[name]["max"], strict=True))
        for name, shape in shapes.items()
    )


def _fits_dims(shape: list[int], dims: list[int | None]) -> bool:
    return len(shape) == len(dims) and all(d is None or d == s for d, s in zip(dims, shape, strict=True))


def samples_digest(samples: list[Sample]) -> str:
    """sha256 of the exact arrays fed, in order (names, dtypes, shapes and bytes): the calibration data digest."""
    digest = hashlib.sha256()
    for sample in samples:
        for name in sorted(sample.feed):
            array = sample.feed[name]
            digest.update(f"{name}|{array.dtype.str}|{list(array.shape)}|".encode())
            digest.update(array.tobytes(order="C"))
    return digest.hexdigest()


def rows(samples: list[Sample]) -> int:
    """How many rows along the batch axis the samples hold (of their first input; a scalar counts as one)."""
    firsts = [next(iter(sample.feed.values())) for sample in samples]
    return sum(int(array.shape[0]) if array.ndim else 1 for array in firsts)


# validate time --------------------------------------------------------------------------------------------


def check_calibration_data(item: RecipeFile, root: Path) -> None:
    """Read the selected files (only the first batch of images: they share one preprocessing) and check them
    against the model's inputs and the profiles; raises ProjectError naming the calibration field and the file."""
    profiles = [
        {name: dict(zip(("min", "opt", "max"), shape.triple(), strict=True)) for name, shape in profile.inputs.items()}
        for profile in item.recipe.profiles
    ]
    selection = plan_split(item, root)
    reading = reading_params(item.recipe.calibration)
    if selection is None or reading is None:
        return
    model_inputs = _declared_inputs(item, root, profiles)
    if not model_inputs:
        return  # a torch source without profiles: the precision stage checks the samples against the exported model
    where = item.where("calibration", "data" if reading["kind"] == "arrays" else "images")
    _check_image_input(item, reading, model_inputs)
    names = list(selection.held_out + selection.calibration)
    names = names[: reading["batch"]] if reading["kind"] == "images" else names
    try:
        for sample in samples_from_inputs({r: root / r for r in names}, reading, model_inputs):
            problem = check_sample(sample, model_inputs, profiles)
            if problem:
                raise ProjectError(f"{where}: {problem}")
    except StageError as exc:
        raise ProjectError(f"{where}: {exc}") from exc


def _declared_inputs(item: RecipeFile, root: Path, profiles: list[dict]) -> dict[str, dict]:
    """The ONNX source's inputs; for a torch source (no ONNX before export) the profiles' names, dtype unchecked."""
    if getattr(item.recipe.source, "onnx", None):
        return model_input_types(item.source_path(root))
    return {name: {"dtype": None, "dims": None} for name in (profiles[0] if profiles else {})}


def _check_image_input(item: RecipeFile, reading: dict, model_inputs: dict[str, dict]) -> None:
    if reading["kind"] != "images":
        return
    name = reading["input"]
    if name is None and len(model_inputs) != 1:
        raise ProjectError(
            f"{item.where('calibration', 'images')}: the model has inputs {', '.join(model_inputs)}: "
            "name the one the images feed with input: <name>"
        )
    if name is not None and name not in model_inputs:
        raise ProjectError(
            f"{item.where('calibration', 'images', 'input')}: the model has no input {name!r} (its inputs: "
            f"{', '.join(model_inputs)})"
        )


def model_input_types(path: Path) -> dict[str, dict]:
    """{input name: {"dtype": "float32", "dims": [None, 3, 32, 32]}} of an ONNX model (graph only)."""
    from trtflow.util.onnxio import model_io_of_file

    return {t.name: {"dtype": t.dtype, "dims": t.static_dims} for t in model_io_of_file(path).inputs}
