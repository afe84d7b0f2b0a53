"""A corrupt object is found, moved aside, rebuilt, and never packaged; run history for gc.

"Rot" flips a byte and puts the file's mtime back, as a failing disk does: the (size, mtime, inode)
signature stays the same, so only a re-hash finds it (`cache verify`, or packaging, which re-hashes
every engine it ships).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from conftest import record_for, trtflow

from trtflow.store import RUN_HISTORY, ObjectMismatch, Store

ENGINE_TARGET = "rtx-ada"


def flip_byte(path: Path, keep_mtime: bool) -> None:
    before = path.stat()
    path.chmod(0o644)
    with open(path, "r+b") as handle:
        handle.seek(before.st_size // 2)
        byte = handle.read(1)
        handle.seek(before.st_size // 2)
        handle.write(bytes([byte[0] ^ 0xFF]))
    path.chmod(0o444)
    if keep_mtime:
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


def stored(store: Store, data: bytes, name: str = "f") -> str:
    source = store.tmp / name
    source.write_bytes(data)
    return store.objects.add(source)


def test_an_object_changed_on_disk_is_quarantined_and_counts_as_missing(tmp_path: Path) -> None:
    store = Store.create(tmp_path / "store")
    digest = stored(store, b"engine bytes" * 100)
    key, record = record_for(digest)
    store.records.put(key, record)
    flip_byte(store.objects.path(digest), keep_mtime=False)
    assert store.records.get(key) is None
    assert store.quarantined == [digest] and not store.objects.path(digest).exists()
    assert [p.name.split(".")[0] for p in store.corrupt.iterdir()] == [digest]


def test_rot_that_keeps_the_signature_is_found_by_a_rehash(tmp_path: Path) -> None:
    store = Store.create(tmp_path / "store")
    digest = stored(store, b"engine bytes" * 100)
    flip_byte(store.objects.path(digest), keep_mtime=True)
    assert store.objects.intact(digest)  # the signature vouches for it: lookups stay cheap
    assert not store.objects.verify(digest) and not store.objects.has(digest)


def test_adding_good_bytes_replaces_a_corrupt_copy(tmp_path: Path) -> None:
    store = Store.create(tmp_path / "store")
    digest = stored(store, b"engine bytes" * 100)
    flip_byte(store.objects.path(digest), keep_mtime=False)
    assert stored(store, b"engine bytes" * 100, "again") == digest
    assert hashlib.sha256(store.objects.path(digest).read_bytes()).hexdigest() == digest


def test_bytes_that_are_not_the_expected_object_are_refused(tmp_path: Path) -> None:
    store = Store.create(tmp_path / "store")
    source = store.tmp / "download"
    source.write_bytes(b"tampered")
    with pytest.raises(ObjectMismatch):
        store.objects.add(source, expected="0" * 64)
    assert not source.exists() and list(store.objects.files()) == []


def test_run_history_skips_repeats_and_stays_bounded(tmp_path: Path) -> None:
    store = Store.create(tmp_path / "store")
    a, b, c = ("a" * 64, "b" * 64, "c" * 64)
    store.runs.record([a, b])
    store.runs.record([b, a])  # a no-op run repeats the last one: not a new entry
    store.runs.record([c])
    assert store.runs.recent(5) == [[c], [a, b]]
    keys = [f"{index:064x}" for index in range(RUN_HISTORY + 5)]
    for key in keys:
        store.runs.record([key])
    assert len(store.runs.recent(1000)) == RUN_HISTORY and store.runs.recent(1) == [[keys[-1]]]


# end to end ----------------------------------------------------------------------------------


@pytest.fixture
def project(built_project: Path) -> Path:
    return built_project


def engine(root: Path) -> tuple[str, Path]:
    manifest = json.loads((root / "artifacts/packages/tiny/manifest.json").read_text())
    digest = next(e["sha256"] for e in manifest["engines"] if e["target"] == ENGINE_TARGET)
    return digest, root / "artifacts/store/objects" / digest[:2] / digest


def run_json(root: Path) -> dict:
    result = trtflow(root, "run", "--json")
    assert result.code == 0, result.err
    return json.loads(result.out)


def built_ids(summary: dict) -> set[str]:
    return {node["id"] for node in summary["nodes"] if node["status"] == "built"}


def assert_package_intact(root: Path, digest: str) -> None:
    package = root / "artifacts/packages/tiny"
    for line in (package / "SHA256SUMS").read_text().splitlines():
        sha, name = line.split("  ")
        assert hashlib.sha256((package / name).read_bytes()).hexdigest() == sha
    shipped = package / f"engines/{ENGINE_TARGET}/tiny-fp32.engine"
    assert hashlib.sha256(shipped.read_bytes()).hexdigest() == digest


def test_verify_names_a_rotten_engine_and_the_next_run_rebuilds_it(project: Path) -> None:
    digest, path = engine(project)
    flip_byte(path, keep_mtime=True)
    result = trtflow(project, "cache", "verify")
    assert result.code == 1
    assert f"corrupt  {path}: used by build:tiny/fp32/{ENGINE_TARGET}" in result.out and "1 corrupt" in result.out
    assert built_ids(run_json(project)) == {f"build:tiny/fp32/{ENGINE_TARGET}"}
    assert path.is_file() and hashlib.sha256(path.read_bytes()).hexdigest() == digest
    assert_package_intact(project, digest)
    assert trtflow(project, "cache", "verify").code == 0


def test_rot_found_while_packaging_is_rebuilt_in_the_same_run(project: Path) -> None:
    """No verify ran: the package stage's re-hash finds the engine, which is rebuilt before packaging."""
    digest, path = engine(project)
    flip_byte(path, keep_mtime=True)
    package = json.loads((project / "trtflow.lock").read_text())["nodes"]["package:tiny"]["outputs"]["manifest.json"]
    (project / "artifacts/store/objects" / package[:2] / package).unlink()
    summary = run_json(project)
    assert {f"build:tiny/fp32/{ENGINE_TARGET}", "package:tiny"} <= built_ids(summary)
    assert any(digest in warning and "corrupt" in warning for warning in summary["warnings"])
    assert_package_intact(project, digest)


def test_an_object_rewritten_in_place_is_rebuilt_without_verify(project: Path) -> None:
    digest, path = engine(project)
    flip_byte(path, keep_mtime=False)
    summary = run_json(project)
    assert built_ids(summary) == {f"build:tiny/fp32/{ENGINE_TARGET}"}
    assert any("corrupt" in warning for warning in summary["warnings"])
    assert_package_intact(project, digest)
