"""Reduced-precision models are reproducible: two clean builds of the real-model corpus in two folders (paths of
different lengths), started from shells with different PYTHONHASHSEED, give byte-identical precision models, and
`run --frozen` of the second project against the first's lock passes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import write_project

pytest.importorskip("torch")

from zoo import zoo_model  # noqa: E402  (imports torch)

# ModelOpt
CORPUS = {
    "resnet": ["fp32", "fp16", "int8"],
    "mobilenet": ["fp32", "fp16", "int8"],
    "lstm": ["fp32", "fp16"],
}
# quantizes no node of the LSTM (GEMV-shaped MatMuls): int8 of it fails by design


def _project(root: Path, zoo_dir: Path) -> Path:
    """fp32 + fp16 (+ int8) of each corpus model on one target, calibrated on the zoo's seeded batches."""
    recipes = {}
    for name in CORPUS:
        model = zoo_model(name, zoo_dir)
        recipes[name] = yaml.safe_dump(
            {
                "source": {"onnx": f"models/{name}.onnx"},
                "profiles": [model.recipe_profile()],
                "targets": ["rtx-ada"],
                "precisions": CORPUS[name],
                "calibration": {"data": f"calib/{name}/*"},
                "verify": {"on_fail": "warn"},  # bytes, not accuracy: int8 of the CNNs misses the default limits
            }
        )
    write_project(root, recipes)
    for name in CORPUS:
        model = zoo_model(name, zoo_dir)
        shutil.copyfile(model.path, root / "models" / f"{name}.onnx")
        model.calibration_batches(root / "calib" / name, count=6)
    return root


def _run(root: Path, seed: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONHASHSEED": seed}
    return subprocess.run(
        [sys.executable, "-m", "trtflow", "-C", str(root), "run", "-j", "2", *args],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )


def _precision_outputs(root: Path) -> dict[str, dict]:
    nodes = json.loads((root / "trtflow.lock").read_text())["nodes"]
    return {node_id: entry["outputs"] for node_id, entry in nodes.items() if node_id.startswith("precision:")}


@pytest.mark.slow  # about a minute: the corpus' fp16 and int8 models, twice
def test_two_clean_builds_in_two_folders_give_byte_identical_precision_models(tmp_path: Path, zoo_dir: Path) -> None:
    first = _project(tmp_path / "a", zoo_dir)
    second = _project(tmp_path / ("a-much-longer-folder-name-that-moves-every-allocation" * 2) / "project", zoo_dir)
    for root, seed in ((first, "1"), (second, "4242")):
        done = _run(root, seed)
        assert done.returncode == 0, done.stderr + done.stdout
    models, again = _precision_outputs(first), _precision_outputs(second)
    assert len(models) == sum(map(len, CORPUS.values())) and models == again
    shutil.copyfile(first / "trtflow.lock", second / "trtflow.lock")
    shutil.rmtree(second / "artifacts")
    shutil.rmtree(second / ".trtflow", ignore_errors=True)
    frozen = _run(second, "77", "--frozen")
    assert frozen.returncode == 0, frozen.stderr + frozen.stdout
