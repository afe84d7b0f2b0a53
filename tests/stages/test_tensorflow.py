"""TensorFlow and Keras sources: SavedModels and .keras files generated at test time with CPU TensorFlow, exported by
tf2onnx in the export stage, built by TensorRT-RTX into verified packages; and the inputs that must fail, one line each.

TensorFlow runs in its own processes (the generator script and the export stage's worker), never in pytest's.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import PIPELINE, stage_record, trtflow

pytestmark = pytest.mark.skipif(
    not (importlib.util.find_spec("tensorflow") and importlib.util.find_spec("tf2onnx")),
    reason="TensorFlow sources need tensorflow and tf2onnx: pip install 'trtflow[tensorflow]'",
)
GENERATOR = Path(__file__).resolve().parents[1] / "tfmodels.py"
IMAGE = "      image: {min: [1, 32, 32, 3], opt: [4, 32, 32, 3], max: [8, 32, 32, 3]}\n"
SEQUENCE = "      sequence: {min: [1, 50, 8], opt: [2, 50, 8], max: [4, 50, 8]}\n"


def generate(out: Path, *args: str) -> None:
    done = subprocess.run(
        [sys.executable, str(GENERATOR), str(out), *args], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.fixture(scope="module")
def tf_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tfmodels")
    generate(out)
    return out


def recipe(source: str, profile: str, precisions: str = "[fp32]") -> str:
    return f"source:\n  {source}\nprecisions: {precisions}\ntargets: [rtx-ada]\nprofiles:\n  - inputs:\n{profile}"


def project(root: Path, models: Path, recipes: dict[str, str]) -> Path:
    (root / "recipes").mkdir(parents=True)
    shutil.copytree(models, root / "models", symlinks=True)
    (root / "pipeline.yaml").write_text(PIPELINE)
    for name, text in recipes.items():
        (root / "recipes" / f"{name}.yaml").write_text(text)
    return root


def nodes(result) -> dict[str, tuple[str, str]]:
    return {n["id"]: (n["status"], n["reason"] or "") for n in json.loads(result.out)["nodes"]}


@pytest.mark.slow
def test_keras_cnn_and_lstm_savedmodels_build_fp32_and_fp16_into_verified_packages(
    tf_models: Path, tmp_path: Path
) -> None:
    root = project(
        tmp_path / "p",
        tf_models,
        {
            "cnn": recipe(
                "tensorflow: {saved_model: models/cnn, signature: serving_default, tag: serve}", IMAGE, "[fp32, fp16]"
            ),
            "lstm": recipe("tensorflow: {saved_model: models/lstm}", SEQUENCE, "[fp32, fp16]"),
            "cnn_keras": recipe("keras: models/cnn.keras", IMAGE),
            "cnn_h5": recipe("keras: models/cnn.h5", IMAGE),
            # the README's TF-TRT migration example: int8 calibrated on .npy batches, a workspace limit
            "cnn_int8": recipe("tensorflow: {saved_model: models/cnn}", IMAGE, "[int8]")
            + "calibration:\n  data: calib/*.npy\nbuild:\n  workspace_mib: 1024\n",
        },
    )
    rng = np.random.default_rng(0)
    (root / "calib").mkdir()
    for index in range(3):
        np.save(root / "calib" / f"b{index}.npy", rng.standard_normal((4, 32, 32, 3)).astype(np.float32))
    result = trtflow(root, "run", "-j", "2", "--json")
    assert result.code == 0, (
        [item for item in nodes(result).items() if item[1][0] == "failed"] if result.out else result.err
    )
    for name, precisions in (
        ("cnn", {"fp32", "fp16"}),
        ("lstm", {"fp32", "fp16"}),
        ("cnn_keras", {"fp32"}),
        ("cnn_h5", {"fp32"}),
        ("cnn_int8", {"int8"}),
    ):
        manifest = json.loads((root / "artifacts" / "packages" / name / "manifest.json").read_text())
        assert manifest["complete"] and {e["precision"] for e in manifest["engines"]} == precisions, name
        for engine in manifest["engines"]:
            checks = engine["verification"]
            assert checks["cleanup_equality"]["passed"] and checks["engine_checks"]["problems"] == [], (
                name,
                engine["file"],
            )
            assert engine["precision"] == "fp32" or checks["precision_accuracy"]["passed"], (
                name,
                checks["precision_accuracy"],
            )
        export = stage_record(root, f"export:{name}")
        assert export["tensorflow_equality"]["passed"] and export["tensorflow_equality"]["samples"] >= 1, export[
            "tensorflow_equality"
        ]
        assert export["exporter"].startswith("tf2onnx ") and export["dynamic"] == {
            export["inputs"][0]["name"]: {"0": [1, 8 if "cnn" in name else 4]}
        }
        assert all(
            e["calibration"]["source"] == "arrays" and not e["calibration"]["random"]
            for e in manifest["engines"]
            if e["precision"] == "int8"
        )
        # a stable name, not tf2onnx's counter
        assert export["inputs"][0]["shape"][0] == f"{export['inputs'][0]['name']}_dim0"
    cnn = stage_record(root, "export:cnn")
    assert [i["name"] for i in cnn["inputs"]] == ["image"] and [o["name"] for o in cnn["outputs"]] == ["output_0"]
    # Keras: the output layer's name
    assert [o["name"] for o in stage_record(root, "export:cnn_keras")["outputs"]] == ["logits"]
    assert any(n.startswith("LSTM") or n == "LSTM" for n in _op_types(root, "lstm")), (
        "the LSTM should stay an ONNX LSTM op"
    )

    keys_before = _lock_keys(root)
    # new weights: the SavedModel's variable files (and cnn.keras) change
    generate(root / "models", "--seed", "1", "--only", "cnn")
    plan = trtflow(root, "plan", "--explain")
    assert "export:cnn" in plan.out and "input saved_model/variables/variables.data-00000-of-00001 changed" in plan.out
    again = trtflow(root, "run", "--json")
    assert again.code == 0
    states = nodes(again)
    assert (states["export:cnn"][0], states["export:cnn_keras"][0], states["export:lstm"][0]) == (
        "built",
        "built",
        "cached",
    )
    keys = _lock_keys(root)  # export:cnn_int8 reads the same SavedModel with the same parameters: one new key for both
    assert keys["export:cnn_int8"] == keys["export:cnn"] != keys_before["export:cnn_int8"]
    assert stage_record(root, "export:cnn")["tensorflow_equality"]["passed"]


def _lock_keys(root: Path) -> dict[str, str]:
    return {node: entry["key"] for node, entry in json.loads((root / "trtflow.lock").read_text())["nodes"].items()}


def _op_types(root: Path, recipe_name: str) -> set[str]:
    import onnx

    lock = json.loads((root / "trtflow.lock").read_text())["nodes"][f"export:{recipe_name}"]
    digest = lock["outputs"]["model"]
    model = onnx.load(str(root / "artifacts" / "store" / "objects" / digest[:2] / digest), load_external_data=False)
    return {n.op_type for n in model.graph.node}


BAD_SOURCES = {  # recipe -> (its source and profile, the one line the export stage fails with)
    "no_signature": (
        recipe("tensorflow: {saved_model: models/cnn, signature: classify}", IMAGE),
        "source.tensorflow.signature: the SavedModel has no signature 'classify' (its signatures: serve, "
        "serving_default)",
    ),
    "no_tag": (
        recipe("tensorflow: {saved_model: models/cnn, tag: train}", IMAGE),
        "source.tensorflow.tag: the SavedModel has no MetaGraph tagged 'train' (its tags: serve)",
    ),
    "unconvertible": (
        recipe("tensorflow: {saved_model: models/lgamma}", "      x: {min: [1, 8], opt: [2, 8], max: [4, 8]}\n"),
        "source.tensorflow: tf2onnx cannot convert TensorFlow op(s) Lgamma to ONNX opset 17",
    ),
    "uncovered": (
        recipe(
            "tensorflow: {saved_model: models/cnn}",
            "      pixels: {min: [1, 32, 32, 3], opt: [4, 32, 32, 3], max: [8, 32, 32, 3]}\n",
        ),
        "profiles: signature serving_default has no input 'pixels' (its inputs: image)",
    ),
    "fixed_batch": (
        recipe("tensorflow: {saved_model: models/fixed}", IMAGE),
        "profiles: signature serving_default fixes axis 0 of 'image' to 1, but the profiles make it dynamic (1..8)",
    ),
    "wrong_rank": (
        recipe("keras: models/lstm.keras", "      sequence: {min: [1, 50], opt: [2, 50], max: [4, 50]}\n"),
        "profiles: input 'sequence' has rank 2 in the profiles but rank 3 in the Keras model (None, 50, 8)",
    ),
}


def test_bad_tensorflow_sources_fail_their_export_with_one_line_naming_the_field(
    tf_models: Path, tmp_path: Path
) -> None:
    root = project(tmp_path / "p", tf_models, {name: text for name, (text, _) in BAD_SOURCES.items()})
    result = trtflow(root, "run", "-j", "2", "--json")
    assert result.code == 1
    states = nodes(result)
    for name, (_, message) in BAD_SOURCES.items():
        status, reason = states[f"export:{name}"]
        assert status == "failed" and reason.startswith(message) and "\n" not in reason, (name, reason)


@pytest.mark.parametrize(
    "source, message",
    [
        (
            "tensorflow: {saved_model: models/nowhere}",
            "source.tensorflow.saved_model: no such directory: models/nowhere",
        ),
        (
            "tensorflow: {saved_model: models/cnn/variables}",
            "source.tensorflow.saved_model: models/cnn/variables is not a SavedModel directory (no saved_model.pb in "
            "it)",
        ),
        (
            "tensorflow: {saved_model: models/cnn.keras}",
            "source.tensorflow.saved_model: is a file, not a SavedModel directory: models/cnn.keras",
        ),
        ("keras: models/cnn", "source.keras: models/cnn is a directory, not a .keras or .h5 file"),
        ("keras: models/cnn/saved_model.pb", "source.keras: models/cnn/saved_model.pb is not a .keras or .h5 file"),
        (
            "keras: models/fake.keras",
            "source.keras: models/fake.keras is not a Keras 3 .keras archive (not a zip file)",
        ),
        ("tensorflow: {saved_model: models/cnn, opset: 19}", "source.tensorflow.opset: "),
        ("{onnx: models/a.onnx, keras: models/cnn.keras}", "source.keras: give one source, not onnx and keras"),
    ],
    ids=[
        "missing-dir",
        "not-a-savedmodel",
        "a-file",
        "keras-dir",
        "keras-suffix",
        "keras-not-zip",
        "opset-19",
        "two-sources",
    ],
)
def test_a_source_that_cannot_be_a_tensorflow_model_is_refused_before_anything_runs(
    tf_models: Path, tmp_path: Path, source: str, message: str
) -> None:
    root = project(
        tmp_path / "p",
        tf_models,
        {
            "m": recipe(source, IMAGE)
            if not source.startswith("{")
            else recipe(source, IMAGE).replace("source:\n  {", "source: {")
        },
    )
    (root / "models" / "fake.keras").write_text("not a zip")
    result = trtflow(root, "validate")
    assert result.code == 3 and result.err.count("\n") == 1, result.err
    assert result.err.startswith("error: recipes/m.yaml:") and message in result.err, result.err
    assert not (root / "artifacts").exists()


def test_a_corrupt_variables_file_is_one_line_naming_the_saved_model(tf_models: Path, tmp_path: Path) -> None:
    root = project(tmp_path / "p", tf_models, {"cnn": recipe("tensorflow: {saved_model: models/cnn}", IMAGE)})
    data = root / "models" / "cnn" / "variables" / "variables.data-00000-of-00001"
    corrupted = bytearray(data.read_bytes())
    corrupted[len(corrupted) // 2] ^= 0x10
    data.write_bytes(bytes(corrupted))
    result = trtflow(root, "run", "--json")
    status, reason = nodes(result)["export:cnn"]
    assert result.code == 1 and status == "failed" and "\n" not in reason
    assert reason.startswith("source.tensorflow.saved_model: TensorFlow cannot load it: DataLossError")
