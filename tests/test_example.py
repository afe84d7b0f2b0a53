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
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted((root / "artifacts" / "packages").glob("*.tar.gz"))}


def test_two_fresh_clones_build_byte_identical_packages(tmp_path: Path) -> None:
    first, second = _fresh_clone(tmp_path / "one"), _fresh_clone(tmp_path / "two")
    for clone in (first, second):
        result = trtflow_process(clone, "run", "-j", "2")
        assert result.returncode == 0, result.stderr
    lock_changed = subprocess.run(["git", "-C", str(first), "diff", "--stat", "trtflow.lock"], capture_output=True, text=True).stdout
    assert lock_changed == "", f"the committed trtflow.lock is stale (regenerate it with `trtflow run`): {lock_changed}"
    digests = _package_digests(first)
    assert sorted(digests) == ["seq_lstm.tar.gz", "tiny_cnn.tar.gz"]
    assert digests == _package_digests(second)


def test_schemas_are_json_and_the_recipe_name_is_optional() -> None:
    for what in ("manifest", "recipe", "pipeline"):
        result = trtflow(REPO, "schema", what)
        assert result.code == 0
        schema = json.loads(result.out)
        assert schema["type"] == "object" and schema["properties"]
    assert "name" not in json.loads(trtflow(REPO, "schema", "recipe").out)["required"]
