"""The store keeps objects immutable, checks every record against its key, and survives a corrupt cache."""

from __future__ import annotations

import json
import os
import pickle
import sqlite3
from pathlib import Path

import pytest
from conftest import record_for

from trtflow.hashing import sha256_file
from trtflow.store import Store


def test_add_object_moves_file_under_its_digest_read_only(tmp_path: Path) -> None:
    store = Store.create(tmp_path / "store")
    source = store.tmp / "engine"
    source.write_bytes(b"engine bytes")
    digest = sha256_file(source)
    assert store.objects.add(source) == digest
    path = store.objects.path(digest)
    assert path.read_bytes() == b"engine bytes" and not source.exists() and (path.stat().st_mode & 0o222) == 0
    again = store.tmp / "same"
    again.write_bytes(b"engine bytes")
    assert store.objects.add(again) == digest and not again.exists()
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".incoming")]


def test_record_with_missing_object_counts_as_absent(tmp_path: Path) -> None:
    store = Store.create(tmp_path / "store")
    source = store.tmp / "f"
    source.write_bytes(b"x")
    digest = store.objects.add(source)
    key, record = record_for(digest)
    store.records.put(key, record)
    assert store.records.get(key) == record
    assert store.records.path(key) == tmp_path / "store" / "records" / key[:2] / f"{key}.json"
    store.objects.path(digest).unlink()
    assert store.records.get(key) is None


def test_records_are_files_checked_against_their_key(tmp_path: Path) -> None:
    """A record edited to name another object no longer hashes to its key: set aside, its stage rebuilt."""
    store = Store.create(tmp_path / "store")
    (store.tmp / "a").write_bytes(b"a")
    (store.tmp / "b").write_bytes(b"b")
    good, other = store.objects.add(store.tmp / "a"), store.objects.add(store.tmp / "b")
    key, record = record_for(good)
    store.records.put(key, record)
    record["components"]["inputs"] = {"model": other}
    store.records.path(key).write_text(json.dumps(record))
    assert store.records.get(key) is None
    assert not store.records.path(key).exists() and list(store.corrupt.glob("record-*"))
    assert any("malformed" in note and "do not hash to its key" in note for note in store.take_notes())


@pytest.mark.parametrize(
    "content",
    [b"", b"\x00\xff", b"[]", b'{"key": 1}', b"{" * 100_000],
    ids=["empty", "binary", "list", "no-outputs", "deep"],
)
def test_a_malformed_record_is_set_aside_never_a_traceback(tmp_path: Path, content: bytes) -> None:
    store = Store.create(tmp_path / "store")
    key, _ = record_for("0" * 64)
    path = store.records.path(key)
    path.parent.mkdir(parents=True)
    path.write_bytes(content)
    assert store.records.get(key) is None and list(store.records.all()) == []
    assert not path.exists()


def test_a_record_that_is_a_symlink_or_fifo_is_never_followed(tmp_path: Path) -> None:
    store = Store.create(tmp_path / "store")
    outside = tmp_path / "secret.txt"
    outside.write_text("secret")
    key, _ = record_for("1" * 64)
    path = store.records.path(key)
    path.parent.mkdir(parents=True)
    path.symlink_to(outside)
    assert store.records.get(key) is None
    assert outside.read_text() == "secret" and not path.is_symlink()
    os.mkfifo(path)
    assert store.records.get(key) is None  # would hang if the FIFO were opened for a blocking read


def test_a_corrupt_cache_is_started_anew_and_records_survive(tmp_path: Path) -> None:
    store = Store.create(tmp_path / "store")
    (store.tmp / "f").write_bytes(b"x")
    digest = store.objects.add(store.tmp / "f")
    key, record = record_for(digest)
    store.records.put(key, record)
    store.memos.set_last_run("build:m/fp32/t", {"key": key})
    store.close()
    cache = tmp_path / "store" / "cache.sqlite"
    data = bytearray(cache.read_bytes())
    data[:16] = b"not a database!!"
    cache.write_bytes(bytes(data))
    again = Store.create(tmp_path / "store")
    assert again.records.get(key) == record
    assert again.memos.last_run("build:m/fp32/t") is None
    notes = again.take_notes()
    assert len(notes) == 1 and "unreadable" in notes[0] and "started it anew" in notes[0]
    again.memos.set_last_run("build:m/fp32/t", {"key": key})
    assert again.memos.last_run("build:m/fp32/t") == {"key": key}


def test_hostile_cache_rows_are_absent_not_errors(tmp_path: Path) -> None:
    store = Store.create(tmp_path / "store")
    store.memos.set_last_run("x", {"key": "k"})
    store.close()
    with sqlite3.connect(tmp_path / "store" / "cache.sqlite") as db:
        db.execute("INSERT OR REPLACE INTO kv VALUES ('node:x', ?)", (pickle.dumps({"outputs": {}}),))
        db.execute("INSERT OR REPLACE INTO kv VALUES (?, '[1, 2]')", (f"stat:{tmp_path / 'model.onnx'}",))
    (tmp_path / "model.onnx").write_bytes(b"model")
    again = Store(tmp_path / "store")
    assert again.memos.last_run("x") is None
    assert again.memos.file_digests().digest(tmp_path / "model.onnx") == sha256_file(tmp_path / "model.onnx")


def test_an_old_diskcache_index_is_imported_without_following_its_file_names(tmp_path: Path) -> None:
    """The old index's `filename` column made diskcache read and delete any path; the import never looks at it."""
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    store_dir = tmp_path / "store"
    (store_dir / "index").mkdir(parents=True)
    (store_dir / "objects").mkdir()
    (store_dir / "tmp").mkdir()
    (store_dir / "tmp" / "f").write_bytes(b"x")
    digest = Store(store_dir).objects.add(store_dir / "tmp" / "f")
    key, record = record_for(digest)
    bad_key, _ = record_for(digest, "build:other/fp32/t")
    with sqlite3.connect(store_dir / "index" / "cache.db") as db:
        db.execute(
            "CREATE TABLE Cache (rowid INTEGER PRIMARY KEY, key BLOB, raw INTEGER, store_time REAL, expire_time REAL,"
            " access_time REAL, access_count INTEGER, tag BLOB, size INTEGER, mode INTEGER, filename TEXT, value BLOB)"
        )
        db.execute(
            "INSERT INTO Cache (key, raw, mode, filename, value) VALUES (?, 1, 1, NULL, ?)",
            (f"stage:{key}", json.dumps(record)),
        )
        db.execute(
            "INSERT INTO Cache (key, raw, mode, filename, value) VALUES (?, 1, 3, ?, NULL)",
            (f"stage:{bad_key}", str(victim)),
        )
    planning = Store.existing(store_dir)  # plan sees the old records too
    assert planning is not None and planning.take_notes() == [
        "imported 1 stage record(s) from the store's old index/ into records/ and removed it"
    ]
    store = Store.create(store_dir)
    assert store.records.get(key) == record and store.records.get(bad_key) is None
    assert victim.read_text() == "keep me" and not (store_dir / "index").exists() and store.take_notes() == []


def test_run_history_keeps_the_last_runs_and_ignores_strays(tmp_path: Path) -> None:
    store = Store.create(tmp_path / "store")
    keys = [record_for("0" * 64, f"build:m{i}/fp32/t")[0] for i in range(3)]
    store.runs.record(keys[:1])
    store.runs.record(keys[:1])
    store.runs.record(keys[1:])
    (store.runs.folder / "nonsense.json").write_text("[1]")
    (store.runs.folder / "1-1.json").write_text("not json")
    assert store.runs.recent(5) == [sorted(keys[1:]), keys[:1], []]


def test_existing_does_not_create_a_store(tmp_path: Path) -> None:
    assert Store.existing(tmp_path / "nothing") is None
    assert not (tmp_path / "nothing").exists()
