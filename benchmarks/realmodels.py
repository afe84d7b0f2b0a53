"""Real-model benchmark: a cold `trtflow run` of the test corpus beside direct TensorRT-RTX builds of the same graphs.

    python benchmarks/realmodels.py [--models resnet mobilenet ...] [--precisions fp32 fp16 int8] [--jobs 2] [--workdir
    DIR]

What is measured, in one run:
  1. a project of the corpus in tests/zoo.py (ResNet-, MobileNetV3-, EfficientNet-style CNNs, an LSTM over 50 steps,
     a transformer encoder, an MLP, legacy IR-3 ONNX, a model whose weights are computed by ops), each an ONNX source
     with its profile and 4 calibration batches, built for rtx-turing (sm_75), rtx-ampere (sm_86) and rtx-ada (sm_89),
     with `exclude: [{precision: fp32, target: rtx-turing}]` (TensorRT-RTX has no fp32 GEMM on Turing);
  2. the cold run: `python -m trtflow run -j JOBS --json` as a subprocess, wall time, and seconds per stage kind
     (summed over stages, from the run's JSON); it must exit 0 and write every package;
  3. the baseline: the same (model, precision, target) engines built directly with TensorRT-RTX in one process,
     from the very ONNX each build stage read (the precision stage's output, taken from the store);
  4. a table per model: engines, trtflow's wall time, the direct builds' seconds, and the ratio; then the totals.
The ratio is what to watch: everything trtflow adds around the builds (export, cleanup and its proof, AutoCast and
PTQ with their accuracy checks, verification, packaging, process start-up) over the builds themselves.
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

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from fleet import MODELS, PRECISIONS, write_fleet_project  # noqa: E402
from zoo import ZOO  # noqa: E402


def cold_run(root: Path, jobs: int) -> tuple[float, dict]:
    """Wall seconds and the --json summary of a cold `trtflow run`."""
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "trtflow", "-C", str(root), "run", "-j", str(jobs), "--json"],
        capture_output=True,
        text=True,
    )
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        failed = (
            [n for n in json.loads(done.stdout or '{"nodes": []}')["nodes"] if n["status"] == "failed"]
            if done.stdout
            else []
        )
        sys.exit(f"trtflow run failed (exit {done.returncode}): {failed or done.stderr[-2000:]}")
    return seconds, json.loads(done.stdout)


def direct_builds(
    root: Path, cpu: dict[str, float] | None = None, only: frozenset[str] | None = None
) -> dict[str, float]:
    """Seconds per build node (of `only`, if given), building each engine again directly from the ONNX its build
    stage read (`cpu`, if given, gets the CPU seconds of each build, all the builder's threads together)."""
    from trtflow.backends.base import BuildRequest, get_backend
    from trtflow.recipe import load_project
    from trtflow.run.dag import dag_from_project

    lock = json.loads((root / "trtflow.lock").read_text())["nodes"]
    backend, seconds = get_backend("tensorrt-rtx"), {}
    objects = root / "artifacts" / "store" / "objects"
    with tempfile.TemporaryDirectory() as scratch:
        for node in dag_from_project(load_project(root)):
            if node.kind != "build" or (only is not None and node.id not in only):
                continue
            model = lock[node.deps[0].node]["outputs"]["model"]
            onnx_path = Path(scratch) / "model.onnx"
            shutil.copyfile(objects / model[:2] / model, onnx_path)
            profiles = [{name: (s["min"], s["opt"], s["max"]) for name, s in p.items()} for p in node.params.profiles]
            request = BuildRequest(
                onnx_path=onnx_path,
                engine_path=Path(scratch) / "engine",
                compute_capabilities=list(node.params.compute_capabilities),
                profiles=profiles,
                options=node.params.builder_options(),
            )
            started, used = time.perf_counter(), time.process_time()
            backend.engine_from_onnx(request)
            seconds[node.id] = time.perf_counter() - started
            if cpu is not None:
                cpu[node.id] = time.process_time() - used
    return seconds


def report(wall: float, summary: dict, direct: dict[str, float], models: list[str]) -> None:
    """Per model and in all: engines, direct build seconds, trtflow's stage seconds, and the ratio."""
    by_kind: dict[str, float] = {}
    for node in summary["nodes"]:
        by_kind[node["kind"]] = by_kind.get(node["kind"], 0.0) + (node["seconds"] or 0.0)
    print(f"{'model':<14} {'engines':>7} {'direct s':>9} {'trtflow stage s':>16} {'ratio':>7}")
    for name in models:
        builds = {k: v for k, v in direct.items() if k.split(":")[1].split("/")[0] == name}
        stages = sum(n["seconds"] or 0.0 for n in summary["nodes"] if n["recipe"] == name)
        print(
            f"{name:<14} {len(builds):>7} {sum(builds.values()):>9.2f} {stages:>16.2f} "
            f"{stages / max(sum(builds.values()), 1e-9):>6.1f}x"
        )
    total = sum(direct.values())
    print(
        f"\ncold trtflow run: {wall:.1f} s wall ({summary['built']} stages built); direct builds of the same "
        f"{len(direct)} engines: {total:.1f} s; ratio {wall / total:.1f}x"
    )
    print(
        "stage seconds by kind (summed over stages, -j runs them in parallel): "
        + ", ".join(f"{kind} {s:.1f}" for kind, s in sorted(by_kind.items(), key=lambda kv: -kv[1]))
    )


def main() -> None:
    """Build the corpus cold with trtflow, then each engine directly, and print the comparison."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=ZOO)
    parser.add_argument("--precisions", nargs="+", default=list(PRECISIONS))
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--workdir", type=Path)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="trtflow-realmodels-")) if args.workdir is None else args.workdir
    root = workdir / "project"
    shutil.rmtree(root, ignore_errors=True)
    write_fleet_project(root, tuple(args.models), tuple(args.precisions))
    wall, summary = cold_run(root, args.jobs)
    report(wall, summary, direct_builds(root), args.models)
    print(f"(project left in {root})")


if __name__ == "__main__":
    main()
