"""The models teams ship today, at their real sizes (tests/families.py): BERT-base and GPT-2 small with int64 token
ids and masks, ViT-B/16, a detector ending in NonMaxSuppression, and a Hugging Face folder as a source. Each pair
builds, fails only on a measured accuracy limit with the numbers, or is refused by validate before any work."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from conftest import PIPELINE, shared_dir, stage_record, trtflow, write_project
from families import FAMILIES, bert, family_model

from trtflow.recipe.hftasks import TASKS
from trtflow.recipe.source import HuggingFaceSource
from trtflow.util.inputvalues import padded_mask

TEXT_PROFILE = """\
profiles:
  - inputs:
      input_ids: {min: [1, 16], opt: [4, 64], max: [8, 128]}
      attention_mask: {min: [1, 16], opt: [4, 64], max: [8, 128]}
      token_type_ids: {min: [1, 16], opt: [4, 64], max: [8, 128]}
"""


@pytest.fixture(scope="session")
def families_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One folder the families' models are exported into, once per test run (shared by xdist's workers)."""
    return shared_dir(tmp_path_factory, "families")


def project_with(root: Path, model: Path, recipe: str, name: str = "m") -> Path:
    """A project whose recipe `name` reads `model` (linked in as models/<name>.onnx)."""
    root = write_project(root, {name: f"source: {{onnx: models/{name}.onnx}}\n" + recipe})
    os.link(model, root / "models" / f"{name}.onnx")
    return root


def test_every_task_of_the_schema_has_its_details() -> None:
    assert set(TASKS) == {"text-classification", "token-classification", "feature-extraction", "text-generation",
                          "image-classification", "speech-encoder", "unet"}  # fmt: skip
    with pytest.raises(ValueError, match="unknown task 'translation'"):
        HuggingFaceSource(path="models/x", task="translation")


def test_a_hub_id_is_refused_when_the_recipe_loads(tmp_path: Path) -> None:
    root = write_project(tmp_path / "p", {"bert": "source:\n  huggingface: {path: google-bert/bert-base-uncased, "
                                          "task: text-classification}\n" + TEXT_PROFILE})  # fmt: skip
    result = trtflow(root, "validate")
    assert result.code == 3
    where = "recipes/bert.yaml:2: source.huggingface.path"
    assert f"{where}: google-bert/bert-base-uncased is not a folder here; trtflow never downloads" in result.err


def test_a_detectors_nms_is_refused_by_validate_with_the_way_out(tmp_path: Path, families_dir: Path) -> None:
    """TensorRT-RTX has no runner for NonMaxSuppression ("nms has no runners that implement it"): every pair of the
    detector is refused before any work, and excluding them all leaves a recipe with no stage and no package."""
    model = family_model("detector", families_dir)
    root = project_with(tmp_path / "p", model.path, "precisions: [fp32, fp16]\n")
    result = trtflow(root, "validate")
    assert result.code == 3
    assert result.err.count("NonMaxSuppression has no tensorrt-rtx implementation: nms") == 4
    assert "run NMS after the engine" in result.err
    # the block to paste comes out as YAML, not prefixed with error:
    assert "\n  exclude:\n    - {precision: fp32}\n    - {precision: fp16}\n" in result.err
    with (root / "recipes" / "m.yaml").open("a") as recipe:
        recipe.write("exclude:\n  - {precision: fp32}\n  - {precision: fp16}\n")
    result = trtflow(root, "validate")
    assert result.code == 0 and "exclude: drops every (precision, target) pair" in result.err
    assert trtflow(root, "run").code == 0
    assert not (root / "artifacts" / "packages" / "m").exists()


@pytest.mark.slow
def test_whisper_tiny_encoder_builds_at_fp32_and_fp16(tmp_path: Path, families_dir: Path) -> None:
    """Its fp16 conversion took 98 s and peaked at 13.8 GB (AutoCast's reference run kept every activation of every
    sample); trtflow's range pass costs one inference's memory."""
    model = family_model("whisper", families_dir)
    profile = "profiles:\n  - inputs:\n      input_features: {shape: [1, 80, 3000]}\n"
    # 4 held-out samples, not 16: each is a second of fp32 and 1.5 s of fp16 emulation on one core at this size
    recipe = "precisions: [fp32, fp16]\ntargets: [rtx-ampere]\naccuracy: {samples: 4}\n" + profile
    root = project_with(tmp_path / "p", model.path, recipe)
    result = trtflow(root, "run", "--json")
    assert result.code == 0, result.err
    fp16 = stage_record(root, "precision:m/fp16")
    assert fp16["autocast_data"]["samples"] == 1 and fp16["accuracy"]["passed"], fp16["accuracy"]  # one static shape


@pytest.mark.slow
def test_gpt2_small_without_cache_builds(tmp_path: Path, families_dir: Path) -> None:
    model = family_model("gpt2", families_dir)
    shapes = "{min: [1, 8], opt: [2, 32], max: [4, 64]}"
    profile = f"profiles:\n  - inputs:\n      input_ids: {shapes}\n      attention_mask: {shapes}\n"
    root = project_with(tmp_path / "p", model.path, "precisions: [fp32]\ntargets: [rtx-ada]\n" + profile)
    result = trtflow(root, "run")
    assert result.code == 0, result.err
    assert stage_record(root, "cleanup:m")["equality"]["passed"]


@pytest.mark.slow
def test_vit_fp16_is_judged_on_its_accuracy_not_crashed_by_autocasts_shapes(tmp_path: Path, families_dir: Path) -> None:
    """AutoCast writes unknown dimensions as one symbol `unk`; handed on, ONNX Runtime reused one buffer for two
    tensors ("Shape mismatch attempting to re-use buffer {4,1,768} != {4,197,768}"). The emulation infers shapes
    afresh: the stage ends on its accuracy numbers."""
    model = family_model("vit", families_dir)
    shapes = "{min: [1, 3, 224, 224], opt: [2, 3, 224, 224], max: [4, 3, 224, 224]}"
    profile = f"profiles:\n  - inputs:\n      pixel_values: {shapes}\n"
    # 3 held-out samples: the opt, min and max batches (the buffer reuse broke at 4), not 16 of ViT-B twice
    root = project_with(tmp_path / "p", model.path, "precisions: [fp16]\ntargets: [rtx-ada]\n" + profile
                        + "verify: {on_fail: warn}\naccuracy: {samples: 3}\n")  # fmt: skip
    result = trtflow(root, "run")
    assert result.code == 0, result.err
    accuracy = stage_record(root, "precision:m/fp16")["accuracy"]
    assert "fp16 emulated" in accuracy["runtime"]
    assert accuracy["outputs"][0]["cosine_similarity"] > 0.999


@pytest.mark.slow
def test_bert_base_from_a_huggingface_folder_builds_and_calibrates_with_padded_masks(
    tmp_path: Path, families_dir: Path
) -> None:
    """BERT-base as save_pretrained's folder, exported offline for text-classification (3 int64 inputs, batch and
    sequence dynamic; the folder's files are the export's inputs). Cleanup's proof draws token ids within the
    30522-row table and token types within the 2-row one (it died on `idx=7 must be within [-2,1]`); int8 calibrates
    on files with padded masks (it died on `Too many bins for data range`: the additive mask's finfo.min reached the
    histograms) and then meets or misses its limit with the numbers. One project for both: BERT-base's export,
    cleanup and int8 calibration are the slowest stages of the test run."""
    folder = families_dir / "bert-folder"
    if not (folder / "config.json").is_file():
        bert().save_pretrained(folder)
    recipe = (
        "source:\n  huggingface: {path: models/bert, task: text-classification}\nprecisions: [fp32, int8]\n"
        "targets: [rtx-ada]\ncalibration: {data: calib/*.npz}\nverify: {on_fail: warn}\n"
    )
    root = write_project(tmp_path / "p", {"bert": recipe + TEXT_PROFILE})
    shutil.copytree(folder, root / "models" / "bert")
    (root / "calib").mkdir()
    rng = np.random.default_rng(7)
    for index in range(3):  # 2 calibrate (histograms merged from the second on), 1 held out
        np.savez(
            root / "calib" / f"{index}.npz",
            input_ids=rng.integers(0, 30522, (4, 64)),
            attention_mask=padded_mask(rng, [4, 64]),
            token_type_ids=rng.integers(0, 2, (4, 64)),
        )
    result = trtflow(root, "run", "--json")
    assert result.code == 0, result.err
    assert json.loads(result.out)["failed"] == 0
    export = stage_record(root, "export:bert")
    assert export["torch_equality"]["passed"] and export["outputs"] == ["logits"]
    assert [spec["name"] for spec in export["inputs"]] == ["input_ids", "attention_mask", "token_type_ids"]
    assert stage_record(root, "cleanup:bert")["equality"]["passed"]
    int8 = stage_record(root, "precision:bert/int8")
    assert len(int8["kept_for_masks"]["nodes"]) >= 12  # one additive mask per layer, and the mask's own nodes
    assert int8["qdq"]["quantize_nodes"] > 0
    assert "cosine_similarity" in int8["accuracy"]["outputs"][0]
    assert "0 built" in trtflow(root, "run").out
    # validate reads the cached export for what the source itself cannot show: fp32 GEMMs on Turing
    with (root / "pipeline.yaml").open("a") as pipeline:
        pipeline.write("  rtx-turing: {backend: tensorrt-rtx, compute_capabilities: [sm_75]}\n")
    recipe_file = root / "recipes" / "bert.yaml"
    recipe_file.write_text(recipe_file.read_text().replace("[rtx-ada]", "[rtx-ada, rtx-turing]"))
    refused = trtflow(root, "validate")
    assert refused.code == 3 and "fp32 cannot build for target rtx-turing (sm_75)" in refused.err
    assert "FP32 GEMM is not supported on Turing" in refused.err
    recipe_file.write_text(recipe_file.read_text().replace("[rtx-ada, rtx-turing]", "[rtx-ada]"))
    config = json.loads((root / "models" / "bert" / "config.json").read_text())
    (root / "models" / "bert" / "config.json").write_text(json.dumps({**config, "num_labels": 3}))
    explained = trtflow(root, "plan", "--explain").out
    assert "huggingface/config.json" in explained


def test_the_corpus_lists_every_family() -> None:
    assert set(FAMILIES) >= {"bert", "gpt2", "vit", "whisper", "unet", "detector"}


def _small(task: str) -> tuple[torch.nn.Module, str]:
    """A small model of the transformers task (only that one is built), and its profile's inputs (YAML)."""
    import transformers as tf

    torch.manual_seed(0)
    text = "{min: [1, 8], opt: [2, 16], max: [4, 32]}"
    tokens_and_mask = f"input_ids: {text}\n      attention_mask: {text}"
    layer = {"hidden_size": 64, "num_attention_heads": 2, "intermediate_size": 128}
    bert = tf.BertConfig(num_hidden_layers=1, **layer)
    vit = tf.ViTConfig(num_hidden_layers=1, image_size=32, patch_size=8, **layer)
    whisper = tf.WhisperConfig(
        d_model=64, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2,
        encoder_ffn_dim=128, decoder_ffn_dim=128,
    )  # fmt: skip
    made = {
        "token-classification": (lambda: tf.BertForTokenClassification(bert), tokens_and_mask),
        "feature-extraction": (lambda: tf.BertModel(bert), f"input_ids: {text}"),
        "text-generation": (lambda: tf.GPT2LMHeadModel(tf.GPT2Config(n_layer=1, n_embd=64, n_head=2)), tokens_and_mask),
        "image-classification": (
            lambda: tf.ViTForImageClassification(vit),
            "pixel_values: {min: [1, 3, 32, 32], opt: [2, 3, 32, 32], max: [4, 3, 32, 32]}",
        ),
        "speech-encoder": (
            lambda: tf.WhisperForConditionalGeneration(whisper),
            "input_features: {shape: [1, 80, 3000]}",
        ),
    }
    make, inputs = made[task]
    return make(), inputs


@pytest.mark.parametrize(
    ("task", "output"),
    [
        ("token-classification", "logits"),
        ("feature-extraction", "last_hidden_state"),
        ("text-generation", "logits"),
        ("image-classification", "logits"),
        ("speech-encoder", "last_hidden_state"),
    ],
)
def test_every_transformers_task_exports_checks_and_builds(tmp_path: Path, task: str, output: str) -> None:
    """Each task of recipe.hftasks from a save_pretrained folder (small configs: the real sizes are above)."""
    model, inputs = _small(task)
    recipe = f"source:\n  huggingface: {{path: models/m, task: {task}}}\ntargets: [rtx-ada]\nprofiles:\n  - inputs:\n"
    root = write_project(tmp_path / "p", {"m": recipe + f"      {inputs}\n"})
    model.save_pretrained(root / "models" / "m")
    result = trtflow(root, "run")
    assert result.code == 0, result.err
    export = stage_record(root, "export:m")
    assert export["outputs"] == [output] and export["torch_equality"]["passed"]


def test_a_detectors_selected_boxes_are_compared_as_a_set(tmp_path: Path, families_dir: Path) -> None:
    """NonMaxSuppression's output has as many rows as boxes survive: fp16 keeps one box more or less, and the rows
    come in score order. They are compared as sets (the share both selected), never elementwise."""
    from trtflow.recipe.precision import DEFAULT_TOLERANCES, AutocastOptions
    from trtflow.stages import accuracy, compare, convert
    from trtflow.stages.ranges import float_ranges

    model = family_model("detector", families_dir)
    feeds = compare.sample_feeds(compare.signature(model.path), [], 4, seed=1)
    with convert.quiet():
        fp16, _ = convert.autocast(model.path, "fp16", AutocastOptions().model_dump(), float_ranges(model.path, feeds))
    candidate = tmp_path / "fp16.onnx"
    onnx.save(fp16, candidate)
    tolerance = DEFAULT_TOLERANCES["fp16"].model_dump()
    result = accuracy.report(candidate, model.path, feeds, tolerance, "random")
    selected = {o["name"]: o for o in result["outputs"]}["selected_indices"]
    # random weights leave 4-5 boxes per image, close to the score and overlap thresholds: fp16 rounding changes some
    # of them (measured: agreement 0.79), which is judged against the set limit, never as a shape mismatch
    assert selected["compared_as"] == "set" and 0.5 < selected["set_agreement"] <= 1.0, selected
    assert all(problem.startswith("set agreement") for problem in selected["problems"]), selected
    counts = [len(run["selected_indices"]) for run in compare.run_all(compare.session(model.path), feeds)]
    assert min(counts) >= 3, "the random detector must select boxes, else the test proves nothing"


def test_validate_export_exports_a_folder_first_and_predicts_what_its_model_cannot_build(tmp_path: Path) -> None:
    """Before any run, validate sees only a Hugging Face folder; with --export it exports it (as a run would, cached)
    and refuses the pair the exported graph cannot build: fp32 GEMMs on Turing."""
    model, inputs = _small("feature-extraction")
    recipe = "source:\n  huggingface: {path: models/m, task: feature-extraction}\ntargets: [rtx-turing]\nprofiles:\n"
    pipeline = PIPELINE + "  rtx-turing: {backend: tensorrt-rtx, compute_capabilities: [sm_75]}\n"
    root = write_project(tmp_path / "p", {"m": recipe + f"  - inputs:\n      {inputs}\n"}, pipeline)
    model.save_pretrained(root / "models" / "m")
    assert trtflow(root, "validate").code == 0  # nothing shows the GEMMs yet
    refused = trtflow(root, "validate", "--export")
    assert refused.code == 3 and "FP32 GEMM is not supported on Turing" in refused.err, refused.err
    assert "export:m" in json.loads((root / "trtflow.lock").read_text())["nodes"]
    assert "1 cached" in trtflow(root, "plan").out  # the export is the run's own, not done again
