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
  3. with --legacy-vgg only (it needs about 18 GB free: AutoCast of ONNX's legacy VGG-19 peaked at 17.7 GB), an fp16
     precision stage of that model, against the goal of 4 GB (issue: precision stages bounded).
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
        "--legacy-vgg", action="store_true", help="also AutoCast ONNX's legacy VGG-19 to fp16 (needs ~18 GB free)"
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
    else:
        print("goal: precision stage of legacy VGG-19 <= 4 GB: not measured (pass --legacy-vgg; it needs ~18 GB free)")


def vgg_goal(work: Path) -> None:
    """fp16 AutoCast of ONNX's legacy VGG-19 (light zoo, in the onnx wheel), its precision stage's peak against 4 GB."""
    import shutil

    import onnx
    import yaml

    source = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light" / "light_vgg19.onnx"
    root = work / "vgg"
    (root / "recipes").mkdir(parents=True)
    (root / "models").mkdir()
    shutil.copyfile(source, root / "models" / "vgg19.onnx")
    (root / "pipeline.yaml").write_text(
        yaml.safe_dump({"targets": {"ada": {"backend": "tensorrt-rtx", "compute_capabilities": ["sm_89"]}}})
    )
    (root / "recipes" / "vgg19.yaml").write_text(
        yaml.safe_dump({"source": {"onnx": "models/vgg19.onnx"}, "precisions": ["fp16"], "verify": {"on_fail": "warn"}})
    )
    _, record = run(root)
    peak = max(n.get("peak_rss") or 0 for n in record["nodes"] if n["id"].startswith("precision:"))
    print(
        f"goal: precision stage of legacy VGG-19 <= 4 GB: {'met' if peak <= 4 * GB else 'missed'} ({peak / GB:.1f} GB)"
    )


if __name__ == "__main__":
    main()
