"""Per-architecture limits of TensorRT-RTX, checked against the real graph before any work; `exclude:` drops pairs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import onnx
import pytest
import yaml
from conftest import PIPELINE, trtflow
from zoo import zoo_model

from trtflow.backends.limits import unsupported_nodes

TURING_PIPELINE = PIPELINE + "  rtx-turing:\n    backend: tensorrt-rtx\n    compute_capabilities: [sm_75]\n"


def _project(root: Path, zoo_dir: Path, name: str, **recipe: object) -> Path:
    """A project with one zoo model as an ONNX source, its suggested profile, and a Turing target."""
    model = zoo_model(name, zoo_dir)
    (root / "recipes").mkdir(parents=True)
    (root / "models").mkdir()
    shutil.copyfile(model.path, root / "models" / f"{name}.onnx")
    (root / "pipeline.yaml").write_text(TURING_PIPELINE)
    body = {"source": {"onnx": f"models/{name}.onnx"}, **recipe, "profiles": [model.recipe_profile()]}
    (root / "recipes" / f"{name}.yaml").write_text(yaml.safe_dump(body, sort_keys=False))
    return root


@pytest.mark.parametrize(
    "name, node",
    [("resnet", "node_linear"), ("lstm", "node_LSTM"), ("encoder", "node_MatMul"), ("legacy_ir3", "Gemm(fc_1)")],
)
def test_fp32_gemms_are_found_for_turing_only(zoo_dir: Path, name: str, node: str) -> None:
    model = onnx.load(str(zoo_model(name, zoo_dir).path))
    found = unsupported_nodes("tensorrt-rtx", "sm_75", model)
    assert list(found) == ["FP32 GEMM is not supported on Turing (sm_75)"]
    assert any(n.startswith(node) for n in found["FP32 GEMM is not supported on Turing (sm_75)"])
    assert unsupported_nodes("tensorrt-rtx", "sm_86", model) == {} == unsupported_nodes("tensorrt", "sm_75", model)


def test_validate_names_the_recipe_precision_target_and_nodes_before_any_work(tmp_path: Path, zoo_dir: Path) -> None:
    root = _project(tmp_path / "p", zoo_dir, "resnet", precisions=["fp32"], targets=["rtx-turing", "rtx-ada"])
    for command in ("validate", "run"):
        result = trtflow(root, command)
        assert result.code == 3, result.err
        assert result.err == (
            "error: recipes/resnet.yaml:4: precisions[0]: fp32 cannot build for target rtx-turing (sm_75) with "
            "tensorrt-rtx: FP32 GEMM is not supported on Turing (sm_75): node_linear (build fp16 for it, or "
            "exclude the pair); to drop it: exclude: [{precision: fp32, target: rtx-turing}]\n"
        )
    assert not (root / "artifacts").exists()


def test_an_excluded_pair_is_not_built_and_the_rest_is(tmp_path: Path, zoo_dir: Path) -> None:
    root = _project(
        tmp_path / "p",
        zoo_dir,
        "resnet",
        precisions=["fp32", "fp16"],
        targets=["rtx-turing", "rtx-ada"],
        exclude=[{"precision": "fp32", "target": "rtx-turing"}],
        verify={"on_fail": "warn"},  # fp16's top-1 on seeded random inputs flips a near-tied row
    )
    result = trtflow(root, "run", "-j", "2", "--json")
    assert result.code == 0, result.err
    manifest = json.loads((root / "artifacts" / "packages" / "resnet" / "manifest.json").read_text())
    assert sorted((e["precision"], e["target"]) for e in manifest["engines"]) == [
        ("fp16", "rtx-ada"),
        ("fp16", "rtx-turing"),
        ("fp32", "rtx-ada"),
    ]


def test_an_exclude_entry_that_matches_nothing_is_refused(tmp_path: Path, zoo_dir: Path) -> None:
    root = _project(
        tmp_path / "p",
        zoo_dir,
        "classifier",
        precisions=["fp32"],
        targets=["rtx-ada"],
        exclude=[{"precision": "fp16", "target": "rtx-ada"}],
    )
    result = trtflow(root, "validate")
    assert result.code == 3
    assert (
        result.err.startswith("error: recipes/classifier.yaml:")
        and "exclude[0]: matches nothing this recipe builds" in result.err
    )
