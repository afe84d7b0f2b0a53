"""The remembered no-op (trtflow/run/runmemo.py): answered without loading the project, and never when anything it read
changed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TINY_RECIPE, settle, trtflow

from trtflow.run import runmemo


def remembered_project(built_project: Path) -> Path:
    """A built project whose no-op is remembered: settled, then one no-op that writes the memo."""
    settle()
    result = trtflow(built_project, "run", "--json")
    assert result.code == 0 and json.loads(result.out)["built"] == 0
    assert runmemo.memo_path(built_project).is_file()
    return built_project


def run_process(root: Path, *args: str) -> tuple[dict, str]:
    """(--json summary, the trtflow modules imported) of `python -X importtime -m trtflow run --json` in `root`."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "trtflow", "-C", str(root), "run", "--json", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout), done.stderr


def built_ids(summary: dict) -> set[str]:
    return {node["id"] for node in summary["nodes"] if node["status"] == "built"}


def test_a_remembered_no_op_answers_without_loading_the_project_and_writes_nothing(built_project: Path) -> None:
    root = remembered_project(built_project)
    full = json.loads(trtflow(root, "run", "--json", "-j", "2").out)
    before = {p: p.stat().st_mtime_ns for p in root.rglob("*")}
    summary, imports = run_process(root)
    assert "trtflow.run.dag" not in imports and "pydantic" not in imports  # no recipe was parsed, no key computed
    assert summary["nodes"] == full["nodes"] and summary["built"] == 0 and summary["cached"] == 7
    assert {p: p.stat().st_mtime_ns for p in root.rglob("*")} == before
    assert (root / ".trtflow" / ".gitignore").read_text().splitlines()[-1] == "*"  # never committed by accident


def _edit_profile(root: Path) -> set[str]:
    recipe = root / "recipes" / "tiny.yaml"
    recipe.write_text(recipe.read_text().replace("max: [8, 3, 32, 32]", "max: [16, 3, 32, 32]"))
    return {f"{kind}:tiny/fp32/{target}" for kind in ("build", "verify") for target in ("rtx-ampere", "rtx-ada")}


def _add_recipe(root: Path) -> set[str]:
    (root / "recipes" / "second.yaml").write_text(TINY_RECIPE)
    return {"package:second"}  # its other stages are the same content as tiny's: cached


def _delete_engine_object(root: Path) -> set[str]:
    engine = json.loads((root / "artifacts/packages/tiny/manifest.json").read_text())["engines"][0]
    obj = root / "artifacts/store/objects" / engine["sha256"][:2] / engine["sha256"]
    obj.chmod(0o644)
    obj.unlink()
    return {f"build:tiny/fp32/{engine['target']}"}


def _edit_package_file(root: Path) -> set[str]:
    (root / "artifacts/packages/tiny/manifest.json").write_text("{}")
    return set()  # nothing to build: the folder is restored from the store


def _delete_lock(root: Path) -> set[str]:
    (root / "trtflow.lock").unlink()
    return set()


@pytest.mark.parametrize(
    "change",
    [_edit_profile, _add_recipe, _delete_engine_object, _edit_package_file, _delete_lock],
    ids=lambda f: f.__name__.strip("_"),
)
def test_any_change_to_what_the_no_op_read_is_seen(built_project: Path, change) -> None:
    root = remembered_project(built_project)
    lock, manifest = (root / "trtflow.lock").read_bytes(), (root / "artifacts/packages/tiny/manifest.json").read_bytes()
    expected = change(root)
    summary, imports = run_process(root)
    assert "trtflow.run.dag" in imports  # planned in full
    assert expected <= built_ids(summary) and summary["failed"] == 0
    if change in (_edit_package_file, _delete_lock):
        assert (root / "artifacts/packages/tiny/manifest.json").read_bytes() == manifest
        assert (root / "trtflow.lock").read_bytes() == lock


def test_a_copied_project_never_answers_from_the_original_s_memo(built_project: Path, tmp_path: Path) -> None:
    """The memo names the files of the folder that wrote it: a copy (its .trtflow/ too) whose recipe is then edited
    must see its own edit, not the untouched original."""
    root = remembered_project(built_project)
    copy = Path(shutil.copytree(root, tmp_path / "copy", symlinks=True))
    expected = _edit_profile(copy)
    summary, imports = run_process(copy)
    assert "trtflow.run.dag" in imports and expected <= built_ids(summary)


def test_a_signing_key_in_the_environment_is_a_change(built_project: Path, tmp_path: Path) -> None:
    root = remembered_project(built_project)
    provenance = root / "artifacts/packages/tiny.intoto.jsonl"
    unsigned = provenance.read_bytes()
    assert trtflow(root, "keygen", str(tmp_path / "ci")).code == 0
    done = subprocess.run(
        [sys.executable, "-m", "trtflow", "-C", str(root), "run", "--json"],
        capture_output=True,
        text=True,
        env={**os.environ, "TRTFLOW_SIGNING_KEY_FILE": str(tmp_path / "ci.key")},
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert provenance.read_bytes() != unsigned and json.loads(provenance.read_bytes())["signatures"]


def test_a_run_that_builds_forgets_the_memo_and_a_racy_no_op_writes_none(built_project: Path) -> None:
    root = remembered_project(built_project)
    _edit_profile(root)
    assert trtflow(root, "run").code == 0
    assert not runmemo.memo_path(root).exists()
    assert trtflow(root, "run").code == 0  # right after the build: its outputs are too new to be trusted
    assert not runmemo.memo_path(root).exists()


@pytest.mark.parametrize(
    "memo",
    [
        b"",
        b"{",
        b"[]",
        b'{"format": 1, "nodes": "x"}',
        b'{"format": 1, "nodes": [1], "paths": [], "globs": {}, "versions": {}, "fingerprint": null}',
    ],
)
def test_a_damaged_memo_is_a_normal_run(built_project: Path, memo: bytes) -> None:
    root = remembered_project(built_project)
    runmemo.memo_path(root).write_bytes(memo)
    summary, imports = run_process(root)
    assert "trtflow.run.dag" in imports and summary["cached"] == 7


def test_selected_forced_or_frozen_runs_never_use_the_memo(built_project: Path) -> None:
    root = remembered_project(built_project)
    for args in (("tiny",), ("--frozen",), ("--dry-run",)):
        _, imports = run_process(root, *args)
        assert "trtflow.run.dag" in imports, args
    shutil.rmtree(root / ".trtflow")
    _, imports = run_process(root)
    assert "trtflow.run.dag" in imports
