"""The repository's own example project, as a newcomer runs it: from fresh clones, reproducibly."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import REPO, trtflow, trtflow_process


def _fresh_clone(destination: Path) -> Path:
    """A clone of the committed repository (what CI and a newcomer get), not this working tree."""
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("needs a git checkout of the repository")
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(destination)], check=True)
    return destination


def _package_digests(root: Path) -> dict[str, str]:
    """Every file of the packages folder but the report, by path: the folders, tiny_cnn's archive, the provenance."""
    packages = root / "artifacts" / "packages"
    return {
        p.relative_to(packages).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(packages.rglob("*"))
        if p.is_file()
    }


def _lock_drift(clone: Path) -> list[str]:
    """What differs between the committed lock and the one a run wrote: a changed key means the lock is stale
    (regenerate it with `trtflow run`); the same key with other outputs means this machine builds or measures
    differently from the one that wrote the lock (a reproducibility bug)."""
    committed = json.loads(
        subprocess.run(
            ["git", "-C", str(clone), "show", "HEAD:trtflow.lock"], capture_output=True, text=True, check=True
        ).stdout
    )
    fresh = json.loads((clone / "trtflow.lock").read_text())
    drift = [
        f"{node}: {'not in the committed lock' if node not in committed['nodes'] else 'key changed (stale lock)'}"
        for node, entry in fresh["nodes"].items()
        if committed["nodes"].get(node, {}).get("key") != entry["key"]
    ]
    drift += [
        f"{node}: same key, other outputs "
        f"{sorted(k for k in entry['outputs'] if entry['outputs'][k] != committed['nodes'][node]['outputs'].get(k))}"
        for node, entry in fresh["nodes"].items()
        if committed["nodes"].get(node, {}).get("key") == entry["key"]
        and committed["nodes"][node]["outputs"] != entry["outputs"]
    ]
    drift += [f"{node}: no longer built" for node in committed["nodes"] if node not in fresh["nodes"]]
    if not drift and committed != fresh:
        drift.append("the lock's other fields differ")
    return drift


def test_two_fresh_clones_build_byte_identical_packages(tmp_path: Path) -> None:
    first, second = _fresh_clone(tmp_path / "one"), _fresh_clone(tmp_path / "two")
    for clone in (first, second):
        result = trtflow_process(clone, "run", "-j", "2")
        assert result.returncode == 0, result.stderr
    assert _lock_drift(first) == [], "the fresh build disagrees with the committed trtflow.lock"
    digests = _package_digests(first)
    assert {name.split("/")[0] for name in digests} == {
        "seq_lstm",
        "seq_lstm.intoto.jsonl",
        "tiny_cnn",
        "tiny_cnn.intoto.jsonl",
        "tiny_cnn.tar.gz",
    }
    assert digests == _package_digests(second)


def test_schemas_are_json_and_the_recipe_name_is_optional() -> None:
    for what in ("manifest", "recipe", "pipeline"):
        result = trtflow(REPO, "schema", what)
        assert result.code == 0
        schema = json.loads(result.out)
        assert schema["type"] == "object" and schema["properties"]
    assert "name" not in json.loads(trtflow(REPO, "schema", "recipe").out)["required"]


def test_the_committed_lock_holds_no_unset_field() -> None:
    """A default is never in a key: the precision keys held `"max_abs_error": null` and every other unset limit."""
    lock = json.loads((REPO / "trtflow.lock").read_text())
    unset = [node for node, entry in lock["nodes"].items() if "null" in json.dumps(entry["params"])]
    assert unset == []
