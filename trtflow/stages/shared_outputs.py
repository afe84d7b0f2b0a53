"""The fp32 model's outputs over a precision stage's check feeds, computed once per run and read by the recipe's other
reduced precisions (fp16, int8 and fp8 check the same cleaned model on the same held-out feeds).

The model tools' worker servers of a run name a folder of their own in SHARED_OUTPUTS_ENV (executors.forking); a
stage that finds no entry there computes the outputs and leaves them, the next reads them. An entry is named by the
digest of all its outputs depend on (the model's files, each feed's arrays, ONNX Runtime's version, this format) and
is written whole, renamed into place, or not at all; an entry that cannot be read is computed again. Each output is
what the check's own run of the fp32 model gives (one single-threaded session per thread either way, the same
numbers): the records are the same with or without it. Without the folder (Ray, a stage run alone) a check runs the
fp32 model beside its candidate, as before, unless the caller needs the outputs anyway (a fallback search).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import zipfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from trtflow.stages.base import SHARED_OUTPUTS_ENV
from trtflow.util.versions import ort_version

FORMAT = 1


def fp32_outputs(model: Path, digests: Mapping[str, str], feeds: list[dict], needed: bool = False) -> list[dict] | None:
    """The fp32 outputs of `model` (files of `digests`) for each feed, from the run's shared folder or computed (and
    left there); None when the run has no shared folder and the caller does not need them (`needed`)."""
    folder = os.environ.get(SHARED_OUTPUTS_ENV)
    shared = Path(folder) if folder and Path(folder).is_dir() else None
    if shared is None and not needed:
        return None
    entry = shared / f"{entry_key(digests, feeds)}.npz" if shared is not None else None
    found = _read(entry, len(feeds)) if entry is not None and entry.is_file() else None
    if found is not None:
        return found
    outputs = _computed(model, feeds)
    if entry is not None:
        _write(entry, outputs)
    return outputs


def entry_key(digests: Mapping[str, str], feeds: list[dict]) -> str:
    """The digest that names an entry: the model's files, every feed's arrays (names, types, shapes, bytes), ONNX
    Runtime's version and the format."""
    hashed = hashlib.sha256(json.dumps([FORMAT, ort_version(), sorted(digests.items())]).encode())
    for feed in feeds:
        for name in sorted(feed):
            array = np.ascontiguousarray(feed[name])
            hashed.update(json.dumps([name, array.dtype.str, list(array.shape)]).encode())
            hashed.update(array.tobytes())
    return hashed.hexdigest()


def _computed(model: Path, feeds: list[dict]) -> list[dict]:
    from trtflow.stages import compare

    sizes = compare.model_bytes(model)
    return compare.run_spread(lambda: compare.session(model), feeds, compare.threads_for(sizes))[0]


def _write(entry: Path, outputs: list[dict]) -> None:
    """Leave `outputs` as `entry` (an .npz of each output's array and a list of their names), or nothing: a type
    np.save cannot write without pickling, or a full disk, leaves the next stage to compute them."""
    names = [list(output) for output in outputs]
    arrays = {f"o{i}_{j}": output[name] for i, output in enumerate(outputs) for j, name in enumerate(output)}
    handle, temporary = tempfile.mkstemp(dir=entry.parent, prefix=".writing-", suffix=".npz")
    try:
        with os.fdopen(handle, "wb") as file:
            np.savez(file, names=np.array(json.dumps(names)), **arrays)
        os.replace(temporary, entry)
    except (OSError, ValueError):
        Path(temporary).unlink(missing_ok=True)


def _read(entry: Path, count: int) -> list[dict] | None:
    """The outputs an entry holds, or None if it holds anything but `count` feeds' outputs."""
    try:
        with entry.open("rb") as file, np.load(file, allow_pickle=False) as held:  # the file closed if np.load fails
            names = json.loads(str(held["names"]))
            if len(names) != count:
                return None
            return [{name: held[f"o{i}_{j}"] for j, name in enumerate(output)} for i, output in enumerate(names)]
    except (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile):
        return None
