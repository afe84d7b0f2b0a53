"""Canonical JSON and stage keys are stable; file digests are re-read only when a file changes."""

from __future__ import annotations

import os
from pathlib import Path

from trtflow.hashing import FileDigests, canonical_json, sha256_file, stage_key


def test_canonical_json_is_order_independent_and_compact() -> None:
    assert canonical_json({"b": [1, 2.5], "a": {"y": None, "x": True}}) == '{"a":{"x":true,"y":null},"b":[1,2.5]}'


def test_stage_key_golden_value() -> None:
    """A changed key invalidates every user's cache: this must only change on purpose.

    The value is `printf %s
    '{"fingerprint":{},"inputs":{"model":"ab"},"kind":"build","params":{"precision":"fp32"},"version":1}' | sha256sum`.
    """
    components = {
        "kind": "build",
        "version": 1,
        "params": {"precision": "fp32"},
        "inputs": {"model": "ab"},
        "fingerprint": {},
    }
    assert stage_key(components) == "77e53236fd76267f13b91d949a618c4e6bf8f7c1082656458465ffb1c6f98a9d"
    assert stage_key({**components, "version": 2}) != stage_key(components)


def _age(path: Path, seconds: int = 60) -> None:
    """Move a file's mtime into the past, out of the racy window in which digests are not remembered."""
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns - seconds * 10**9))


def test_unchanged_file_is_not_read_again(tmp_path: Path) -> None:
    path = tmp_path / "model.onnx"
    path.write_bytes(b"x" * 1000)
    _age(path)
    memory: dict = {}
    first = FileDigests(memory)
    assert first.digest(path) == sha256_file(path) and first.hashed_bytes == 1000
    second = FileDigests(memory)
    assert second.digest(path) == sha256_file(path) and second.hashed_bytes == 0


def test_changed_file_is_read_again_even_with_same_size(tmp_path: Path) -> None:
    path = tmp_path / "model.onnx"
    path.write_bytes(b"a" * 10)
    _age(path, 120)
    digests = FileDigests({})
    before = digests.digest(path)
    path.write_bytes(b"b" * 10)
    _age(path, 60)
    assert digests.digest(path) != before and digests.hashed_bytes == 20


def test_freshly_written_file_is_not_remembered(tmp_path: Path) -> None:
    """Within the racy window a same-size rewrite could keep its mtime: never trust it."""
    path = tmp_path / "fresh"
    path.write_bytes(b"abc")
    memory: dict = {}
    FileDigests(memory).digest(path)
    assert memory == {}


def test_a_run_reads_a_fresh_file_once_however_often_it_plans(tmp_path: Path) -> None:
    """Within one run a just-exported model is hashed once (a run plans twice); a change within the run is still
    seen, and after the run the racy window applies again."""
    path = tmp_path / "model.onnx"
    path.write_bytes(b"a" * 100)
    digests = FileDigests({})
    with digests.for_one_run():
        first = digests.digest(path)
        assert digests.digest(path) == first and digests.hashed_bytes == 100
        path.write_bytes(b"b" * 101)
        assert digests.digest(path) != first and digests.hashed_bytes == 201
    digests.digest(path)
    assert digests.hashed_bytes == 302
