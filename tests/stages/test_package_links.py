"""A placed package shares its bytes with the store: each file of its folder is its object and each engine its
build's object (hard links), so a project holds each engine once; an archive, only when the recipe asks for one, is
its own object; a placed file edited in place is caught by the store and rebuilt, never shipped."""

from __future__ import annotations

import base64
import json
import os
import tarfile
from pathlib import Path

from conftest import trtflow

from trtflow.store import Store


def _object(root: Path, digest: str) -> Path:
    store = Store(root / "artifacts" / "store")
    try:
        return store.objects.path(digest)
    finally:
        store.close()


def _package_outputs(root: Path) -> dict[str, str]:
    store = Store(root / "artifacts" / "store")
    try:
        return store.records.get(store.memos.last_run("package:tiny")["key"])["outputs"]
    finally:
        store.close()


def _subjects(root: Path) -> list[str]:
    envelope = json.loads((root / "artifacts" / "packages" / "tiny.intoto.jsonl").read_text())
    return [subject["name"] for subject in json.loads(base64.b64decode(envelope["payload"]))["subject"]]


def _engines(root: Path) -> list[tuple[Path, str]]:
    folder = root / "artifacts" / "packages" / "tiny"
    manifest = json.loads((folder / "manifest.json").read_text())
    return [(folder / engine["file"], engine["sha256"]) for engine in manifest["engines"]]


def test_each_placed_file_is_its_object_and_each_engine_its_builds(built: Path) -> None:
    folder = built / "artifacts" / "packages" / "tiny"
    outputs = _package_outputs(built)
    assert not (built / "artifacts" / "packages" / "tiny.tar.gz").exists(), "no archive unless the recipe asks"
    assert sorted(outputs) == sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    for name, digest in outputs.items():
        assert os.path.samefile(folder / name, _object(built, digest)), name
    engines = _engines(built)
    assert len(engines) == 2
    for path, sha256 in engines:
        assert os.path.samefile(path, _object(built, sha256)), path
        assert path.stat().st_mode & 0o222 == 0, "a placed engine is read-only, as its object is"
        assert path.stat().st_nlink == 2, "an engine is on disk once: its object and the package's link"


def test_an_archive_is_made_when_asked_and_removed_when_no_longer_asked(project: Path) -> None:
    recipe = project / "recipes" / "tiny.yaml"
    plain = recipe.read_text()
    recipe.write_text(plain + "package: {archive: true}\n")
    assert trtflow(project, "run").code == 0
    archive = project / "artifacts" / "packages" / "tiny.tar.gz"
    assert os.path.samefile(archive, _object(project, _package_outputs(project)["archive"]))
    with tarfile.open(archive) as packed:
        names = sorted(m.name for m in packed if m.isfile())
    folder = project / "artifacts" / "packages" / "tiny"
    assert names == sorted(f"tiny/{p.relative_to(folder).as_posix()}" for p in folder.rglob("*") if p.is_file())
    assert "tiny.tar.gz" in _subjects(project)
    recipe.write_text(plain)
    again = trtflow(project, "run")
    assert again.code == 0, again.err
    assert not archive.exists(), "the archive of an earlier package is not this one's"
    assert "restored" not in again.err, "an ordinary update is not a repair"
    assert "tiny.tar.gz" not in _subjects(project)
    assert "tiny/manifest.json" in _subjects(project)


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
