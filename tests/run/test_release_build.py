"""Acceptance for release builds on real models: a second project at another path, with a clean store, rebuilds from
the first one's lock with `--frozen` and gets the same packages (byte-identical, or equivalent where only the
backend's generated numbering differs, which the manifest and the run say)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from conftest import package_files, trtflow
from zoo import zoo_model

MODELS = {
    "resnet": ["fp32", "fp16", "int8"],
    "mobilenet": ["fp32", "fp16"],
    "efficientnet": ["fp32", "fp16"],
    "encoder": ["fp32", "fp16"],
    "lstm": ["fp32", "fp16"],
}
# Measured (benchmarks/repro.py, this test): hermetic rebuilds of the MobileNetV3-style model still differ in their
# numbering (a race between the builder's own threads), and so do int8 (Q/DQ) engines between checkouts; the fp32 and
# fp16 engines of the others came out byte-identical every time.
RACY = {"mobilenet"}
BYTE_REPRODUCIBLE = {"fp32", "fp16"}


def _project(root: Path, cache: Path) -> Path:
    (root / "recipes").mkdir(parents=True)
    (root / "models").mkdir()
    (root / "pipeline.yaml").write_text(
        yaml.safe_dump({"targets": {"rtx-ada": {"backend": "tensorrt-rtx", "compute_capabilities": ["sm_89"]}}})
    )
    for name, precisions in MODELS.items():
        model = zoo_model(name, cache)
        shutil.copyfile(model.path, root / "models" / f"{name}.onnx")
        model.calibration_batches(root / "calib" / name)
        recipe = {
            "source": {"onnx": f"models/{name}.onnx"},
            "precisions": precisions,
            "profiles": [model.recipe_profile()],
            "calibration": {"data": f"calib/{name}/*"},
        }
        (root / "recipes" / f"{name}.yaml").write_text(yaml.safe_dump(recipe))
    return root


def _engines(root: Path, name: str) -> dict[str, dict]:
    manifest = json.loads((root / "artifacts" / "packages" / name / "manifest.json").read_text())
    return {engine["precision"]: engine for engine in manifest["engines"]}


@pytest.mark.slow
def test_a_second_checkout_rebuilds_the_release_from_the_lock(tmp_path: Path) -> None:
    first = _project(tmp_path / "a", tmp_path / "zoo")
    assert trtflow(first, "run", "-j", "2").code == 0
    second = tmp_path / "a-second-checkout-at-a-longer-path"
    shutil.copytree(first, second, ignore=shutil.ignore_patterns("artifacts"))
    result = trtflow(second, "run", "-j", "2", "--frozen", "--json")
    assert result.code == 0, result.out + result.err
    said_equivalent = {
        n["id"] for n in json.loads(result.out)["nodes"] if (n["reason"] or "").startswith("equivalent to trtflow.lock")
    }
    for name, precisions in MODELS.items():
        before, after = _engines(first, name), _engines(second, name)
        for precision in precisions:
            a, b = before[precision], after[precision]
            assert a["canonical_sha256"] == b["canonical_sha256"] and a["reproducible"] == "equivalent", (
                name,
                precision,
            )
            assert (a["sha256"] != b["sha256"]) == (f"build:{name}/{precision}/rtx-ada" in said_equivalent), (
                name,
                precision,
            )
            if name not in RACY and precision in BYTE_REPRODUCIBLE:
                assert a["sha256"] == b["sha256"], f"{name} {precision}: hermetic rebuild not byte-identical"
        if name not in RACY and set(precisions) <= BYTE_REPRODUCIBLE:
            assert package_files(first, name) == package_files(second, name), name
