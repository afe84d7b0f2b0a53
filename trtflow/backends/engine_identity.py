"""Engine identity beyond bytes: a canonical digest of a TensorRT-RTX engine that abstracts exactly what varies
between builds of identical inputs, and nothing else. The engine itself is never rewritten.

What varies (measured on ~600 engines of the real-model corpus, TensorRT-RTX 1.7.1): only the embedded Myelin
graph text, the length fields that depend on its length, and the padding after it. Inside the text: the generated
symbol numbers (`__mye3107` vs `__mye3155`), other builder-wide name counters (`getitem_3.1_59`,
`__myln_k_arg__bb1_60`, `__cma_mul3519_54`), the offsets of shape constants in `shape_system_hmem`, and the order
of lines and of `shape_inputs`/`shape_outputs` items (kept in symbol-number order). After the text, the kernel
table names the same symbols (seen differing in those numbers alone in fp16 MobileNetV3-style engines). The engine
header and the weights section never differed.

The canonical form keeps every other byte exact: the file header and engine head (with the six length/offset
fields zeroed), the text with those tokens masked and its lines sorted, the kernel table and cubins with symbol
numbers masked, the weights.
Tested to tell apart a one-ulp weight change, another profile, another compute capability and another precision.

Layout (TensorRT-RTX 1.7): `vtrt` file header (u64 total size @0x10, section table (tag, u64 offset, u64 size) of
`NGNE` (engine) @0x40 and `THGW` (weights) @0x58); the engine section starts `ptrt`, u32, u64 inner size; a u64
Myelin blob size, then `NLYM`, u32, u32 text length, u32, the text, then the kernels. An engine of another layout
has no canonical digest (None): it is held to its bytes.
"""

from __future__ import annotations

import hashlib
import mmap
import re
import struct
from pathlib import Path

# recorded beside each digest; bump it and stages.build.VERSION together
CANONICAL_FORM = "tensorrt-rtx-1 myelin-text-v2"
_SYMBOL = re.compile(rb"__mye\d+")
_COUNTER_SUFFIX = re.compile(rb"(\.\d+)_\d+\b")
_KERNEL_ARG = re.compile(rb"(__myln_k_arg__bb\d+_|__cma_[A-Za-z]+\d+_)\d+")
_OFFSET = re.compile(rb"offset=\d+")
_QUOTED = re.compile(rb"\"[^\"]*\"")
_HEADER_LENGTHS = (0x10, 0x50, 0x60)  # total size, engine section size, weights section offset
CHUNK = 1 << 20


def canonical_digest(path: Path) -> str | None:
    """sha256 of the engine's canonical form, or None when its layout is not one this form knows."""
    with open(path, "rb") as handle:
        try:
            data = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:  # an empty file
            return None
        with data:
            parts = _layout(data)
            if parts is None:
                return None
            return _digest(data, parts)


def _layout(data: mmap.mmap) -> dict | None:
    """Offsets of the parts, or None if this is not the layout described above."""
    if len(data) < 0x70 or data[0:4] != b"vtrt" or data[0x40:0x44] != b"NGNE" or data[0x58:0x5C] != b"THGW":
        return None
    engine, engine_size = struct.unpack_from("<QQ", data, 0x48)
    weights, weights_size = struct.unpack_from("<QQ", data, 0x60)
    marker = data.find(b"NLYM", engine, engine + engine_size)
    if marker < 0 or weights + weights_size > len(data):
        return None
    text_length = struct.unpack_from("<I", data, marker + 8)[0]
    text = marker + 16
    if text + text_length > engine + engine_size:
        return None
    return {
        "engine": engine,
        "engine_end": engine + engine_size,
        "marker": marker,
        "text": text,
        "text_end": text + text_length,
        "weights": weights,
        "weights_end": weights + weights_size,
    }


def _digest(data: mmap.mmap, at: dict) -> str:
    """Hash the parts in order, with the varying fields masked; the weights are streamed, never copied whole."""
    digest = hashlib.sha256()
    header = bytearray(data[:0x70])
    for offset in _HEADER_LENGTHS:
        header[offset : offset + 8] = bytes(8)
    digest.update(header)
    digest.update(data[at["engine"] : at["engine"] + 8])  # `ptrt`, u32: the inner size after them varies
    digest.update(data[at["engine"] + 16 : at["marker"] - 8])  # the engine head up to the Myelin blob size
    digest.update(data[at["marker"] : at["marker"] + 8])  # `NLYM`, u32: the text length after them varies
    digest.update(canonical_text(bytes(data[at["text"] : at["text_end"]])))
    # kernel table: names the symbols too
    digest.update(_SYMBOL.sub(b"__mye#", data[at["text_end"] : at["engine_end"]]))
    for start in range(at["weights"], at["weights_end"], CHUNK):
        digest.update(data[start : min(start + CHUNK, at["weights_end"])])
    digest.update(data[at["weights_end"] :])
    return digest.hexdigest()


def canonical_text(text: bytes) -> bytes:
    """The Myelin graph text with generated numbers and offsets masked, list items and lines sorted."""
    return b"\n".join(sorted(_canonical_line(line) for line in text.split(b"\n")))


def _canonical_line(line: bytes) -> bytes:
    line = _KERNEL_ARG.sub(rb"\1#", _COUNTER_SUFFIX.sub(rb"\1_#", _SYMBOL.sub(b"__mye#", line)))
    if b'region="shape_system_hmem"' in line:
        line = _OFFSET.sub(b"offset=#", line)
    if line.startswith((b"  shape_outputs=", b"  shape_inputs=")):
        line = line.split(b"=", 1)[0] + b"={ " + b" ".join(sorted(_QUOTED.findall(line))) + b" }"
    return line
