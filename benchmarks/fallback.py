"""`fallback: auto` on real-size models: what plain int8 (or fp8) reaches, what the search reaches within min_share,
and what the search costs against the stage without it, measured in one run.

    python benchmarks/fallback.py [--models resnet18 mobilenet_v3_small encoder bert bert_narrow_init bert_outliers]
                                  [--files 12] [--precision int8|fp8] [--min-share 0.5] [--workdir DIR]
                                  [--quantize '{high_precision: fp32, exclude_op_types: [Add]}']
                                  [--task [--noise N] [--train all] [--max-drop D]]

Per model (benchmarks/torchvision_like.py: torchvision's ResNet-18 and MobileNetV3-small at real size with settled
BatchNorm statistics, a 4-layer transformer encoder; BERT-base from tests/families.py at two weight scales, and with
a trained BERT's outlier dimensions, whose token ids come from trtflow's seeded random inputs; seeded random
weights), one project with two recipes of the same ONNX, `--precision` (int8 by default) for rtx-ada (sm_89, which
has fp8), `--files` seeded calibration batches at the opt shape (half held out), limits cosine 0.995 and top-1 0.9
(the issue's acceptance), `verify: {on_fail: warn}` so a miss is recorded. With `--task`, an image model's last
Linear is trained on a synthetic 100-class task and its files are that task's images (benchmarks/image_task.py):
logits with a trained classifier's margins, not random ones that nearly tie; with `--train all`, every layer is
trained on the task (the backbone's activations then are a trained network's); with `--max-drop D`, each recipe also
scores top-1 on held-out labelled images of the task and holds it to `max_drop: {top1: D}` against fp32's.
Two recipes:
  - plain: `fallback: none`, today's stage;
  - fallback: `fallback: auto, min_share: <--min-share>` (0.5 by default);
  both with `--quantize` as their `quantize:` (where ModelOpt places Q/DQ, what the rest runs in).
Printed: accuracy of each, the nodes kept with their sensitivity, the trial models and ModelOpt runs, the shares, and
the fallback stage's seconds against the plain one's (goal: at most 3x, nothing extra when the first try passes), each
recipe run on its own, its precision stage's seconds less what it waited of ModelOpt's import (the worker server
imports it while its first task runs; timed apart in a fresh process).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from families import family_model  # noqa: E402
from image_task import NOISE, WHOLE_STEPS, ImageTask, accuracy, trained_head, trained_whole  # noqa: E402
from model_families import modelopt_import_seconds, without_import  # noqa: E402
from torchvision_like import MODELS  # noqa: E402
from zoo import SEED, _export  # noqa: E402

FAMILIES = (
    "bert",
    "bert_narrow_init",
    "bert_outliers",
)  # Hugging Face architectures at real size (tests/families.py), token ids as inputs

LIMITS = {"min_cosine": 0.995, "min_top1": 0.9}
# Weights of the models trained end to end (--train all), kept between runs: training EfficientNet-B0 takes 6 minutes
TRAINED = Path(tempfile.gettempdir()) / "trtflow-benchmarks" / "trained"


def write_project(
    root: Path,
    name: str,
    files: int,
    precision: str,
    min_share: float,
    quantize: dict,
    task: bool = False,
    noise: float | None = None,
    whole: bool = False,
    max_drop: float | None = None,
) -> None:
    """pipeline.yaml (rtx-ada), recipes plain and fallback over models/<name>.onnx, calibration files (a text model:
    trtflow's seeded random token ids, valid for its tables, `files // 2` of them to calibrate on; an image model with
    `task`: a trained head, or every layer trained with `whole`, and the task's images; with `max_drop` too, `files //
    2` batches of the task's labelled images, held to that drop in top-1 against their labels)."""
    (root / "recipes").mkdir(parents=True)
    (root / "models").mkdir()
    targets = {"rtx-ada": {"backend": "tensorrt-rtx", "compute_capabilities": ["sm_89"]}}
    (root / "pipeline.yaml").write_text(yaml.safe_dump({"targets": targets}))
    labelled: dict = {}
    if name in FAMILIES:
        model = family_model(name, root.parent / "cache")
        shutil.copyfile(model.path, root / "models" / "m.onnx")
        profile, calibration = model.profile, {"random": True, "samples": files // 2}
    else:
        make, profile = MODELS[name]
        folder = root / "calib"
        folder.mkdir()
        if task and name in NOISE:
            images = ImageTask(NOISE[name] if noise is None else noise, seed=SEED)
            cache = TRAINED / f"{name}-noise{images.noise}-steps{WHOLE_STEPS}-torch{torch.__version__}.pt"
            model = trained_whole(make(), images, cache=cache) if whole else trained_head(make(), images)
            right, margin = accuracy(model, images)
            trained = "every layer" if whole else "head"
            said = f"{right:.0%} of fresh samples right, top-2 margin {margin:.2f}"
            print(f"{name}: {trained} trained on the task: {said}")
            batches = [{"input": batch} for batch in images.batches(files, profile["input"].opt[0])]
            if max_drop is not None:
                labelled = _labelled_rows(root, images, files // 2, profile["input"].opt[0])
        else:
            model, rng = make(), np.random.default_rng(SEED)
            shapes = {key: shape.opt for key, shape in profile.items()}
            batches = [{k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()} for _ in range(files)]
        with torch.no_grad():
            _export(model, profile, root / "models" / "m.onnx")
        for index, arrays in enumerate(batches):
            np.savez(folder / f"{index:02d}.npz", **arrays)
        calibration = {"data": "calib/*.npz"}
    task_limit = {"max_drop": {"top1": max_drop}} if labelled else {}
    for recipe, extra in (("plain", {}), ("fallback", {"fallback": "auto", "min_share": min_share})):
        text = {
            "source": {"onnx": "models/m.onnx"},
            "precisions": [precision],
            "targets": ["rtx-ada"],
            "calibration": calibration,
            "accuracy": {"samples": files // 2, **labelled, precision: {**LIMITS, **task_limit, **extra}},
            "verify": {"on_fail": "warn"},
            **({"quantize": quantize} if quantize else {}),
            "profiles": [{"inputs": {k: s.as_recipe() for k, s in profile.items()}}],
        }
        (root / "recipes" / f"{recipe}.yaml").write_text(yaml.safe_dump(text, sort_keys=False))


def _labelled_rows(root: Path, images: ImageTask, files: int, batch: int) -> dict:
    """`files` batches of the task's images and their labels under root/val; the recipe's accuracy.data and labels."""
    (root / "val").mkdir()
    labels = []
    for index in range(files):
        rows, classes = images.samples(batch)
        np.savez(root / "val" / f"{index:02d}.npz", input=rows.numpy().astype(np.float32))
        labels.append(classes.numpy())
    np.save(root / "val" / "labels.npy", np.concatenate(labels).astype(np.int64))
    return {"data": "val/*.npz", "labels": "val/labels.npy"}


def summary(record: dict, precision: str) -> str:
    """`cosine 0.99, top-1 0.9, MACs in int8 97%, passed True` of a precision record."""
    outputs = record["accuracy"]["outputs"][0]
    made = record["composition"]
    task = record["accuracy"].get("task")
    scored = f", top-1 against labels {task['value']} (fp32 {task['fp32']}, drop {task['drop']})" if task else ""
    return (
        f"cosine {outputs['cosine_similarity']:.6f}, top-1 {outputs.get('top1_agreement')}{scored}, "
        f"MACs in {precision} {made['mac_share']:.1%}, passed {record['accuracy']['passed']}"
    )


def _trtflow_run(root: Path, *args: str) -> subprocess.CompletedProcess:
    """`trtflow run` of the project at `root` with `args`, its output captured."""
    return subprocess.run([sys.executable, "-m", "trtflow", "-C", str(root), "run", *args], capture_output=True)


def _run_alone(root: Path, recipe: str, precision: str, imported: float) -> float:
    """Run one recipe of the project, every stage of it (`--force`), in a run of its own (a run's first precision
    stage computes what its others read, fp32's outputs and value ranges: run together, the first stage paid for
    both); its precision stage's seconds, less what it waited of ModelOpt's import."""
    started = time.perf_counter()
    done = _trtflow_run(root, "-j", "1", "--force", recipe)
    print(f"{root.name} {recipe}: run exit {done.returncode} in {time.perf_counter() - started:.0f} s ({root})")
    nodes = {n["id"]: n for n in json.loads((root / "artifacts" / "run.json").read_text())["nodes"]}
    return without_import(nodes, imported)[f"precision:{recipe}/{precision}"]


def main() -> int:
    """Per model: write the project, run it cold, print both results and the search's cost."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--models", nargs="+", default=["resnet18", "mobilenet_v3_small", "encoder"], choices=[*MODELS, *FAMILIES]
    )
    parser.add_argument("--files", type=int, default=12)
    parser.add_argument("--precision", choices=["int8", "fp8"], default="int8")
    parser.add_argument("--min-share", type=float, default=0.5)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument(
        "--quantize", type=yaml.safe_load, default={}, help="both recipes' quantize:, e.g. '{high_precision: fp32}'"
    )
    parser.add_argument("--task", action="store_true", help="image models: a trained head, the task's images")
    parser.add_argument("--noise", type=float, help="with --task: the task's noise for every model (default: NOISE's)")
    parser.add_argument(
        "--max-drop", type=float, help="with --task: labelled rows of the task, top-1 held to this drop"
    )
    parser.add_argument(
        "--train", choices=["head", "all"], default="head", help="with --task: train the classifier, or every layer"
    )
    args = parser.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="trtflow-fallback-"))
    from conftest import stage_record

    imported = modelopt_import_seconds()
    print(f"ModelOpt's import: {imported:.1f} s alone (what the first precision stage waited of it: off its seconds)")
    precision = args.precision
    for name in args.models:
        root = work / name
        write_project(
            root,
            name,
            args.files,
            precision,
            args.min_share,
            args.quantize,
            args.task,
            args.noise,
            args.train == "all",
            args.max_drop,
        )
        print()
        # a first run makes the store (a cold run starts its servers otherwise), then each recipe is timed alike
        _trtflow_run(root, "plain")
        seconds = {recipe: _run_alone(root, recipe, precision, imported) for recipe in ("fallback", "plain")}
        plain = stage_record(root, f"precision:plain/{precision}")
        searched = stage_record(root, f"precision:fallback/{precision}")
        print(f"  plain    {seconds['plain']:7.1f} s  {summary(plain, precision)}")
        print(f"  fallback {seconds['fallback']:7.1f} s  {summary(searched, precision)}")
        search = searched.get("fallback")
        ratio = seconds["fallback"] / seconds["plain"] if seconds["plain"] else 0.0
        if search is None:
            print(f"  the first try passed: no search ({ratio:.2f}x the plain stage, the same work)")
            continue
        verdict = "met" if ratio <= 3.0 else "missed"
        print(
            f"  search: {search['candidates']} candidates, {search['trial_models']} trial models, "
            f"{search['modelopt_runs']} ModelOpt runs; {ratio:.2f}x the plain stage ({verdict}: goal <= 3x)"
        )
        kept = ", ".join(f"{k['name']} ({k['op']}, {k['sensitivity']:.3g})" for k in search["kept"]) or "none"
        print(f"  kept in {args.quantize.get('high_precision', 'fp16')}: {kept}")
        if "below_min_share" in search:
            rejected = search["below_min_share"]
            share = rejected["mac_share"]
            print(f"  rejected: the {rejected['kept']} most sensitive leave {share:.1%} of MACs in {precision}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
