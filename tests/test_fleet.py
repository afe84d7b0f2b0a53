"""Acceptance on real architectures: the whole corpus, fp32/fp16/int8, for sm_75/sm_86/sm_89, in one run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import trtflow
from fleet import MODELS, expected_engines, write_fleet_project


@pytest.mark.slow
def test_the_real_model_fleet_builds_verifies_and_packages_every_engine(tmp_path: Path) -> None:
    root = write_fleet_project(tmp_path / "fleet")
    result = trtflow(root, "run", "-j", "2", "--json")
    failed = [(n["id"], n["reason"]) for n in json.loads(result.out)["nodes"] if n["status"] == "failed"] if result.out else result.err
    assert result.code == 0, failed
    for name in MODELS:
        manifest = json.loads((root / "artifacts" / "packages" / name / "manifest.json").read_text())
        assert manifest["complete"] and {(e["precision"], e["target"]) for e in manifest["engines"]} == expected_engines(name), name
        for engine in manifest["engines"]:
            checks = engine["verification"]
            assert checks["cleanup_equality"]["passed"] and checks["engine_checks"]["problems"] == [], (name, engine["file"])
            if engine["precision"] != "fp32":
                assert checks["precision_accuracy"]["passed"], (name, engine["file"], checks["precision_accuracy"])
