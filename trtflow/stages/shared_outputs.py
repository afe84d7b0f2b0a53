"""What a run's reduced precisions of one recipe would each compute again on the same fp32 model and data: computed
by the first that needs it and read by the others.

- **fp32 outputs** over the check feeds (fp16, int8 and fp8 check the same cleaned model on the same held-out feeds).
- **Value ranges** over the calibration feeds: fp16 measures every float tensor's smallest and largest value for
  AutoCast (stages.ranges); max calibration (fp8's default, int8's `method: max`) needs the same of the tensors it
  quantizes, which ModelOpt measures by running the model again (modelopt_passes takes them from here instead).

The model tools' worker servers of a run name a folder of their own in SHARED_OUTPUTS_ENV (executors.forking); a
stage that finds no entry there computes what it needs as it would alone (a check runs fp32 beside its candidate:
computed ahead instead, BERT-base's fp16 stage took 3 s and 0.7 GB more) and leaves it. An entry is named by the digest
of all it depends on (what it holds, the model's files, each feed's arrays, ONNX Runtime's version, this format) and
is written whole, renamed into place, or not at all; an entry that cannot be read is computed again. What an entry
holds is what the reader would compute itself (single-threaded sessions for the outputs, the same numbers; a minimum
and a maximum are exact whichever pass finds them), so the records and models are the same with or without it
(tests/stages/test_shared_outputs.py). Without the folder (Ray, a stage run alone) each stage computes its own.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from trtflow.errors import required
from trtflow.util.servers import SHARED_OUTPUTS_ENV
from trtflow.util.versions import ort_version

FORMAT = 2
T = TypeVar("T")


def fp32_outputs(model: Path, digests: Mapping[str, str], feeds: list[dict], needed: bool = False) -> list[dict] | None:
    """The fp32 outputs of `model` (files of `digests`) for each feed, as a stage of this run left them; else, if the
    caller needs them now (`needed`), computed and left; else None (a check computes them beside its candidate, at no
    cost of its own, and leaves them: leave_outputs)."""
    found = _parsed(_outputs_held, _entry("outputs", digests, feeds), len(feeds))
    if found is not None or not needed:
        return found
    outputs = _computed(model, feeds)
    leave_outputs(digests, feeds, outputs)
    return outputs


class Reference:
    """fp32's outputs of `model` (files of `digests`) over one stage's check feeds, computed at most once: as a stage
    of this run left them; else as the stage's first check computes them beside its candidate (`keep`: held, and left
    for the run's other stages); else when asked (`needed`). A fallback search asks only once its first try missed,
    so a first try that passes costs what it costs without one (computed ahead, BERT-base's fp16 took 3 s more)."""

    def __init__(self, model: Path, digests: Mapping[str, str], feeds: list[dict]) -> None:
        self._model, self._digests, self._feeds = model, digests, feeds
        self.outputs = fp32_outputs(model, digests, feeds)

    def keep(self, outputs: list[dict]) -> None:
        """Hold the outputs a check computed, and leave them for the run's other stages."""
        self.outputs = outputs
        leave_outputs(self._digests, self._feeds, outputs)

    def needed(self) -> list[dict]:
        """The outputs, computed (and left) now if no check has computed them."""
        if self.outputs is None:
            self.outputs = required(fp32_outputs(self._model, self._digests, self._feeds, needed=True), "fp32 outputs")
        return self.outputs


def leave_outputs(digests: Mapping[str, str], feeds: list[dict], outputs: list[dict]) -> None:
    """Leave the fp32 outputs of the model (files of `digests`) for each feed, for the run's other stages."""
    entry = _entry("outputs", digests, feeds)
    if entry is not None:
        arrays = {f"o{i}_{j}": output[name] for i, output in enumerate(outputs) for j, name in enumerate(output)}
        _write(entry, {"names": np.array(json.dumps([list(output) for output in outputs])), **arrays})


def leave_ranges(digests: Mapping[str, str], feeds: list[dict], ranges: Mapping[str, Any]) -> None:
    """Leave each tensor's smallest and largest value over `feeds` (stages.ranges.Range) for the run's other stages."""
    entry = _entry("ranges", digests, feeds)
    if entry is not None and ranges:
        names = sorted(ranges)
        lows = np.array([ranges[name].low for name in names], np.float32)
        highs = np.array([ranges[name].high for name in names], np.float32)
        _write(entry, {"names": np.array(json.dumps(names)), "lows": lows, "highs": highs})


def known_ranges(digests: Mapping[str, str], feeds: list[dict]) -> dict[str, tuple[Any, Any]] | None:
    """Tensor name -> (smallest, largest) value (float32) over `feeds`, as a stage of this run left them; or None."""
    return _parsed(_ranges_held, _entry("ranges", digests, feeds), 0)


def _outputs_held(held: dict[str, Any], count: int) -> list[dict] | None:
    names = json.loads(str(held["names"]))
    if len(names) != count:
        return None
    return [{name: held[f"o{i}_{j}"] for j, name in enumerate(output)} for i, output in enumerate(names)]


def _ranges_held(held: dict[str, Any], _: int) -> dict[str, tuple[Any, Any]] | None:
    names = json.loads(str(held["names"]))
    lows, highs = held["lows"], held["highs"]
    if any(array.dtype != np.float32 or array.shape != (len(names),) for array in (lows, highs)):
        return None
    return {name: (lows[index], highs[index]) for index, name in enumerate(names)}


def _parsed(parse: Callable[[dict[str, Any], int], T | None], entry: Path | None, count: int) -> T | None:
    """What `parse` makes of an entry's arrays; None without the entry, or if they are not what it expects."""
    held = _read(entry) if entry is not None else None
    try:
        return parse(held, count) if held is not None else None
    except (ValueError, KeyError, TypeError, IndexError):
        return None


def entry_key(kind: str, digests: Mapping[str, str], feeds: list[dict]) -> str:
    """The digest that names an entry: what it holds, the model's files, every feed's arrays (names, types, shapes,
    bytes), ONNX Runtime's version and the format."""
    hashed = hashlib.sha256(json.dumps([FORMAT, kind, ort_version(), sorted(digests.items())]).encode())
    for feed in feeds:
        for name in sorted(feed):
            array = np.ascontiguousarray(feed[name])
            hashed.update(json.dumps([name, array.dtype.str, list(array.shape)]).encode())
            hashed.update(array.tobytes())
    return hashed.hexdigest()


def _entry(kind: str, digests: Mapping[str, str], feeds: list[dict]) -> Path | None:
    """Where the run's shared folder keeps this entry; None without the folder, or for a model of unknown digests
    (every such model would share one entry)."""
    folder = os.environ.get(SHARED_OUTPUTS_ENV)
    if not folder or not Path(folder).is_dir() or not digests:
        return None
    return Path(folder) / f"{entry_key(kind, digests, feeds)}.npz"


def _computed(model: Path, feeds: list[dict]) -> list[dict]:
    from trtflow.stages import compare

    sizes = compare.model_bytes(model)
    return compare.run_spread(lambda: compare.session(model), feeds, compare.threads_for(sizes))[0]


def _write(entry: Path, arrays: dict[str, Any]) -> None:
    """Leave `arrays` as `entry` (an .npz), or nothing: a type np.save cannot write without pickling, or a full disk,
    leaves the next stage to compute it."""
    handle, temporary = tempfile.mkstemp(dir=entry.parent, prefix=".writing-", suffix=".npz")
    try:
        with os.fdopen(handle, "wb") as file:
            np.savez(file, **arrays)
        os.replace(temporary, entry)
    except (OSError, ValueError):
        Path(temporary).unlink(missing_ok=True)


def _read(entry: Path) -> dict[str, Any] | None:
    """Every array an entry holds, or None if there is none or it cannot be read."""
    if not entry.is_file():
        return None
    try:
        with entry.open("rb") as file, np.load(file, allow_pickle=False) as held:  # the file closed if np.load fails
            return {name: held[name] for name in held.files}
    except (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile):
        return None
