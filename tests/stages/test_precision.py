"""Precision: validation before any work, real ModelOpt conversions on the CPU, accuracy gates, real TensorRT-RTX
builds,
and the acceptance run of the CLI (fp32 + fp16 + int8 on two targets, incremental on calibration data)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import PIPELINE, PROFILE_YAML, example_models, trtflow, write_project
from refusals import assert_refused, recipe

from trtflow.backends.base import BuildRequest, get_backend
from trtflow.calibration import rank
from trtflow.errors import StageError
from trtflow.recipe import load_project
from trtflow.run.dag import dag_from_project
from trtflow.stages import precision as precision_stage
from trtflow.stages.base import Upstream

CALIBRATION = "calibration:\n  data: calib/*.npz\n"  # line 13 onwards of test_bad_input.recipe()


def _calibration_files(root: Path, count: int, shapes: dict[str, tuple], seed: int = 0, stem: str = "batch") -> None:
    (root / "calib").mkdir(exist_ok=True)
    for index, batch in enumerate(example_models().calibration_batches(np.random.default_rng(seed), count, shapes)):
        np.savez(root / "calib" / f"{stem}_{index:02d}.npz", **batch)


# validation: refused before anything is written ---------------------------------------------------------------

SM75_PIPELINE = PIPELINE + "  rtx-turing:\n    backend: tensorrt-rtx\n    compute_capabilities: [sm_75]\n"
AMPERE_PLUS_PIPELINE = (
    PIPELINE
    + "  a100:\n    backend: tensorrt\n    compute_capabilities: [sm_89]\n    hardware_compatibility: ampere_plus\n"
)


@pytest.mark.parametrize(
    "text, pipeline, where, message",
    [
        pytest.param(
            recipe(precisions="[fp32, fp8]", extra=CALIBRATION),
            PIPELINE,
            "recipes/tiny.yaml:3: precisions[1]",
            "fp8 needs compute capability >= 8.9, target rtx-ampere is sm_86",
            id="fp8-on-sm86",
        ),
        pytest.param(
            recipe(precisions="[bf16]", targets="[rtx-turing]"),
            SM75_PIPELINE,
            "recipes/tiny.yaml:3: precisions[0]",
            "bf16 needs compute capability >= 8.0, target rtx-turing is sm_75",
            id="bf16-on-sm75",
        ),
        pytest.param(
            recipe(
                precisions="[int8]", targets="[rtx-turing]", extra=CALIBRATION + "quantize: {high_precision: bf16}\n"
            ),
            SM75_PIPELINE,
            "recipes/tiny.yaml:3: precisions[0]",
            "int8 needs compute capability >= 8.0 (quantize.high_precision is bf16), target rtx-turing",
            id="bf16-high-precision",
        ),
        pytest.param(
            recipe(precisions="[fp8]", targets="[a100]", extra=CALIBRATION),
            AMPERE_PLUS_PIPELINE,
            "recipes/tiny.yaml:3: precisions[0]",
            "fp8 needs compute capability >= 8.9, target a100 runs on sm_80 and newer (hardware_compatibility "
            "ampere_plus)",
            id="fp8-ampere-plus",
        ),
        pytest.param(
            recipe(precisions="[fp32, int8]"),
            PIPELINE,
            "recipes/tiny.yaml:3: precisions[1]",
            "int8 needs calibration data: add calibration: {data: ...} (or calibration: {random: true} to calibrate "
            "on random inputs, "
            "recorded in the manifest)",
            id="int8-without-data",
        ),
        pytest.param(
            recipe(precisions="[int8]", extra="calibration:\n  data: calib/*.npy\n"),
            PIPELINE,
            "recipes/tiny.yaml:14: calibration.data",
            "no .npy/.npz file matches 'calib/*.npy'",
            id="glob-matches-nothing",
        ),
        pytest.param(
            recipe(precisions="[int8]", extra=CALIBRATION + "  random: true\n"),
            PIPELINE,
            "recipes/tiny.yaml:14: calibration.data",
            "give exactly one of data: <glob>, images: {path: ...} or random: true (got data, random)",
            id="data-and-random",
        ),
        pytest.param(
            recipe(precisions="[int8]", extra=CALIBRATION + "  percentile: 99.9\n"),
            PIPELINE,
            "recipes/tiny.yaml:15: calibration.percentile",
            "percentile applies to method: percentile only",
            id="percentile-without-method",
        ),
        pytest.param(
            recipe(precisions="[int8]", extra="calibration:\n  images: {path: calib, mean: [0.5]}\n"),
            PIPELINE,
            "recipes/tiny.yaml:14: calibration.images.mean",
            "mean needs 3 value(s), one per RGB channel",
            id="image-mean-per-channel",
        ),
        pytest.param(
            recipe(precisions="[fp16]", extra="autocast: {keep_io_type: true}\n"),
            PIPELINE,
            "recipes/tiny.yaml:13: autocast.keep_io_type",
            "unknown key 'keep_io_type'; did you mean 'keep_io_types'?",
            id="autocast-typo",
        ),
    ],
)
def test_precision_errors_are_refused_before_any_work(
    tmp_path: Path, text: str, pipeline: str, where: str, message: str
) -> None:
    root = write_project(tmp_path / "proj", {"tiny": text}, pipeline)
    _calibration_files(root, 4, {"input": (2, 3, 32, 32)})
    assert_refused(root, where, message)


@pytest.mark.parametrize(
    "arrays, message",
    [
        pytest.param(
            {"image": (2, 3, 32, 32)},
            "calib/batch_00.npz has no array for input 'input' (it holds: image)",
            id="missing-input",
        ),
        pytest.param(
            {"input": (16, 3, 32, 32)},
            "calib/batch_00.npz: shapes input [16, 3, 32, 32] fit no profile (profile 0: input min [1, 3, 32, 32] max "
            "[8, 3, 32, 32])",
            id="outside-profile",
        ),
    ],
)
def test_calibration_files_that_do_not_fit_the_model_are_refused(tmp_path: Path, arrays: dict, message: str) -> None:
    root = write_project(tmp_path / "proj", {"tiny": recipe(precisions="[int8]", extra=CALIBRATION)})
    _calibration_files(root, 1, arrays)
    assert_refused(root, "recipes/tiny.yaml:14: calibration.data", message)


# the stage itself: real ModelOpt on the CPU ----------------------------------------------------------------------


def _project(tmp_path: Path, model: str, text: str) -> Path:
    root = write_project(tmp_path / "proj", {"m": text})
    onnx.save(getattr(example_models(), model)(np.random.default_rng(0)), root / "models" / "m.onnx")
    return root


def _run_node(root: Path, precision: str, tmp_path: Path) -> tuple[Path, dict]:
    """Run one precision node in this process exactly as the DAG defines it; returns (model path, record)."""
    node = dag_from_project(load_project(root)).nodes[f"precision:m/{precision}"]
    inputs = {"model": Upstream(files={"model": root / "models" / "m.onnx"})}
    inputs.update({role: Upstream(files={role: path}) for role, path in node.sources})
    workdir = tmp_path / f"work-{precision}-{len(list(tmp_path.glob('work-*')))}"
    workdir.mkdir()
    output = precision_stage.run(node.params, inputs, workdir)
    return output.files["model"], output.record


def _build(model: Path, cc: str, profile: dict) -> None:
    """A real TensorRT-RTX build of the converted ONNX (raises if the parser or builder refuses it)."""
    get_backend("tensorrt-rtx").engine_from_onnx(BuildRequest(model, model.with_suffix(".engine"), [cc], [profile]))
    assert model.with_suffix(".engine").stat().st_size > 10_000


def _ops(path: Path) -> dict[str, int]:
    model = onnx.load(path)
    return {op: sum(n.op_type == op for n in model.graph.node) for op in {n.op_type for n in model.graph.node}}


TINY_PROFILE = {"input": ([1, 3, 32, 32], [4, 3, 32, 32], [8, 3, 32, 32])}
INT8_FOR_ADA = "source: {onnx: models/m.onnx}\nprecisions: [int8]\ntargets: [rtx-ada]\n" + PROFILE_YAML


def test_autocast_keeps_in_fp32_what_the_recipes_data_drives_out_of_fp16_range(tmp_path: Path) -> None:
    """Inputs 1000x larger than random ones push activations past AutoCast's data_max: with the recipe's data those
    nodes stay fp32; on random inputs AutoCast cannot know."""
    recipe = (
        "source: {onnx: models/m.onnx}\nprecisions: [fp16]\ntargets: [rtx-ada]\ncalibration: {data: calib/*.npz}\n"
        + PROFILE_YAML
    )
    root = _project(tmp_path, "tiny_cnn", recipe)
    (root / "calib").mkdir()
    for index in range(6):
        np.savez(
            root / "calib" / f"big_{index}.npz",
            input=np.random.default_rng(index).standard_normal((4, 3, 32, 32)).astype(np.float32) * 1000,
        )
    _, with_data = _run_node(root, "fp16", tmp_path)
    assert (
        with_data["autocast_data"]["source"] == "the recipe's calibration samples"
        and with_data["autocast_data"]["samples"] == 3
    )
    (root / "recipes" / "m.yaml").write_text(recipe.replace("calibration: {data: calib/*.npz}\n", ""))
    _, random = _run_node(root, "fp16", tmp_path)
    assert random["autocast_data"] == {"source": "seeded random inputs within the profiles (seed 1)", "samples": 3}
    kept = {
        name: record["composition"]["nodes_by_dtype"].get("float32", 0)
        for name, record in (("data", with_data), ("random", random))
    }
    assert kept["data"] > kept["random"], kept


def test_fp16_and_bf16_by_autocast_keep_fp32_io_and_build(tmp_path: Path) -> None:
    root = _project(
        tmp_path,
        "tiny_cnn",
        "source: {onnx: models/m.onnx}\nprecisions: [fp16, bf16]\ntargets: [rtx-ada]\n" + PROFILE_YAML,
    )
    for precision, elem in (("fp16", onnx.TensorProto.FLOAT16), ("bf16", onnx.TensorProto.BFLOAT16)):
        model, record = _run_node(root, precision, tmp_path)
        graph = onnx.load(model).graph
        assert {i.data_type for i in graph.initializer} == {elem}
        assert [v.type.tensor_type.elem_type for v in [*graph.input, *graph.output]] == [onnx.TensorProto.FLOAT] * 2
        accuracy = record["accuracy"]
        assert (
            accuracy["passed"]
            and accuracy["data"] == "seeded random inputs within the profiles (seed 1)"
            and accuracy["samples"] == 16
        )
        assert accuracy["outputs"][0]["cosine_similarity"] > 0.9999 and accuracy["outputs"][0]["top1_agreement"] == 1.0
        assert (f"{precision} emulated" in accuracy["runtime"]) and record["calibration"] is None
        _build(model, "sm_86", TINY_PROFILE)


TWO_INPUTS = """\
source: {onnx: models/m.onnx}
precisions: [int8]
targets: [rtx-ampere]
profiles:
  - inputs:
      image: {min: [1, 3, 16, 16], opt: [4, 3, 16, 16], max: [8, 3, 16, 16]}
      features: {min: [1, 32], opt: [4, 32], max: [8, 32]}
calibration:
  data: calib/*.npz
accuracy: {samples: 4}
"""


def test_int8_calibrates_a_model_with_two_inputs_symmetrically_and_reproducibly(tmp_path: Path) -> None:
    root = _project(tmp_path, "two_input_net", TWO_INPUTS)
    _calibration_files(root, 12, {"image": (4, 3, 16, 16), "features": (4, 32)})
    model, record = _run_node(root, "int8", tmp_path)
    assert record["qdq"]["quantize_nodes"] >= 4 and record["qdq"]["asymmetric_zero_points"] == []
    assert _ops(model)["QuantizeLinear"] == record["qdq"]["quantize_nodes"]
    calibration = record["calibration"]
    assert (calibration["method"], calibration["samples"], calibration["rows"], calibration["random"]) == (
        "entropy",
        8,
        32,
        False,
    )
    assert record["accuracy"]["held_out"] and record["accuracy"]["samples"] == 4 and record["accuracy"]["passed"]
    again, record_again = _run_node(root, "int8", tmp_path)
    assert (
        again.read_bytes() == model.read_bytes()
        and record_again["calibration"]["data_digest"] == calibration["data_digest"]
    )
    _build(
        model,
        "sm_86",
        {"image": ([1, 3, 16, 16], [4, 3, 16, 16], [8, 3, 16, 16]), "features": ([1, 32], [4, 32], [8, 32])},
    )


WIDE = (
    "source: {onnx: models/m.onnx}\nprecisions: [int8, fp8]\ntargets: [rtx-ada]\n"
    + PROFILE_YAML
    + "calibration:\n  data: calib/*.npz\n"
)


def test_fp8_quantizes_wide_convolutions_and_builds_for_ada(tmp_path: Path) -> None:
    root = _project(tmp_path, "wide_cnn", WIDE)
    _calibration_files(root, 8, {"input": (4, 3, 32, 32)})
    model, record = _run_node(root, "fp8", tmp_path)
    graph = onnx.load(model).graph
    zero_points = {n.input[2] for n in graph.node if n.op_type == "QuantizeLinear"}
    assert zero_points and {i.data_type for i in graph.initializer if i.name in zero_points} == {
        onnx.TensorProto.FLOAT8E4M3FN
    }
    # max: ModelOpt's int8 -> fp8 scale conversion
    assert record["calibration"]["method"] == "max" and record["accuracy"]["passed"]
    _build(model, "sm_89", TINY_PROFILE)


def test_percentile_calibration_narrows_activation_ranges(tmp_path: Path) -> None:
    root = _project(tmp_path, "wide_cnn", WIDE.replace("[int8, fp8]", "[int8]"))
    _calibration_files(root, 8, {"input": (4, 3, 32, 32)})
    _set_method(root, "max")
    by_max = _scales(_run_node(root, "int8", tmp_path)[0])
    _set_method(root, "percentile\n  percentile: 99.9")
    model, record = _run_node(root, "int8", tmp_path)
    by_percentile = _scales(model)
    assert record["calibration"]["method"] == "percentile" and record["calibration"]["percentile"] == 99.9
    assert by_percentile.keys() == by_max.keys() and all(by_percentile[k] <= by_max[k] * 1.001 for k in by_max)
    assert any(by_percentile[k] < by_max[k] * 0.95 for k in by_max)


def _set_method(root: Path, method: str) -> None:
    path = root / "recipes" / "m.yaml"
    path.write_text(path.read_text().split("  method:")[0] + f"  method: {method}\n")


def _scales(model: Path) -> dict[str, float]:
    """Activation scales (the Q nodes whose input is not a weight)."""
    graph = onnx.load(model).graph
    initializers = {i.name: i for i in graph.initializer}
    return {
        n.input[1]: float(onnx.numpy_helper.to_array(initializers[n.input[1]]))
        for n in graph.node
        if n.op_type == "QuantizeLinear" and n.input[0] not in initializers
    }


def test_fp8_on_a_model_too_small_to_quantize_says_so(tmp_path: Path) -> None:
    root = _project(tmp_path, "tiny_cnn", WIDE.replace("[int8, fp8]", "[fp8]"))
    _calibration_files(root, 4, {"input": (4, 3, 32, 32)})
    with pytest.raises(StageError, match="fp8: ModelOpt quantized no node of this model"):
        _run_node(root, "fp8", tmp_path)


def test_accuracy_out_of_tolerance_fails_with_the_numbers_unless_warn(tmp_path: Path) -> None:
    strict = (
        INT8_FOR_ADA + "calibration: {random: true, samples: 4}\naccuracy:\n  samples: 3\n  int8: {min_cosine: 1.0}\n"
    )
    root = _project(tmp_path, "tiny_cnn", strict)
    with pytest.raises(
        StageError,
        match=r"int8 accuracy out of tolerance: output logits cosine similarity 0\.99\d+ < 1\.0 \(max abs error .*"
        r"over 3 samples of seeded random inputs within the profiles \(seed 1\); loosen accuracy\.int8",
    ):
        _run_node(root, "int8", tmp_path)
    (root / "recipes" / "m.yaml").write_text(strict + "verify: {on_fail: warn}\n")
    _, record = _run_node(root, "int8", tmp_path)
    assert (
        record["accuracy"]["passed"] is False and "cosine similarity" in record["accuracy"]["outputs"][0]["problems"][0]
    )
    assert (
        record["calibration"]["random"] is True
        and record["calibration"]["source"] == "random"
        and record["calibration"]["samples"] == 4
    )


def test_an_image_folder_calibrates_and_its_pixels_are_the_digest(tmp_path: Path) -> None:
    from PIL import Image

    images = INT8_FOR_ADA + (
        "calibration:\n  images: "
        "{path: pictures, resize: 40, crop: 32, mean: [0.5, 0.5, 0.5], std: [0.25, 0.25, 0.25]}\naccuracy: "
        "{samples: 2}\n"
    )
    root = _project(tmp_path, "tiny_cnn", images)
    rng = np.random.default_rng(3)
    (root / "pictures" / "sub").mkdir(parents=True)
    for index in range(6):
        Image.fromarray(rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)).save(
            root / "pictures" / "sub" / f"{index}.png"
        )
    _, record = _run_node(root, "int8", tmp_path)
    assert (record["calibration"]["source"], record["calibration"]["samples"], record["accuracy"]["samples"]) == (
        "images",
        4,
        2,
    )
    calibrated = sorted((f"pictures/sub/{i}.png" for i in range(6)), key=lambda r: rank(0, r))[2]
    Image.fromarray(rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)).save(root / calibrated)
    assert _run_node(root, "int8", tmp_path)[1]["calibration"]["data_digest"] != record["calibration"]["data_digest"]


# acceptance: the CLI, end to end -----------------------------------------------------------------------------------

ACCEPTANCE = """\
source:
  onnx: models/tiny_cnn.onnx
precisions: [fp32, fp16, int8]
targets: [rtx-ampere, rtx-ada]
profiles:
  - inputs:
      input: {min: [1, 3, 32, 32], opt: [4, 3, 32, 32], max: [8, 3, 32, 32]}
calibration:
  data: calib/*.npz
accuracy: {samples: 4}
"""


def _run(root: Path) -> dict[str, str]:
    result = trtflow(root, "run", "--json")
    assert result.code == 0, result.err + result.out
    return {node["id"]: node["status"] for node in json.loads(result.out)["nodes"]}


def _late_name(root: Path, held_out: int) -> str:
    """A new file name that ranks after the held-out files, so it joins the calibration side."""
    ranks = sorted(rank(0, p.relative_to(root).as_posix()) for p in (root / "calib").glob("*.npz"))
    return next(f"calib/extra_{i}.npz" for i in range(1000) if rank(0, f"calib/extra_{i}.npz") > ranks[held_out - 1])


def test_acceptance_three_precisions_two_targets_and_incremental_calibration(tmp_path: Path) -> None:
    root = write_project(tmp_path / "proj", {"tiny": ACCEPTANCE})
    _calibration_files(root, 12, {"input": (4, 3, 32, 32)})
    assert set(_run(root).values()) == {"built"}
    manifest = json.loads((root / "artifacts/packages/tiny/manifest.json").read_text())
    engines = {(e["precision"], e["target"]): e for e in manifest["engines"]}
    assert sorted(engines) == sorted((p, t) for p in ("fp32", "fp16", "int8") for t in ("rtx-ampere", "rtx-ada"))
    int8 = engines[("int8", "rtx-ada")]
    assert (int8["calibration"]["method"], int8["calibration"]["samples"], int8["calibration"]["rows"]) == (
        "entropy",
        8,
        32,
    )
    assert len(int8["calibration"]["data_digest"]) == 64
    for precision in ("fp16", "int8"):
        accuracy = engines[(precision, "rtx-ampere")]["verification"]["precision_accuracy"]
        assert accuracy["passed"] and accuracy["held_out"] and accuracy["samples"] == 4
        assert {"max_abs_error", "mean_rel_error", "cosine_similarity", "top1_agreement"} <= set(accuracy["outputs"][0])
    assert engines[("fp32", "rtx-ada")]["calibration"] is None and engines[("fp16", "rtx-ada")]["calibration"] is None
    fp16_parts = engines[("fp16", "rtx-ada")]["verification"]["precision_composition"]
    int8_parts = engines[("int8", "rtx-ada")]["verification"]["precision_composition"]
    assert fp16_parts["nodes_by_dtype"].get("float16", 0) > 0 and "float16" in fp16_parts["initializer_bytes_by_dtype"]
    assert int8_parts["nodes_by_dtype"]["q/dq"] >= 4 and int8_parts["qdq_covered_ops"].get("Conv", 0) >= 1
    assert engines[("fp32", "rtx-ada")]["verification"]["precision_composition"] is None
    shown = trtflow(root, "inspect", str(root / "artifacts/packages/tiny")).out
    assert "made of: nodes " in shown and "Q/DQ-fed Conv" in shown
    lock = json.loads((root / "trtflow.lock").read_text())["nodes"]
    int8_onnx = (
        root
        / "artifacts/store/objects"
        / lock["precision:tiny/int8"]["outputs"]["model"][:2]
        / lock["precision:tiny/int8"]["outputs"]["model"]
    )
    assert _ops(int8_onnx)["QuantizeLinear"] >= 2 and _ops(int8_onnx)["DequantizeLinear"] >= 2

    assert set(_run(root).values()) == {"cached"}  # a rerun is a no-op
    # same bytes, new mtime: the stat cache re-hashes and finds the same digest
    (root / "calib" / "batch_03.npz").touch()
    assert set(_run(root).values()) == {"cached"}

    # widens the activation ranges
    wider = np.random.default_rng(9).standard_normal((4, 3, 32, 32)).astype(np.float32) * 4
    np.savez(root / _late_name(root, 4), input=wider)
    rerun = {node for node, status in _run(root).items() if status == "built"}
    # AutoCast reads the calibration files too: fp16 reruns, and as its model comes out the same, its builds stay cached
    assert rerun == {
        "precision:tiny/int8",
        "build:tiny/int8/rtx-ampere",
        "build:tiny/int8/rtx-ada",
        "verify:tiny/int8/rtx-ampere",
        "verify:tiny/int8/rtx-ada",
        "precision:tiny/fp16",
        "verify:tiny/fp16/rtx-ampere",
        "verify:tiny/fp16/rtx-ada",
        "package:tiny",
    }
    manifest = json.loads((root / "artifacts/packages/tiny/manifest.json").read_text())
    recalibrated = next(e for e in manifest["engines"] if e["precision"] == "int8")["calibration"]
    assert recalibrated["samples"] == 9 and recalibrated["data_digest"] != int8["calibration"]["data_digest"]

    first = min(rank(0, p.relative_to(root).as_posix()) for p in (root / "calib").glob("*.npz"))
    early = next(f"calib/early_{i}.npz" for i in range(1000) if rank(0, f"calib/early_{i}.npz") < first)
    # ranks into the held-out files: fp16 evaluates on it
    np.savez(root / early, input=np.zeros((4, 3, 32, 32), np.float32))
    plan = trtflow(root, "plan", "--explain").out
    assert "precision:tiny/fp16" in plan and f"input holdout:{early} added" in plan
    (root / "calib" / Path(early).name).unlink()

    # a new accuracy report reaches the manifest though the model is unchanged: AutoCast reads no data, so the fp16
    # model comes out byte-identical and its builds stay cached, while its verify and the package rerun
    recipe_path = root / "recipes" / "tiny.yaml"
    recipe_path.write_text(recipe_path.read_text().replace("accuracy: {samples: 4}", "accuracy: {samples: 2}"))
    states = _run(root)
    assert [states[f"{kind}:tiny/fp16/rtx-ada"] for kind in ("build", "verify")] == ["cached", "built"]
    manifest = json.loads((root / "artifacts/packages/tiny/manifest.json").read_text())
    assert (
        next(e for e in manifest["engines"] if e["precision"] == "fp16")["verification"]["precision_accuracy"][
            "samples"
        ]
        == 2
    )


def test_frozen_rebuild_accepts_int8_engines_that_differ_only_in_kernel_names(tmp_path: Path) -> None:
    """TensorRT-RTX names int8 kernels after memory addresses: the build must match the lock, its engine bytes need
    not."""
    root = write_project(
        tmp_path / "proj",
        {"tiny": ACCEPTANCE.replace("[fp32, fp16, int8]", "[int8]").replace("[rtx-ampere, rtx-ada]", "[rtx-ada]")},
    )
    _calibration_files(root, 6, {"input": (4, 3, 32, 32)})
    assert set(_run(root).values()) == {"built"}
    shutil.rmtree(root / "artifacts")
    result = trtflow(root, "run", "--frozen", "--json")
    assert result.code == 0, result.out + result.err
    assert {node["status"] for node in json.loads(result.out)["nodes"]} == {"built"}
    lock = json.loads((root / "trtflow.lock").read_text())["nodes"]
    # the quantized ONNX itself is reproducible: it matched the lock
    assert lock["precision:tiny/int8"]["outputs"]["model"]


def test_held_out_images_are_counted_as_images_with_their_batches(tmp_path: Path) -> None:
    """Held-out batches of images were reported as files: "4 file(s) held out" for 16 images."""
    from PIL import Image

    images = (
        INT8_FOR_ADA
        + "calibration:\n  images: {path: pictures, resize: 32, crop: 32, batch: 2}\naccuracy: {samples: 2}\n"
    )
    root = _project(tmp_path, "tiny_cnn", images)
    rng = np.random.default_rng(3)
    (root / "pictures").mkdir()
    for index in range(8):
        Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(root / "pictures" / f"{index}.png")
    _, record = _run_node(root, "int8", tmp_path)
    assert record["accuracy"]["data"] == "2 images held out from the calibration set (1 batch(es) of 2)"
