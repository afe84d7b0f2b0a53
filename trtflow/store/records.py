"""Stage records: `records/<kk>/<key>.json`, one JSON file per stage key, written atomically and used only when its
key components hash back to its key; a malformed one is moved to corrupt/ and its stage built again."""

from __future__ import annotations

import json
import os
import re
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypedDict

from trtflow.errors import InternalError
from trtflow.hashing import stage_key
from trtflow.store.layout import StoreFolders
from trtflow.store.objects import DIGEST, ObjectFiles

__all__ = ["DIGEST", "NO_RECORD", "RECORD_MAX_BYTES", "RecordFiles", "StageRecord", "checked_record"]
from trtflow.util.fs import atomic_write, read_regular
from trtflow.util.jsondata import BoundExceeded, loads_bounded
from trtflow.util.reads import note_path

RECORD_MAX_BYTES = 16 << 20  # a stage record is a few KiB; anything near this is not one
NO_RECORD: Any = {}  # what checked_record returns beside a problem: no record


class RecordFiles:
    """The stage records of one store: `path`, `get` (only with every object it names intact), `put`, `all`,
    `delete`."""

    def __init__(self, folders: StoreFolders, objects: ObjectFiles):
        self.folders, self.objects = folders, objects
        self.folder = folders.root / "records"

    def path(self, key: str) -> Path:
        """Where a stage's record lives: records/<first two hex digits>/<key>.json (the key must be a digest)."""
        if not DIGEST.match(key):
            raise InternalError(f"a stage key must be a sha256 digest, got {key[:80]!r}")
        return self.folder / key[:2] / f"{key}.json"

    def get(self, key: str, components: dict | None = None) -> StageRecord | None:
        """The record of a finished stage, or None if unknown, malformed, or any of its output objects is gone or
        corrupt.

        `components`: what the caller hashed into `key`, if it did (a record holding the same is not hashed again).
        """
        record = self._read(self.path(key), key, components)
        if record is None or not all(self.objects.intact(d) for d in record["outputs"].values()):
            return None
        return record

    def put(self, key: str, record: StageRecord) -> StageRecord:
        """Write a record; call only once every object it names is in place (a crash then leaves orphans only).

        Returns the record as stored (keys sorted), so downstream stages see the same record whether it was
        built just now, read back later or pulled from a remote: a package's bytes must not depend on which.
        """
        text = json.dumps(record, sort_keys=True)
        path = self.path(key)
        with self.folders.writing("(writing a stage record)"):
            self.folders.made(f"records/{key[:2]}")
            atomic_write(path, text)
        stored: StageRecord = json.loads(text)
        return stored

    def all(self) -> Iterator[tuple[str, StageRecord]]:
        """Every well-formed (key, record) in the store, whether or not its objects are present."""
        for path in self.files():
            key = path.name.removesuffix(".json")
            record = self._read(path, key)
            if record is not None:
                yield key, record

    def delete(self, key: str) -> None:
        """Drop a stage's record; the objects it names stay until gc deletes them."""
        with self.folders.writing():
            self.path(key).unlink(missing_ok=True)

    def _read(self, path: Path, key: str, components: dict | None = None) -> StageRecord | None:
        """The record at `path` if it is well formed and hashes to `key`; a bad one is moved to corrupt/."""
        note_path(path)
        if not self.folders.real(f"records/{path.parent.name}"):
            return None
        try:
            text = read_regular(path, RECORD_MAX_BYTES + 1)
        except FileNotFoundError:
            return None
        except OSError as exc:  # a symlink, a folder, a FIFO: a record is a regular file or nothing
            self._set_aside(path, f"it is not a regular file ({exc.strerror or exc})")
            return None
        if len(text) > RECORD_MAX_BYTES:
            self._set_aside(path, f"it is over {RECORD_MAX_BYTES >> 20} MiB")
            return None
        record, problem = checked_record(text, key, components)
        if problem:
            self._set_aside(path, problem)
            return None
        return record

    def _set_aside(self, path: Path, problem: str) -> None:
        """Move a bad record to corrupt/ (its stage is built again) and say so once."""
        target = self.folders.root / "corrupt" / f"record-{path.name}.{time.time_ns()}"
        try:
            self.folders.made("corrupt")
            os.replace(path, target)
        except OSError:
            pass  # a read-only store: the record is still ignored
        self.folders.set_aside.append(path.name)
        self.folders.notes.append(
            f"the store's record {path.name} was malformed ({problem}); moved it to corrupt/, its stage is built again"
        )

    def files(self) -> Iterator[Path]:
        """records/<kk>/<key>.json regular files whose names are digests (temp files and strays are not records)."""
        for sub in self.folders.entries("records"):
            if re.fullmatch(r"[0-9a-f]{2}", sub.name) and self.folders.real(f"records/{sub.name}"):
                for path in sorted(sub.iterdir()):
                    key = path.name.removesuffix(".json")
                    if (
                        path.name.endswith(".json")
                        and DIGEST.match(key)
                        and key[:2] == sub.name
                        and stat.S_ISREG(path.lstat().st_mode)
                    ):
                        yield path


class _RecordKeys(TypedDict):
    key: str
    outputs: dict[str, str]  # output name -> object digest
    components: dict[str, Any]  # what was hashed into the key


class StageRecord(_RecordKeys, total=False):
    """A stage record as stored (records/<kk>/<key>.json; the runner writes it, plan, the lock and the remote read it).

    `key`, `outputs` and `components` are always there (checked_record refuses a record without them); a failure's
    record has no outputs of its own but says why in `failure`."""

    node: str  # the node id that made it
    record: dict[str, Any]  # what the stage itself returned (StageOutput.record)
    seconds: float
    peak_rss: int | None
    built_by: dict[str, Any]  # {"run": run id, "pid": ...}
    failure: dict[str, Any]  # {"reason": one line, "log": tail}: the stage's own failure, recorded under its key


def checked_record(text: bytes, key: str, known: dict | None = None) -> tuple[StageRecord, str]:
    """(record, "") if the record is well formed and hashes back to `key`, else ({}, what is wrong).

    `known`: components the caller already hashed to `key`; a record holding exactly those needs no hashing.
    """
    try:
        record = loads_bounded(text, RECORD_MAX_BYTES)
    except ValueError as exc:
        return NO_RECORD, str(exc) if isinstance(exc, BoundExceeded) else "it is not JSON"
    if not isinstance(record, dict) or record.get("key") != key:
        return NO_RECORD, "it names another key"
    outputs = record.get("outputs")
    if not isinstance(outputs, dict) or not all(isinstance(d, str) and DIGEST.match(d) for d in outputs.values()):
        return NO_RECORD, "its outputs are not sha256 digests"
    if not all(_safe_output_name(name) for name in outputs):
        return NO_RECORD, "an output's name is not a plain relative path"
    components = record.get("components")
    if not isinstance(components, dict) or (components != known and stage_key(components) != key):
        return NO_RECORD, "its key components do not hash to its key"
    checked: StageRecord = record  # type: ignore[assignment]  # its key, outputs and components are checked above
    return checked, ""


def _safe_output_name(name: str) -> bool:
    """An output's name is a relative path that stays where it is placed (a package's files are placed by theirs):
    no empty, `.` or `..` part, no absolute path, no backslash or NUL."""
    parts = name.split("/")
    return bool(name) and "\\" not in name and "\0" not in name and not any(part in ("", ".", "..") for part in parts)
