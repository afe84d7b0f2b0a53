"""What exporting torch sources costs in trtflow, against the same exports by hand and against a fresh process each.

    python benchmarks/export_cost.py [--models resnet18 efficientnet_b0 encoder] [--rounds 2] [--workdir DIR]

One project with a torch recipe per model (benchmarks/torchvision_like.py: ResNet-18 and EfficientNet-B0 at real size,
a 4-layer transformer encoder; seeded random weights; a dynamic batch 1/8/32), exported with `trtflow validate
--export` (the export stages alone, cached as a run caches them; each round in a fresh copy, so every export runs).
Each timed as a whole command, its process start and imports included, the three in turn per round:
  1. trtflow as it runs: each export a child forked by the user code's server, which imported torch once;
  2. trtflow with each export in a fresh process (as before that server; as where processes cannot fork, and on Ray);
  3. the same work by hand in one fresh process: import torch, and per model the factory, torch.onnx.export
     (dynamo=True) at the same shapes and batch axis, the save, one ONNX Runtime run against torch.
Prints the medians and trtflow's ratios against 3. trtflow also checks each export on every profile shape and writes
a record; the by-hand script does the least a user would.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from torchvision_like import MODELS  # noqa: E402

FACTORIES = f"""\
import sys
sys.path[:0] = [{str(HERE)!r}, {str(HERE.parent / "tests")!r}]
from torchvision_like import MODELS


def make(name):
    return MODELS[name][0]()
"""
FRESH_PROCESS_EACH = (
    "import sys; from trtflow.executors import local; "
    "local.SERVED = {kind: group for kind, group in local.SERVED.items() if kind != 'export'}; "
    "from trtflow.cli import main; main(sys.argv[1:])"
)
BY_HAND = """\
import sys, time
sys.path[:0] = [{here!r}, {tests!r}]
import numpy as np, onnxruntime, torch
from torchvision_like import MODELS
from zoo import _export
for name in {models!r}:
    torch.manual_seed(0)
    make, profile = MODELS[name]
    model = make().eval()
    examples = [torch.randn(shapes.opt) for shapes in profile.values()]
    path = f"{{name}}.onnx"
    with torch.no_grad():
        _export(model, profile, path)
        expected = model(*examples).numpy()
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    feed = dict(zip([i.name for i in session.get_inputs()], [e.numpy() for e in examples]))
    assert np.allclose(session.run(None, feed)[0], expected, rtol=1e-3, atol=1e-4), name
"""


def write_project(root: Path, models: list[str]) -> Path:
    """pipeline.yaml (rtx-ada), models/tv.py (the factories), a torch recipe per model at fp32."""
    (root / "recipes").mkdir(parents=True)
    (root / "models").mkdir()
    targets = {"rtx-ada": {"backend": "tensorrt-rtx", "compute_capabilities": ["sm_89"]}}
    (root / "pipeline.yaml").write_text(yaml.safe_dump({"targets": targets}))
    (root / "models" / "tv.py").write_text(FACTORIES)
    for name in models:
        profile = MODELS[name][1]
        recipe = {
            "source": {
                "torch": {
                    "factory": "models.tv:make",
                    "kwargs": {"name": name},
                    "inputs": [{"name": input_name} for input_name in profile],
                }
            },
            "profiles": [{"inputs": {input_name: s.as_recipe() for input_name, s in profile.items()}}],
        }
        (root / "recipes" / f"{name}.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    return root


def timed(command: list[str], cwd: Path) -> float:
    """Seconds one command took as a whole (it must succeed)."""
    start = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command[:3])} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    return seconds


def one_round(project: Path, work: Path, models: list[str]) -> dict[str, float]:
    """The three ways, each on a fresh copy of the project (no store: every export runs)."""
    seconds = {}
    for way, command in (
        ("trtflow", [sys.executable, "-m", "trtflow"]),
        ("trtflow, a fresh process each", [sys.executable, "-c", FRESH_PROCESS_EACH]),
    ):
        copy = work / way.replace(" ", "_").replace(",", "")
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(project, copy)
        seconds[way] = timed([*command, "-C", str(copy), "validate", "--export"], copy)
    hand = work / "by_hand"
    shutil.rmtree(hand, ignore_errors=True)
    hand.mkdir()
    script = BY_HAND.format(here=str(HERE), tests=str(HERE.parent / "tests"), models=models)
    seconds["by hand"] = timed([sys.executable, "-c", script], hand)
    return seconds


def main() -> None:
    """Write the project, run the rounds, print the medians."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["resnet18", "efficientnet_b0", "encoder"], choices=MODELS)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--workdir", type=Path, help="keep the projects here (default: a temporary folder)")
    args = parser.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="trtflow-export-cost-"))
    project = write_project(work / "project", args.models)
    rounds = []
    for index in range(args.rounds):
        rounds.append(one_round(project, work, args.models))
        print(f"round {index + 1}: " + ", ".join(f"{way} {s:.1f} s" for way, s in rounds[-1].items()), flush=True)
    median = {way: statistics.median(r[way] for r in rounds) for way in rounds[0]}
    print(f"\n{len(args.models)} exports ({', '.join(args.models)}), medians of {args.rounds} round(s):")
    for way, seconds in median.items():
        print(f"  {way:32s} {seconds:6.1f} s  {seconds / median['by hand']:.2f}x by hand")
    if args.workdir is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
