"""One failed engine does not drop the package: the rest is packed, the manifest says what is missing and why."""

from __future__ import annotations

import json
import re
from pathlib import Path

from conftest import PIPELINE, trtflow, write_project

MLP = '''\
"""A classifier whose layers are Gemms: TensorRT-RTX cannot compile its fp32 GEMMs for Turing (sm_75)."""
from torch import nn


def make():
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
'''
RECIPE = """\
source:
  torch: {factory: "models.mlp:make", inputs: [{name: features}], outputs: [logits]}
targets: [rtx-turing, rtx-ada]
profiles:
  - inputs:
      features: {min: [1, 16], opt: [4, 16], max: [8, 16]}
"""
TURING = PIPELINE + "  rtx-turing:\n    backend: tensorrt-rtx\n    compute_capabilities: [sm_75]\n"


def test_a_failed_engine_leaves_an_incomplete_package_that_says_why(tmp_path: Path) -> None:
    root = write_project(tmp_path / "p", {"mlp": RECIPE}, pipeline=TURING)
    (root / "models" / "mlp.py").write_text(MLP)
    result = trtflow(root, "run", "--json")
    assert result.code == 1  # a stage failed: the run says so, and still packs what built
    states = {n["id"]: n["status"] for n in json.loads(result.out)["nodes"]}
    assert states["build:mlp/fp32/rtx-turing"] == "failed" and states["verify:mlp/fp32/rtx-turing"] == "skipped"
    assert states["package:mlp"] == "built"
    manifest = json.loads((root / "artifacts" / "packages" / "mlp" / "manifest.json").read_text())
    assert manifest["complete"] is False and [e["target"] for e in manifest["engines"]] == ["rtx-ada"]
    [missing] = manifest["missing"]
    assert (missing["precision"], missing["target"], missing["stage"]) == (
        "fp32",
        "rtx-turing",
        "build:mlp/fp32/rtx-turing",
    )
    assert missing["reason"].startswith(
        "fp32 cannot build for sm_75 with tensorrt-rtx: FP32 GEMM is not supported on Turing (sm_75): "
    )

    shown = trtflow(root, "inspect", str(root / "artifacts" / "packages" / "mlp"))
    assert (
        "INCOMPLETE: 1 engine(s) of the recipe failed" in shown.out
        and "missing fp32/rtx-turing: build:mlp/fp32/rtx-turing" in shown.out
    )
    dest = tmp_path / "engines"
    chosen = trtflow(
        root, "provision", str(root / "artifacts" / "packages" / "mlp"), "--gpu", "sm_89", "--dest", str(dest)
    )
    assert chosen.code == 0 and "INCOMPLETE" in chosen.out
    refused = trtflow(
        root, "provision", str(root / "artifacts" / "packages" / "mlp"), "--gpu", "sm_75", "--dest", str(dest)
    )
    assert refused.code == 5

    again = trtflow(root, "run")  # the failure is recorded: reported, not redone, the same package
    assert again.code == 1 and "built" not in again.err
    assert re.search(
        r"^failed \(cached\) build:mlp/fp32/rtx-turing: fp32 cannot build for sm_75 with tensorrt-rtx: FP32 GEMM",
        again.err,
        re.M,
    )
    assert "drop the pair with exclude: [{precision: fp32, target: rtx-turing}]" in again.err
