"""What a model's precision stages cost against the bare ModelOpt calls they wrap, one at a time and together.

    python benchmarks/precision_cost.py [--models resnet18 efficientnet_b0 encoder] [--calibration 24]
        [--held-out 16] [--rounds 3] [--workdir DIR]

Per model (benchmarks/torchvision_like.py: torchvision's ResNet-18 and EfficientNet-B0 at real size with settled
BatchNorm statistics, a 4-layer transformer encoder; seeded random weights), one project, one recipe: fp32, fp16, int8
and fp8 for rtx-ada (sm_89 has fp8), `--calibration + --held-out` seeded files of batch 1 at the opt shape (the recipe
holds `--held-out` of them out for its accuracy check), `verify: {on_fail: warn}` so a miss is recorded, not fatal.
Measured in one run:
  1. a cold `trtflow run -j 1`: each precision stage's seconds and peak RSS (artifacts/run.json); the first precision
     stage of the run also waits for what is left of ModelOpt's import (the worker server imports it while the cleanup
     runs; the import timed apart in a fresh process, what was left taken off its seconds, printed);
  2. the baseline, each in a fresh subprocess on the very cleaned model and calibration files the stage read
     (benchmarks/model_families.py's bare call): AutoCast as a user calls it, its reference run over the calibration
     files included, for fp16; the PTQ call the stage makes for int8 and fp8;
  3. goal 1: each precision stage <= 1.1x its bare call; goal 2: the reduced precisions of one model together <= 0.7x
     the bare calls summed (work shared between them, not repeated). Printed met or missed, with the numbers.
Steps 1 and 2 run `--rounds` times in turn, and the medians are compared: this machine's speed drifts by 10-20% within
minutes (one ResNet-18 int8 bare call took 7.5, 8.9 and 9.5 s in a row).
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
from model_families import measure_bare, modelopt_import_seconds, without_import  # noqa: E402
from torchvision_like import MODELS  # noqa: E402
from zoo import SEED, _export  # noqa: E402

PRECISIONS = ("fp16", "int8", "fp8")
GOALS = {"each": 1.1, "together": 0.7}


def write_project(root: Path, name: str, calibration: int, held_out: int) -> None:
    """pipeline.yaml (rtx-ada), one recipe of models/<name>.onnx at every precision, its calibration files."""
    (root / "recipes").mkdir(parents=True)
    (root / "models").mkdir()
    targets = {"rtx-ada": {"backend": "tensorrt-rtx", "compute_capabilities": ["sm_89"]}}
    (root / "pipeline.yaml").write_text(yaml.safe_dump({"targets": targets}))
    make, profile = MODELS[name]
    with torch.no_grad():
        _export(make(), profile, root / "models" / f"{name}.onnx")
    folder = root / "calib"
    folder.mkdir()
    rng = np.random.default_rng(SEED)
    for index in range(calibration + held_out):
        feed = {key: rng.standard_normal((1, *shapes.opt[1:])).astype(np.float32) for key, shapes in profile.items()}
        np.savez(folder / f"{index:03d}.npz", **feed)
    recipe = {
        "source": {"onnx": f"models/{name}.onnx"},
        "precisions": ["fp32", *PRECISIONS],
        "profiles": [{"inputs": {key: shapes.as_recipe() for key, shapes in profile.items()}}],
        "calibration": {"data": "calib/*.npz"},
        "accuracy": {"samples": held_out},
        "verify": {"on_fail": "warn"},
    }
    (root / "recipes" / f"{name}.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))


def measure(work: Path, name: str, calibration: int, held_out: int, imported: float, rounds: int) -> list[str]:
    """Run the model's project cold, then each bare call, `rounds` times in turn (this machine's speed drifts by 10-20%
    within minutes: the medians are compared); the table's lines and the goals' verdicts."""
    root = work / name
    write_project(root, name, calibration, held_out)
    lines: list[str] = []
    stages: dict[str, list[float]] = {p: [] for p in PRECISIONS}
    bares: dict[str, list[dict]] = {p: [] for p in PRECISIONS}
    for _ in range(rounds):
        shutil.rmtree(root / "artifacts", ignore_errors=True)
        (root / "trtflow.lock").unlink(missing_ok=True)
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "trtflow", "-C", str(root), "run", "-j", "1"], capture_output=True)
        lines.append(f"{name}: cold run exit {done.returncode} in {time.perf_counter() - started:.0f} s")
        nodes = {n["id"]: n for n in json.loads((root / "artifacts" / "run.json").read_text())["nodes"]}
        own = without_import(nodes, imported)
        for precision in PRECISIONS:
            node = nodes[f"precision:{name}/{precision}"]
            if node["status"] not in ("built", "warned"):
                lines.append(f"  {precision}: stage {node['status']}: {node.get('reason')}")
                continue
            stages[precision].append(own[node["id"]])
            bares[precision].append({**measure_bare(root, node["id"], precision), "stage_peak": node["peak_rss"]})
    return lines[-1:] + verdicts(stages, bares)


def verdicts(stages: dict[str, list[float]], bares: dict[str, list[dict]]) -> list[str]:
    """Per precision, the median stage against the median bare call (and the peaks of the last round); together."""
    lines, stage_total, bare_total = [], 0.0, 0.0
    for precision in PRECISIONS:
        failed = [b["error"] for b in bares[precision] if "error" in b]
        if failed or not stages[precision]:
            lines.append(f"  {precision}: bare call failed: {failed[0]}" if failed else f"  {precision}: no stage")
            continue
        seconds = float(np.median(stages[precision]))
        bare = float(np.median([b["seconds"] for b in bares[precision]]))
        stage_total, bare_total = stage_total + seconds, bare_total + bare
        ratio = seconds / bare
        verdict = "met" if ratio <= GOALS["each"] else "missed"
        last = bares[precision][-1]
        lines.append(
            f"  {precision}: stage {seconds:6.1f} s, bare {bare:6.1f} s: {ratio:.2f}x ({verdict}: goal <= "
            f"{GOALS['each']}x; medians of {len(stages[precision])}); peak {last['stage_peak'] / 2**30:.2f} GiB, "
            f"bare {last['peak'] / 2**30:.2f} GiB"
        )
    if bare_total:
        ratio = stage_total / bare_total
        verdict = "met" if ratio <= GOALS["together"] else "missed"
        lines.append(
            f"  together: stages {stage_total:.1f} s, bare calls {bare_total:.1f} s: {ratio:.2f}x ({verdict}: goal <= "
            f"{GOALS['together']}x)"
        )
    return lines


def main() -> int:
    """Measure each model and print its lines."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["resnet18", "efficientnet_b0", "encoder"], choices=list(MODELS))
    parser.add_argument("--calibration", type=int, default=24, help="files to calibrate on")
    parser.add_argument("--held-out", type=int, default=16, help="files held out for the accuracy check")
    parser.add_argument("--rounds", type=int, default=3, help="cold runs and bare calls per model, in turn")
    parser.add_argument("--workdir", type=Path)
    args = parser.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="trtflow-precision-cost-"))
    imported = modelopt_import_seconds()
    print(
        f"ModelOpt's import: {imported:.1f} s alone (what the first precision stage waited of it, the worker server "
        "importing it while the cleanup ran, is taken off its seconds below)"
    )
    for name in args.models:
        print("\n".join(measure(work, name, args.calibration, args.held_out, imported, args.rounds)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
