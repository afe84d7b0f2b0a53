"""Acceptance on real architectures: the whole corpus, fp32/fp16/int8, for sm_75/sm_86/sm_89, in one run, then
deployed."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from conftest import trtflow
from fleet import MODELS, TARGETS, expected_engines, write_fleet_project
from test_deploy import check_context_model


@pytest.mark.slow
def test_the_real_model_fleet_builds_verifies_and_packages_every_engine(tmp_path: Path) -> None:
    root = write_fleet_project(tmp_path / "fleet")
    result = trtflow(root, "run", "-j", "2", "--json")
    failed = (
        [(n["id"], n["reason"]) for n in json.loads(result.out)["nodes"] if n["status"] == "failed"]
        if result.out
        else result.err
    )
    assert result.code == 0, failed
    for name in MODELS:
        manifest = json.loads((root / "artifacts" / "packages" / name / "manifest.json").read_text())
        assert manifest["complete"] and {
            (e["precision"], e["target"]) for e in manifest["engines"]
        } == expected_engines(name), name
        for engine in manifest["engines"]:
            checks = engine["verification"]
            assert checks["cleanup_equality"]["passed"] and checks["engine_checks"]["problems"] == [], (
                name,
                engine["file"],
            )
            if engine["precision"] != "fp32":
                assert checks["precision_accuracy"]["passed"], (name, engine["file"], checks["precision_accuracy"])
    deploy_every_package(root, tmp_path / "deploy")


def deploy_every_package(root: Path, work: Path) -> None:
    """The corpus through the deploy path: each package published, provisioned from its URL per GPU generation (only
    the manifest and the chosen engine fetched), and exported as EP-context models carrying each engine and its I/O."""
    for name in MODELS:
        package = root / "artifacts" / "packages" / name
        url = (work / "share" / name).as_uri()
        assert trtflow(root, "publish", str(package), url).code == 0
        manifest = json.loads((package / "manifest.json").read_text())
        for gpu in TARGETS.values():
            result = trtflow(root, "provision", url, "--gpu", gpu, "--dest", str(work / "fleet" / gpu), "--json")
            assert result.code == 0, (name, gpu, result.err)
            record = json.loads(result.out)
            chosen = record["chosen"]["manifest_entry"]
            # issue 29: the channel file comes first
            channel = record["transfer"]["files"].get("channels/stable.json", 0)
            assert (
                record["transfer"]["bytes"] == (package / "manifest.json").stat().st_size + chosen["size"] + channel
            ), (name, gpu)
        exported = trtflow(root, "export", "ort-context", str(package), "--dest", str(work / "ctx" / name), "--json")
        assert exported.code == 0, (name, exported.err)
        for item, engine in zip(json.loads(exported.out), manifest["engines"], strict=True):
            carried = check_context_model(Path(item["model"]), engine, "NvTensorRTRTXExecutionProvider")
            assert hashlib.sha256(carried).hexdigest() == engine["sha256"], (name, item["model"])
