"""The store keeps objects immutable and its index JSON-only."""

from __future__ import annotations

import pickle
import sqlite3
from pathlib import Path

import pytest

from trtflow.hashing import sha256_file
from trtflow.store import Store, StoreCorrupt


def test_add_object_moves_file_under_its_digest_read_only(tmp_path: Path) -> None:
    store = Store.create(tmp_path / "store")
    source = store.tmp / "engine"
    source.write_bytes(b"engine bytes")
    digest = sha256_file(source)
    assert store.add_object(source) == digest
    path = store.object_path(digest)
    assert path.read_bytes() == b"engine bytes" and not source.exists() and (path.stat().st_mode & 0o222) == 0
    again = store.tmp / "same"
    again.write_bytes(b"engine bytes")
    assert store.add_object(again) == digest and not again.exists()
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".incoming")]


def test_record_with_missing_object_counts_as_absent(tmp_path: Path) -> None:
    store = Store.create(tmp_path / "store")
    source = store.tmp / "f"
    source.write_bytes(b"x")
    digest = store.add_object(source)
    store.put_stage_record("k", {"outputs": {"engine": digest}})
    assert store.stage_record("k") == {"outputs": {"engine": digest}}
    store.object_path(digest).unlink()
    assert store.stage_record("k") is None


def test_index_refuses_pickled_values(tmp_path: Path) -> None:
    """A shared cache must not be able to run code: a pickled row is an error, never unpickled."""
    store = Store.create(tmp_path / "store")
    store.put_stage_record("k", {"outputs": {}})
    store.close()
    with sqlite3.connect(tmp_path / "store" / "index" / "cache.db") as db:
        db.execute("UPDATE Cache SET value = ?, mode = 4 WHERE key = 'stage:k'", (pickle.dumps({"outputs": {}}),))
    with pytest.raises(StoreCorrupt):
        Store(tmp_path / "store").stage_record("k")


def test_index_refuses_non_text_values(tmp_path: Path) -> None:
    store = Store.create(tmp_path / "store")
    with pytest.raises(Exception, match="JSON text"):
        store._index.set("x", {"not": "text"})


def test_existing_does_not_create_a_store(tmp_path: Path) -> None:
    assert Store.existing(tmp_path / "nothing") is None
    assert not (tmp_path / "nothing").exists()
