"""Memory benchmark: peak RSS per stage kind on the real-model corpus, and the memory-aware scheduler against a budget.

    python benchmarks/memory.py [--models resnet mobilenet ...] [--precisions fp32 fp16 int8] [--legacy-vgg] [--workdir
    DIR]

What is measured, in one run:
  1. a cold `trtflow run -j 2` of the corpus in tests/zoo.py (tests/fleet.py's project), then every stage's peak RSS
     from artifacts/run.json (measured in the worker that ran it, reset before each stage): the largest per stage kind
     and per (kind, model), printed as a table;
  2. the scheduler: the same project again in a fresh folder with `--memory` set to the largest precision peak of
     step 1 times 1.5 (room for one precision stage, not two): it must pass, and no two precision stages may overlap;
     its wall time against step 1's is the price of the budget;
  3. with --legacy-vgg, an fp16 precision stage of ONNX's legacy VGG-19 (weights computed by ops; it peaked at
     17.7 GB while cleanup folded them), against the goal of 4 GB (issue: precision stages bounded); with
     --vgg-weights, fp16 and int8 of VGG-19 with its 548 MB of weights as initializers (about 8 GB free needed).
Goals printed as met or missed with numbers.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "benchmarks"))
from fleet import MODELS, PRECISIONS, write_fleet_project  # noqa: E402

GB = 1e9


def run(root: Path, *args: str) -> tuple[float, dict]:
    """Wall seconds and artifacts/run.json of `trtflow run -j 2 ARGS` (exits on failure)."""
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "trtflow", "-C", str(root), "run", "-j", "2", *args], capture_output=True, text=True
    )
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        sys.exit(f"trtflow run failed (exit {done.returncode}): {done.stderr[-2000:]}")
    return seconds, json.loads((root / "artifacts" / "run.json").read_text())


def peaks(record: dict) -> dict[tuple[str, str], int]:
    """(stage kind, recipe) -> the largest peak RSS among its stages that ran."""
    found: dict[tuple[str, str], int] = {}
    for node in record["nodes"]:
        kind, recipe = node["id"].split(":")[0], node["id"].split(":")[1].split("/")[0]
        if node.get("peak_rss"):
            found[(kind, recipe)] = max(found.get((kind, recipe), 0), node["peak_rss"])
    return found


def overlapping(record: dict, kind: str) -> list[tuple[str, str]]:
    """Pairs of stages of `kind` whose run intervals overlap."""
    ran = [n for n in record["nodes"] if n["id"].startswith(kind + ":") and n.get("start") is not None]
    return [
        (a["id"], b["id"])
        for i, a in enumerate(ran)
        for b in ran[i + 1 :]
        if a["start"] < b["end"] and b["start"] < a["end"]
    ]


def print_table(found: dict[tuple[str, str], int]) -> None:
    """Print the peak memory of each stage kind and precision found in the run records."""
    kinds = sorted({kind for kind, _ in found})
    recipes = sorted({recipe for _, recipe in found})
    print(f"{'peak RSS (GB)':<14}" + "".join(f"{kind:>11}" for kind in kinds))
    for recipe in recipes:
        print(f"{recipe:<14}" + "".join(f"{found.get((kind, recipe), 0) / GB:>11.2f}" for kind in kinds))
    print(
        f"{'largest':<14}"
        + "".join(f"{max(v for (k, _), v in found.items() if k == kind) / GB:>11.2f}" for kind in kinds)
    )


def main() -> None:
    """Build the corpus and print the peak memory per stage kind."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--models", nargs="+", default=["resnet", "mobilenet", "efficientnet", "lstm", "encoder"], choices=MODELS
    )
    parser.add_argument("--precisions", nargs="+", default=list(PRECISIONS))
    parser.add_argument(
        "--legacy-vgg", action="store_true", help="also AutoCast ONNX's legacy VGG-19 to fp16 (about 3 GB free needed)"
    )
    parser.add_argument(
        "--vgg-weights", action="store_true", help="also VGG-19 with its 548 MB of weights, fp16 and int8 (~8 GB free)"
    )
    parser.add_argument("--workdir", type=Path)
    args = parser.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="trtflow-memory-"))
    first = write_fleet_project(work / "free", tuple(args.models), tuple(args.precisions))
    free_seconds, record = run(first, "--memory", "1000G")
    found = peaks(record)
    print_table(found)
    precision_peak = max((v for (k, _), v in found.items() if k == "precision"), default=0)
    budget = int(precision_peak * 1.5)
    second = write_fleet_project(work / "budget", tuple(args.models), tuple(args.precisions))
    budget_seconds, budgeted = run(second, "--memory", str(budget))
    overlaps = overlapping(budgeted, "precision")
    print(
        f"\nscheduler: --memory {budget / GB:.2f} GB (1.5x the largest precision peak): {budget_seconds:.1f} s against "
        f"{free_seconds:.1f} s unbounded ({budget_seconds / free_seconds:.2f}x); overlapping precision stages: "
        f"{len(overlaps)}"
    )
    print(f"goal: no two stages beyond the budget at once: {'met' if not overlaps else 'missed'}")
    if args.legacy_vgg:
        vgg_goal(work)
    if args.vgg_weights:
        vgg_goal(work, with_weights=True)
    if not args.legacy_vgg:
        print("goal: precision stage of legacy VGG-19 <= 4 GB: not measured (pass --legacy-vgg)")


def vgg_goal(work: Path, with_weights: bool = False) -> None:
    """Precision stages of VGG-19, their peaks against 4 GB: ONNX's legacy one (light zoo, in the onnx wheel: weights
    computed by ops) at fp16, or with `with_weights` torchvision's architecture with its 548 MB of weights as
    initializers (benchmarks/torchvision_like.py) at fp16 and int8 (random calibration)."""
    import shutil

    import onnx
    import yaml

    root = work / ("vgg-weights" if with_weights else "vgg")
    shutil.rmtree(root, ignore_errors=True)
    (root / "recipes").mkdir(parents=True)
    (root / "models").mkdir()
    if with_weights:
        from torchvision_like import write_vgg19

        cached = work / "vgg19-weights.onnx"
        if not cached.is_file():
            write_vgg19(cached)
        shutil.copyfile(cached, root / "models" / "vgg19.onnx")
    else:
        light = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light" / "light_vgg19.onnx"
        shutil.copyfile(light, root / "models" / "vgg19.onnx")
    (root / "pipeline.yaml").write_text(
        yaml.safe_dump({"targets": {"ada": {"backend": "tensorrt-rtx", "compute_capabilities": ["sm_89"]}}})
    )
    recipe: dict = {"source": {"onnx": "models/vgg19.onnx"}, "precisions": ["fp16"], "verify": {"on_fail": "warn"}}
    if with_weights:
        recipe.update(precisions=["fp16", "int8"], calibration={"random": True})
    (root / "recipes" / "vgg19.yaml").write_text(yaml.safe_dump(recipe))
    _, record = run(root)
    name = "VGG-19 with its weights" if with_weights else "legacy VGG-19"
    for node in record["nodes"]:
        if node["id"].startswith("precision:"):
            peak = node.get("peak_rss") or 0
            met = "met" if peak <= 4 * GB else "missed"
            print(f"goal: {node['id']} ({name}) <= 4 GB: {met} ({peak / GB:.1f} GB, {node['seconds']:.0f} s)")
    found = sorted(peaks(record).items())
    print("peak per stage kind: " + ", ".join(f"{kind} {value / GB:.2f} GB" for (kind, _), value in found))


if __name__ == "__main__":
    main()
