"""The content-addressed store: immutable objects on disk plus a JSON-only index.

Layout under the store root:
    objects/<aa>/<sha256>   artifact bytes, named by their digest, read-only, written atomically
    index/                  diskcache: stage key -> outputs + record; node id -> last run; stat cache
    tmp/                    work directories of running stages (same filesystem, so renames are atomic)

Index values are JSON text only. diskcache would otherwise pickle values, and a cache directory shared
between CI runners must not be able to run code in whoever reads it.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator, MutableMapping, Optional

import diskcache

from trtflow.errors import InternalError, TrtflowError
from trtflow.hashing import FileDigests, sha256_file


class StoreCorrupt(TrtflowError):
    """The store holds something it must never hold (a pickled index entry)."""


class JsonOnlyDisk(diskcache.Disk):
    """A diskcache Disk that stores text only and refuses to unpickle anything it finds."""

    def store(self, value: Any, read: bool, key: Any = diskcache.core.UNKNOWN) -> Any:
        if not isinstance(value, str):
            raise InternalError(f"store index values must be JSON text, got {type(value).__name__}")
        return super().store(value, read, key=key)

    def fetch(self, mode: int, filename: Any, value: Any, read: bool) -> Any:
        if mode == diskcache.core.MODE_PICKLE:
            raise StoreCorrupt("the store index holds a pickled value; refusing to load it (delete the store's index/ folder)")
        return super().fetch(mode, filename, value, read)

    def get(self, key: Any, raw: bool) -> Any:
        if not raw:
            raise StoreCorrupt("the store index holds a pickled key; refusing to load it (delete the store's index/ folder)")
        return super().get(key, raw)


class _IndexView(MutableMapping[str, Any]):
    """One prefix of the index as a mapping of JSON values (used as FileDigests' memory)."""

    def __init__(self, cache: diskcache.Cache, prefix: str):
        self._cache, self._prefix = cache, prefix

    def __getitem__(self, name: str) -> Any:
        text = self._cache.get(self._prefix + name)
        if text is None:
            raise KeyError(name)
        return json.loads(text)

    def __setitem__(self, name: str, value: Any) -> None:
        self._cache.set(self._prefix + name, json.dumps(value))

    def __delitem__(self, name: str) -> None:
        del self._cache[self._prefix + name]

    def __iter__(self) -> Iterator[str]:
        raise InternalError("the index is not iterated through a view")

    def __len__(self) -> int:
        raise InternalError("the index is not counted through a view")


class Store:
    """Objects + index of one project. Open with `Store.create` (run) or `Store.existing` (plan, inspect)."""

    def __init__(self, root: Path):
        self.root = root
        self.objects = root / "objects"
        self.tmp = root / "tmp"
        self._index = diskcache.Cache(str(root / "index"), disk=JsonOnlyDisk)

    @classmethod
    def create(cls, root: Path) -> "Store":
        for sub in ("objects", "tmp", "index"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        return cls(root)

    @classmethod
    def existing(cls, root: Path) -> Optional["Store"]:
        """The store if one was ever created at `root`, else None (planning must not create one)."""
        return cls(root) if (root / "index").is_dir() else None

    def close(self) -> None:
        self._index.close()

    # objects -------------------------------------------------------------------------------
    def object_path(self, digest: str) -> Path:
        return self.objects / digest[:2] / digest

    def has_object(self, digest: str) -> bool:
        return self.object_path(digest).is_file()

    def add_object(self, source: Path) -> str:
        """Move a finished file into the store under its digest; the move is atomic and durable."""
        digest = sha256_file(source)
        final = self.object_path(digest)
        if final.is_file():
            source.unlink()
            return digest
        final.parent.mkdir(parents=True, exist_ok=True)
        staged = Path(tempfile.mkstemp(dir=final.parent, prefix=".incoming-")[1])
        try:
            shutil.move(str(source), staged)
            _fsync_file(staged)
            os.chmod(staged, 0o444)
            os.replace(staged, final)
        finally:
            staged.unlink(missing_ok=True)
        _fsync_dir(final.parent)
        return digest

    # index ---------------------------------------------------------------------------------
    def _get_json(self, key: str) -> Optional[Any]:
        text = self._index.get(key)
        return None if text is None else json.loads(text)

    def _set_json(self, key: str, value: Any) -> None:
        self._index.set(key, json.dumps(value, sort_keys=True))

    def stage_record(self, key: str) -> Optional[dict]:
        """The record of a finished stage, or None if unknown or any of its output objects is gone."""
        record = self._get_json("stage:" + key)
        if record is None or not all(self.has_object(d) for d in record["outputs"].values()):
            return None
        return record

    def put_stage_record(self, key: str, record: dict) -> None:
        self._set_json("stage:" + key, record)

    def last_run(self, node_id: str) -> Optional[dict]:
        """What the node resolved to the last time it ran or was found cached (for `plan --explain`)."""
        return self._get_json("node:" + node_id)

    def set_last_run(self, node_id: str, value: dict) -> None:
        if self.last_run(node_id) != value:
            self._set_json("node:" + node_id, value)

    def file_digests(self) -> FileDigests:
        return FileDigests(_IndexView(self._index, "stat:"))



def _fsync_file(path: Path) -> None:
    with open(path, "rb+") as handle:
        os.fsync(handle.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
