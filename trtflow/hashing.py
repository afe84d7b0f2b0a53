"""Canonical JSON, file digests with a stat cache, and stage keys.

A stage key is the sha256 of the canonical JSON of everything that determines a stage's output:

    >>> stage_key({"kind": "build", "version": 1, "params": {"cc": ["sm_86"]},
    ...            "inputs": {"model": "ab12..."}, "fingerprint": {"backend": "tensorrt-rtx 1.7.1.116"}})
    'sha256 of {"fingerprint":{...},"inputs":{...},"kind":"build","params":{...},"version":1}'

Paths never enter a key, only the digests of what they point to, so moving a project keeps its cache.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from collections.abc import Callable, Iterator, MutableMapping
from pathlib import Path
from typing import Any, BinaryIO

from trtflow.util.reads import note_path

CHUNK = 1 << 20
# A file modified within this window of being hashed may change again within the same mtime tick,
# so its signature is not remembered (git calls this the "racy clean" problem).
RACY_WINDOW_NS = 2_000_000_000


def canonical_json(value: Any) -> str:
    """JSON with sorted keys and no whitespace: equal values always give equal text."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def sha256_text(text: str) -> str:
    """Hex sha256 of a string's UTF-8 bytes."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def stage_key(components: dict[str, Any]) -> str:
    """The key of a stage: sha256 of the canonical JSON of its components (kind, version, params, inputs,
    fingerprint)."""
    return sha256_text(canonical_json(components))


def sha256_file(path: Path) -> str:
    """sha256 of a file's bytes, read in 1 MiB chunks (constant memory for multi-GB models)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def sha256_handle(handle: BinaryIO) -> str:
    """sha256 of what is left to read of an open binary file (opened no-follow by the caller, see util.fs)."""
    digest = hashlib.sha256()
    for chunk in iter(lambda: handle.read(CHUNK), b""):
        digest.update(chunk)
    return digest.hexdigest()


def file_signature(stat: os.stat_result) -> list[int]:
    """What must stay equal for a remembered digest to be trusted (as git's index and DVC do)."""
    return [stat.st_size, stat.st_mtime_ns, stat.st_ino]


class FileDigests:
    """sha256 of files, re-reading a file only when its (size, mtime_ns, inode) changed.

    `memory` is any mutable mapping of absolute path -> {"sig": [...], "sha256": "..."}; the store
    provides a persistent one so an unchanged multi-GB model is not re-read on every run.
    """

    def __init__(self, memory: MutableMapping[str, Any] | None = None):
        self._memory: MutableMapping[str, Any] = memory if memory is not None else {}
        self.hashed_bytes = 0
        # within one run (`for_one_run`): every digest, a just-written file's too (the run's plans see one snapshot)
        self._this_run: dict[str, Any] | None = None

    @contextlib.contextmanager
    def for_one_run(self) -> Iterator[None]:
        """Within the block, a file hashed once is not hashed again while its signature holds, even one modified
        within the racy window: a run plans twice (before and after taking its lease) and must not read a freshly
        exported multi-GB model twice. Outside it, the racy window applies."""
        self._this_run = {}
        try:
            yield
        finally:
            self._this_run = None

    def _remembered(self, path: Path, signature: list[int]) -> dict | None:
        for memory in (self._this_run or {}, self._memory):
            entry = memory.get(str(path))
            if entry and entry.get("sig") == signature:
                return dict(entry)  # the persistent memory may hand out its own rows: never edited here
        return None

    def digest(self, path: Path) -> str:
        """sha256 of a file, remembered while its signature holds (never for a file modified within RACY_WINDOW_NS,
        except within `for_one_run`)."""
        path = Path(os.path.abspath(path))
        note_path(path)
        stat = path.stat()
        signature = file_signature(stat)
        remembered = self._remembered(path, signature)
        if remembered:
            return str(remembered["sha256"])
        digest = sha256_file(path)
        self.hashed_bytes += stat.st_size
        if file_signature(path.stat()) == signature:  # unchanged while read
            self._remember(path, {"sig": signature, "sha256": digest}, stat.st_mtime_ns)
        return digest

    def vouch(self, path: Path, digest: str) -> None:
        """Remember `digest` for the file at `path` without reading it: a hard link to (or a copy of) an intact
        store object named `digest`, just made by trtflow. Remembered as a digest read here is."""
        path = Path(os.path.abspath(path))
        stat = path.stat()
        self._remember(path, {"sig": file_signature(stat), "sha256": digest}, stat.st_mtime_ns)

    def _remember(self, path: Path, entry: dict, mtime_ns: int) -> None:
        if self._this_run is not None:
            self._this_run[str(path)] = entry
        if time.time_ns() - mtime_ns > RACY_WINDOW_NS:
            self._memory[str(path)] = entry

    def digest_with_companions(self, path: Path, companions_of: Callable[[Path], list[str]]) -> dict[str, str]:
        """Digests of a file and of the files it refers to (an ONNX graph's external data), by name relative to its
        folder.

        `companions_of` parses the file, so its answer is remembered beside the file's digest (it depends
        on the content alone) and an unchanged model is not parsed again:

            {"": <sha256 of model.onnx>, "weights.bin": <sha256 of weights.bin>}
        """
        path = Path(os.path.abspath(path))
        main = self.digest(path)
        memories = [m for m in (self._this_run, self._memory) if m is not None]
        entries = [m.get(str(path)) or {} for m in memories]
        names = next((e["companions"] for e in entries if e.get("sha256") == main and "companions" in e), None)
        if names is None:
            names = companions_of(path)
            for memory, entry in zip(memories, entries, strict=True):
                if entry.get("sha256") == main:
                    memory[str(path)] = {**entry, "companions": names}
        return {"": main, **{name: self.digest(path.parent / name) for name in names}}

    def adopt(self, other: FileDigests) -> None:
        """Remember what another (in-memory) instance learned, so nothing is hashed twice in a run; within its
        `for_one_run`, share that run's digests from now on (a file just written or copied included)."""
        if isinstance(other._memory, dict):
            for path, entry in other._memory.items():
                self._memory[path] = entry
        if other._this_run is not None:
            self._this_run = other._this_run
