"""What a model's precision stages cost against the bare ModelOpt calls they wrap, one at a time and together.

    python benchmarks/precision_cost.py [--models resnet18 efficientnet_b0 encoder] [--calibration 24]
        [--held-out 16] [--workdir DIR]

Per model (benchmarks/torchvision_like.py: torchvision's ResNet-18 and EfficientNet-B0 at real size with settled
BatchNorm statistics, a 4-layer transformer encoder; seeded random weights), one project, one recipe: fp32, fp16, int8
and fp8 for rtx-ada (sm_89 has fp8), `--calibration + --held-out` seeded files of batch 1 at the opt shape (the recipe
holds `--held-out` of them out for its accuracy check), `verify: {on_fail: warn}` so a miss is recorded, not fatal.
Measured in one run:
  1. a cold `trtflow run -j 1`: each precision stage's seconds and peak RSS (artifacts/run.json); the first precision
     stage of the run also pays ModelOpt's import (timed apart in a fresh process, taken off its seconds, printed);
  2. the baseline, each in a fresh subprocess on the very cleaned model and calibration files the stage read
     (benchmarks/model_families.py's bare call): AutoCast as a user calls it, its reference run over the calibration
     files included, for fp16; the PTQ call the stage makes for int8 and fp8;
  3. goal 1: each precision stage <= 1.1x its bare call; goal 2: the reduced precisions of one model together <= 0.7x
     the bare calls summed (work shared between them, not repeated). Printed met or missed, with the numbers.
"""

from __future__ import annotations

import argparse
import json
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


def measure(work: Path, name: str, calibration: int, held_out: int, imported: float) -> list[str]:
    """Run the model's project cold, then each bare call; the table's lines and the goals' verdicts."""
    root = work / name
    write_project(root, name, calibration, held_out)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "trtflow", "-C", str(root), "run", "-j", "1"], capture_output=True)
    wall = time.perf_counter() - started
    lines = [f"{name}: cold run exit {done.returncode} in {wall:.0f} s"]
    nodes = {n["id"]: n for n in json.loads((root / "artifacts" / "run.json").read_text())["nodes"]}
    own = without_import(nodes, imported)
    stage_total = bare_total = 0.0
    for precision in PRECISIONS:
        node_id = f"precision:{name}/{precision}"
        node = nodes[node_id]
        if node["status"] not in ("built", "warned"):
            lines.append(f"  {precision}: stage {node['status']}: {node.get('reason')}")
            continue
        bare = measure_bare(root, node_id, precision)
        if "error" in bare:
            lines.append(f"  {precision}: bare call failed: {bare['error']}")
            continue
        seconds = own[node_id]
        stage_total, bare_total = stage_total + seconds, bare_total + bare["seconds"]
        ratio = seconds / bare["seconds"]
        verdict = "met" if ratio <= GOALS["each"] else "missed"
        paid = f" ({node['seconds']:.1f} s with the import)" if seconds != node["seconds"] else ""
        lines.append(
            f"  {precision}: stage {seconds:6.1f} s{paid}, bare {bare['seconds']:6.1f} s: {ratio:.2f}x ({verdict}: "
            f"goal <= {GOALS['each']}x); peak {node['peak_rss'] / 2**30:.2f} GiB, bare {bare['peak'] / 2**30:.2f} GiB"
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
    parser.add_argument("--workdir", type=Path)
    args = parser.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="trtflow-precision-cost-"))
    imported = modelopt_import_seconds()
    print(
        f"ModelOpt's import: {imported:.1f} s (paid by a worker's first precision stage: taken off its seconds below)"
    )
    for name in args.models:
        print("\n".join(measure(work, name, args.calibration, args.held_out, imported)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
