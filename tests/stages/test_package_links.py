"""A placed package shares its bytes with the store: the archive is the package object and each engine of its folder
is its build's object (hard links), so a project holds each engine twice, not four times; a placed file edited in
place is caught by the store and rebuilt, never shipped."""

from __future__ import annotations

import json
import os
from pathlib import Path

from conftest import trtflow

from trtflow.store import Store


def _object(root: Path, digest: str) -> Path:
    store = Store(root / "artifacts" / "store")
    try:
        return store.objects.path(digest)
    finally:
        store.close()


def _package_object(root: Path) -> Path:
    store = Store(root / "artifacts" / "store")
    try:
        return store.objects.path(store.records.get(store.memos.last_run("package:tiny")["key"])["outputs"]["package"])
    finally:
        store.close()


def _engines(root: Path) -> list[tuple[Path, str]]:
    folder = root / "artifacts" / "packages" / "tiny"
    manifest = json.loads((folder / "manifest.json").read_text())
    return [(folder / engine["file"], engine["sha256"]) for engine in manifest["engines"]]


def test_the_placed_archive_and_engines_are_the_stores_objects(built: Path) -> None:
    archive = built / "artifacts" / "packages" / "tiny.tar.gz"
    assert os.path.samefile(archive, _package_object(built))
    engines = _engines(built)
    assert len(engines) == 2
    for path, sha256 in engines:
        assert os.path.samefile(path, _object(built, sha256)), path
        assert path.stat().st_mode & 0o222 == 0, "a placed engine is read-only, as its object is"


def test_an_engine_edited_in_place_is_rebuilt_and_the_package_restored(project: Path) -> None:
    assert trtflow(project, "run").code == 0
    path, sha256 = _engines(project)[0]
    assert os.path.samefile(path, _object(project, sha256))
    path.chmod(0o644)
    with open(path, "r+b") as handle:  # in place: the same inode, so the store's object changes too
        handle.seek(-1, os.SEEK_END)
        handle.write(b"\x01")
    again = trtflow(project, "run", "--json")
    assert again.code == 0, again.err
    rebuilt = {n["id"]: n["status"] for n in json.loads(again.out)["nodes"]}
    assert "built" in {status for node, status in rebuilt.items() if node.startswith("build:tiny/")}
    for placed, digest in _engines(project):
        assert os.path.samefile(placed, _object(project, digest))
    corrupt = list((project / "artifacts" / "store" / "corrupt").iterdir())
    assert corrupt and corrupt[0].name.startswith(sha256)
