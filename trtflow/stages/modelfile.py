"""How a stage hands an ONNX model to the next: `model.onnx`, plus `model.onnx.data` for external weights.

A model's weights may live beside its graph (`save_as_external_data`), and must above 2 GiB (protobuf's
limit). In the store both files are objects: outputs `model` and `model.data`. The runner places them
side by side under these names before a stage reads them, so ONNX, ONNX Runtime and TensorRT's parser
find the weights by the graph's relative `location`.

A model with external data is never read whole: `load_graph` reads the graph and the small tensors, leaves
every large external tensor where it is (a reference with a location no file has), and `save_model` copies
those bytes from the source files into `model.onnx.data` in chunks. A 2.5 GB model is then held in memory by
no graph pass at all, only by the runtimes that execute it.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO

from trtflow.util.fs import link_or_copy

MODEL, MODEL_DATA = "model", "model.data"
FILE_NAMES = {MODEL: "model.onnx", MODEL_DATA: "model.onnx.data"}
# Above this many bytes of weights a model is written with external data (protobuf refuses 2 GiB).
EXTERNAL_DATA_THRESHOLD = 1 << 30
# External tensors below this size are read into the graph: shape arithmetic and folding need their values.
INLINE_BELOW = 1 << 16
# In-memory tensors from this size on go to model.onnx.data when a model is written with external data (as onnx does).
EXTERNAL_FROM = 1024
ALIGNMENT = 4096  # offsets in model.onnx.data, so runtimes can map tensors page by page
UNLOADED = "trtflow-unloaded:"  # location prefix of a tensor left in its source file; no such file exists
CHUNK = 16 << 20


@dataclass(frozen=True)
class ExternalBytes:
    """Where the bytes of one unloaded tensor are: a range of a source file."""

    file: Path
    offset: int
    length: int


def save_model(
    onnx: Any, model: Any, workdir: Path, external: bool = False, unloaded: dict[str, ExternalBytes] | None = None
) -> tuple[dict[str, Path], bytes | None]:
    """Write `model.onnx` (and `model.onnx.data` when `external`, the weights are large, or tensors were left
    unloaded). The files, and the bytes of `model.onnx` when it holds every weight (what the ONNX checker reads
    without serializing the model again: 0.1 s for a ResNet-18), else None."""
    path = workdir / FILE_NAMES[MODEL]
    if not (external or unloaded or weight_bytes(model) > EXTERNAL_DATA_THRESHOLD):
        serialized = model.SerializeToString()  # what onnx.save_model writes
        path.write_bytes(serialized)
        return {MODEL: path}, serialized
    data = workdir / FILE_NAMES[MODEL_DATA]
    with open(data, "wb") as out:
        for tensor in all_tensors(model):
            _externalize(onnx, tensor, out, unloaded or {})
    onnx.save_model(model, path)
    return {MODEL: path, MODEL_DATA: data}, None


def _externalize(onnx: Any, tensor: Any, out: BinaryIO, unloaded: dict[str, ExternalBytes]) -> None:
    """Append one tensor's bytes to model.onnx.data (copied from its source file if unloaded) and point the tensor
    there."""
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        source = unloaded[external_info(tensor)["location"]]
        offset = _pad(out)
        _copy_range(source, out)
        length = source.length
    elif len(tensor.raw_data) >= EXTERNAL_FROM:
        offset, length = _pad(out), len(tensor.raw_data)
        out.write(tensor.raw_data)
        tensor.ClearField("raw_data")
    else:
        return
    _point_at(onnx, tensor, FILE_NAMES[MODEL_DATA], offset, length)


def load_graph(onnx: Any, path: Path) -> tuple[Any, dict[str, ExternalBytes]]:
    """The model with its large external tensors unloaded, and where their bytes are (for save_model)."""
    model = onnx.load(str(path), load_external_data=False)
    unloaded: dict[str, ExternalBytes] = {}
    for tensor in all_tensors(model):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        source = _external_bytes(path, tensor)
        if source.length < INLINE_BELOW:
            with open(source.file, "rb") as handle:
                handle.seek(source.offset)
                tensor.raw_data = handle.read(source.length)
            tensor.data_location = onnx.TensorProto.DEFAULT
            del tensor.external_data[:]
        else:
            location = f"{UNLOADED}{len(unloaded)}"
            unloaded[location] = source
            _point_at(onnx, tensor, location, 0, source.length)
    return model, unloaded


def external_data_locations(path: Path) -> list[str]:
    """The external data files an ONNX graph names, relative to its folder (no weights are read).

    A file that does not parse names none: checking the model is modelcheck's job, and it says why.
    Raises ValueError for a location outside the model's folder.
    """
    if not _may_name_external_data(path):
        return []
    import onnx

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception:
        return []
    return external_locations(model, path)


def _may_name_external_data(path: Path) -> bool:
    """Whether the file holds the bytes `location`, which every external data reference spells out (its required
    key). Without them the graph is not parsed: planning a run of a project whose sources are new skips importing
    onnx (0.3 s) and parsing each model (in the run's own process, where nothing else runs meanwhile)."""
    overlap = len(LOCATION_KEY) - 1
    with open(path, "rb") as handle:
        tail = b""
        while chunk := handle.read(SCAN_CHUNK):
            if LOCATION_KEY in chunk or LOCATION_KEY in tail + chunk[:overlap]:
                return True
            tail = chunk[-overlap:]
    return False


LOCATION_KEY = b"location"
SCAN_CHUNK = 1 << 20


def external_locations(model: Any, path: Path) -> list[str]:
    """The external data locations of a loaded graph; ValueError for one outside the folder of `path`."""
    locations = sorted({external_info(t)["location"] for t in all_tensors(model) if t.external_data})
    for location in locations:
        _inside(path, location)
    return locations


def _external_bytes(path: Path, tensor: Any) -> ExternalBytes:
    info = external_info(tensor)
    file = _inside(path, info["location"])
    offset = int(info.get("offset") or 0)
    length = int(info["length"]) if info.get("length") else file.stat().st_size - offset
    if offset + length > file.stat().st_size:
        raise ValueError(f"tensor {tensor.name!r} reaches past the end of {info['location']}")
    return ExternalBytes(file, offset, length)


def _inside(model_path: Path, location: str) -> Path:
    """The file at `location` relative to the model's folder, refusing absolute paths and `..` (as onnx does)."""
    relative = PurePosixPath(location)
    if not location or relative.is_absolute() or ".." in relative.parts or "\\" in location:
        raise ValueError(f"external data location {location!r} is not a file beside the model")
    return model_path.parent / relative


def external_info(tensor: Any) -> dict[str, str]:
    """A tensor's external_data entries as a dict of strings: location, and offset and length where given."""
    return {entry.key: entry.value for entry in tensor.external_data}


def _point_at(onnx: Any, tensor: Any, location: str, offset: int, length: int) -> None:
    tensor.data_location = onnx.TensorProto.EXTERNAL
    del tensor.external_data[:]
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value


def _pad(out: BinaryIO) -> int:
    position = out.tell()
    padding = -position % ALIGNMENT
    out.write(b"\0" * padding)
    return position + padding


def _copy_range(source: ExternalBytes, out: BinaryIO) -> None:
    """Copy in chunks: a multi-GB tensor never sits in memory whole."""
    with open(source.file, "rb") as handle:
        handle.seek(source.offset)
        left = source.length
        while left:
            chunk = handle.read(min(CHUNK, left))
            if not chunk:
                raise ValueError(f"{source.file.name} ended {left} bytes early")
            out.write(chunk)
            left -= len(chunk)


def all_tensors(model: Any) -> Iterator[Any]:
    """Every TensorProto of a model: initializers and node attributes, in subgraphs too."""
    yield from _graph_tensors(model.graph)


def _graph_tensors(graph: Any) -> Iterator[Any]:
    yield from graph.initializer
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.HasField("t"):
                yield attribute.t
            yield from attribute.tensors
            for sub in ([attribute.g] if attribute.HasField("g") else []) + list(attribute.graphs):
                yield from _graph_tensors(sub)


def canonical_order(model: Any) -> Any:
    """Sort what a tool may list in hash or set order (value_info, metadata_props), in subgraphs too; node order is
    left alone (it is topological and meaningful). AutoCast listed an LSTM's `*_cast_to_fp32` value_info entries in
    another order in each process, so the same model came out as different bytes."""
    _sort_by_name(model.metadata_props, key=lambda entry: entry.key)
    for graph in graphs_of(model.graph):
        _sort_by_name(graph.value_info, key=lambda value: value.name)
    return model


def _sort_by_name(repeated: Any, key: Any) -> None:
    ordered = sorted(repeated, key=key)
    if [key(item) for item in ordered] != [key(item) for item in repeated]:
        copies = [type(item)() for item in ordered]
        for copy, item in zip(copies, ordered, strict=True):
            copy.CopyFrom(item)
        del repeated[:]
        repeated.extend(copies)


def graphs_of(graph: Any) -> Iterator[Any]:
    """A graph and every subgraph of its nodes' attributes (If/Loop/Scan bodies)."""
    yield graph
    for node in graph.node:
        for attribute in node.attribute:
            for sub in ([attribute.g] if attribute.HasField("g") else []) + list(attribute.graphs):
                yield from graphs_of(sub)


def weight_bytes(model: Any) -> int:
    """Bytes of initializer data held in the graph itself (external tensors count 0)."""
    return sum(len(t.raw_data) for t in model.graph.initializer)


def place_side_by_side(
    files: dict[str, Path], output: str, folder: Path, copy: tuple[str, ...] = ()
) -> dict[str, Path]:
    """Hard-link an output and its companions (a model's external data) into one folder under the names the graph
    expects; a link costs nothing for a multi-GB model (the store is one filesystem), a copy is the fallback.

    `copy`: names to copy even so, for a tool that writes into its input (a link would let it rewrite the store's
    object in place, under the feet of every other stage reading it).
    """
    folder.mkdir(parents=True, exist_ok=True)
    placed = {}
    for name in (output, *companions(files, output)):
        placed[name] = folder / FILE_NAMES.get(name, name)
        (shutil.copyfile if name in copy else link_or_copy)(files[name], placed[name])
    return placed


def companions(outputs: dict[str, Any], output: str) -> dict[str, Any]:
    """The outputs that travel with `output` (its external data), keyed by output name."""
    return {name: value for name, value in outputs.items() if name.startswith(output + ".")}
