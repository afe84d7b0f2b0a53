"""Cold-build benchmark: trtflow against the TensorRT-RTX builds it wraps, on real architectures.

    python benchmarks/cold.py [--models resnet mobilenet encoder] [--workdir DIR]
    python benchmarks/cold.py --torchvision [--workdir DIR]
    python benchmarks/cold.py --only-by-hand [--rounds N] [--workdir DIR]

--torchvision measures the project the issue names instead of tests/zoo.py's small models: torchvision's ResNet-18
and MobileNetV3-small at their real sizes and a 4-layer encoder (benchmarks/torchvision_like.py), batch 1/8/32.

What is measured, in one run (every figure is a ratio against a baseline measured in the same run):
  1. a project of three real architectures from tests/zoo.py (ResNet-, MobileNetV3-style CNNs and a transformer
     encoder), fp32, for rtx-ampere (sm_86) and rtx-ada (sm_89): 6 engines;
  2. a cold `trtflow run -j 1 --json` (subprocess, wall time, seconds per stage kind), then the same six engines
     built directly with TensorRT-RTX in one process from the very ONNX each build stage read: goal 1 is
     trtflow wall / direct builds <= 2.0 (stretch 1.5); with --torchvision also the fair floor, the same work by hand
     in one process (onnxslim on each source model, ONNX Runtime running both on the opt and min shapes as the
     cleanup proof does, the builds from the slimmed model), run as a script in a fresh process as a user would run
     it (interpreter and imports included, as trtflow's wall includes them): goal 4 is trtflow wall / by hand
     <= 1.15, medians of --rounds interleaved pairs on fresh copies of the project; the same work timed inside that
     process, imports excluded, is printed beside it (--only-by-hand measures goal 4 alone, on the --torchvision
     project);
  3. packaging: the package stages' seconds against `tar cf` of the same package folders: goal 2 is <= 1.2;
  4. parallelism: the same cold run with `-j 2` in a fresh store, and, the issue's measure, independent builds: both
     projects rerun with their targets moved to other compute capabilities (only builds, verifies and packages
     are stale) at -j 1 and -j 2: goal 3 is (-j 1 wall) / (-j 2 wall) >= 1.8; and how many cores one direct build
     keeps busy (CPU seconds / wall: the bound on what two builds at once can gain);
  5. precision (with --precision-model M, default resnet; with --torchvision, the real-size ResNet-18): M at fp16
     and int8 cold, each precision stage's seconds against fp32 ONNX Runtime inference of the same 4 calibration
     batches (batch 8 at the opt shape) on the cleaned model (session included, one thread, as the stages run it):
     goal 4 is <= 10x. ModelOpt is imported once per worker, so the second precision stage a worker runs shows the
     cost without the import (--only-precision measures this part alone);
  6. each goal printed as met or missed with its numbers. Exit status 0 whatever the goals say (a benchmark
     reports; it does not gate), 2 if a run failed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from realmodels import cold_run, direct_builds, write_fleet_project  # noqa: E402
from torchvision_like import write_project as write_torchvision_project  # noqa: E402

GOALS = {"cold": 2.0, "cold_stretch": 1.5, "by_hand": 1.15, "packaging": 1.2, "parallel": 1.8, "precision": 10.0}


def seconds_by_kind(summary: dict) -> dict[str, float]:
    """Stage seconds summed per kind (export, cleanup, precision, build, verify, package)."""
    totals: dict[str, float] = {}
    for node in summary["nodes"]:
        totals[node["kind"]] = totals.get(node["kind"], 0.0) + (node["seconds"] or 0.0)
    return totals


def tar_seconds(packages: Path) -> float:
    """`tar cf` of every package folder, the way a shell would pack them (best of 3)."""
    folders = sorted(p for p in packages.iterdir() if p.is_dir() and not p.name.startswith("."))
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        for folder in folders:
            subprocess.run(
                ["tar", "cf", str(folder.parent / f".bench-{folder.name}.tar"), "-C", str(folder.parent), folder.name],
                check=True,
            )
        best = min(best, time.perf_counter() - started)
    for leftover in packages.glob(".bench-*.tar"):
        leftover.unlink()
    return best


def builds_only_rerun(root: Path, jobs: int) -> float:
    """Wall of a rerun in which only the builds (and their verify and package stages) are stale: both targets move to
    other compute capabilities, cleanups are cached, so the builds are independent of each other."""
    pipeline = root / "pipeline.yaml"
    pipeline.write_text(pipeline.read_text().replace("- sm_86", "- sm_80").replace("- sm_89", "- sm_120"))
    wall, summary = cold_run(root, jobs)
    assert {n["kind"] for n in summary["nodes"] if n["status"] == "built"} <= {"build", "verify", "package"}, (
        "not a builds-only rerun"
    )
    return wall


def direct_builds_at_once(root: Path, jobs: int) -> float:
    """Wall of the project's direct builds split over `jobs` spawned processes (each imported the backend first):
    what independent builds at once gain on this machine with trtflow out of the way, the ceiling of goal 3."""
    import concurrent.futures as futures
    import json
    import multiprocessing

    builds = sorted(n for n in json.loads((root / "trtflow.lock").read_text())["nodes"] if n.startswith("build:"))
    shares = [frozenset(builds[index::jobs]) for index in range(jobs)]
    with futures.ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        list(pool.map(_imported, [root] * jobs))
        started = time.perf_counter()
        list(pool.map(direct_builds, [root] * jobs, [None] * jobs, shares))
        return time.perf_counter() - started


def _imported(root: Path) -> None:
    """In a pool worker: the backend and the project imported (nothing built); held a moment so each worker gets one."""
    direct_builds(root, only=frozenset())
    time.sleep(1.0)


def precision_report(workdir: Path, model: str, torchvision: bool) -> None:
    """fp16 and int8 stage seconds of one model against fp32 ONNX Runtime inference of the same samples."""
    import json

    import numpy as np
    import onnxruntime as ort

    root = workdir / "project-precision"
    shutil.rmtree(root, ignore_errors=True)
    if torchvision:
        write_torchvision_project(root, workdir / "onnx-cache", (model,), ("fp16", "int8"))
    else:
        write_fleet_project(root, (model,), ("fp16", "int8"))
    for recipe in (root / "recipes").glob("*.yaml"):  # timed, not judged: a miss (int8 top-1 varies by CPU) warns
        recipe.write_text(recipe.read_text() + "verify: {on_fail: warn}\n")
    _, summary = cold_run(root, 1)
    lock = json.loads((root / "trtflow.lock").read_text())["nodes"]
    cleaned = lock[f"cleanup:{model}"]["outputs"]["model"]
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    batches = sorted((root / "calib" / model).iterdir())
    started = time.perf_counter()
    session = ort.InferenceSession(
        str(root / "artifacts/store/objects" / cleaned[:2] / cleaned), options, providers=["CPUExecutionProvider"]
    )
    for batch in batches:
        loaded = np.load(batch)
        feed = {session.get_inputs()[0].name: loaded} if isinstance(loaded, np.ndarray) else dict(loaded)
        session.run(None, feed)
    inference = time.perf_counter() - started
    print(
        f"\nprecision stages of {model} ({len(batches)} calibration batches; fp32 ONNX Runtime inference of them: "
        f"{inference:.2f} s):"
    )
    for node in summary["nodes"]:
        if node["kind"] == "precision":
            print(f"  {node['id']:<28} {node['seconds']:6.2f} s  {node['seconds'] / inference:6.1f}x fp32 inference")
    for node in summary["nodes"]:
        if node["kind"] == "precision":
            label = f"4. {node['id'].split('/')[-1]} precision / fp32 inference"
            print(verdict(label, node["seconds"] / inference, GOALS["precision"], "lower"))


def verdict(name: str, value: float, goal: float, better: str) -> str:
    """One line: the measured ratio against its goal, met or missed."""
    met = value <= goal if better == "lower" else value >= goal
    return (
        f"{name:<34} {value:6.2f}  goal {'<=' if better == 'lower' else '>='} {goal:<4}  {'met' if met else 'MISSED'}"
    )


def by_hand_script(root: Path) -> tuple[float, float]:
    """benchmarks/by_hand.py as a script in a fresh process: its wall seconds (interpreter and imports included),
    and the seconds of the work alone as that process timed them."""
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("by_hand.py")), str(root)],
        capture_output=True,
        text=True,
        check=True,
    )
    return time.perf_counter() - started, float(done.stdout.split()[-1])


def by_hand_rounds(workdir: Path, rounds: int) -> None:
    """Goal 4 in `rounds` interleaved pairs, each on a fresh copy of the project (a cold store): a cold `trtflow run
    -j 1`, then benchmarks/by_hand.py; each pair printed, and the ratio of the medians judged (one pair alone swings
    with the machine: 0.96x and 1.43x in two runs of the same version)."""
    walls, hands, works = [], [], []
    for index in range(rounds):
        root = workdir / f"by-hand-{index}"
        shutil.rmtree(root, ignore_errors=True)
        write_torchvision_project(root, workdir / "onnx-cache")
        walls.append(cold_run(root, 1)[0])
        hand, work = by_hand_script(root)
        hands.append(hand)
        works.append(work)
        print(f"   round {index + 1}: trtflow -j 1 {walls[-1]:.2f} s, by hand {hand:.2f} s wall ({work:.2f} s of work)")
    wall, hand, work = (statistics.median(values) for values in (walls, hands, works))
    print(
        f"the same work by hand, a script in one process (onnxslim, the proof, the builds): {hand:.2f} s wall, "
        f"{work:.2f} s of it past the interpreter and imports (medians of {rounds})"
    )
    print(verdict("4. cold -j 1 / the same work by hand", wall / hand, GOALS["by_hand"], "lower"))
    pairs = sorted(w / h for w, h in zip(walls, hands, strict=True))
    print(
        f"   (per round, each pair run back to back: median {statistics.median(pairs):.2f}x, "
        f"from {pairs[0]:.2f}x to {pairs[-1]:.2f}x; against the work alone, imports excluded: {wall / work:.2f}x)"
    )


def _precision(args: argparse.Namespace, workdir: Path) -> None:
    """The precision report of --precision-model (resnet means ResNet-18 in --torchvision mode)."""
    model = args.precision_model
    if args.torchvision:
        model = {"resnet": "resnet18", "mobilenet": "mobilenet_v3_small"}.get(model, model)
    precision_report(workdir, model, args.torchvision)


def main() -> None:
    """Run the corpus cold at -j 1 and -j 2, build its engines directly, and print the ratios against the goals."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["resnet", "mobilenet", "encoder"])
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved pairs for goal 4 (--torchvision)")
    parser.add_argument("--only-precision", action="store_true", help="skip the fp32 runs: time the precision stages")
    parser.add_argument("--only-by-hand", action="store_true", help="goal 4 alone: its rounds (the --torchvision trio)")
    parser.add_argument(
        "--precision-model", default="resnet", help="the model whose fp16/int8 stages are timed ('' to skip)"
    )
    parser.add_argument(
        "--torchvision",
        action="store_true",
        help="ResNet-18, MobileNetV3-small (real sizes) and an encoder, batch 1/8/32",
    )
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="trtflow-cold-")) if args.workdir is None else args.workdir
    if args.only_by_hand:
        by_hand_rounds(workdir, args.rounds)
        return
    if args.only_precision:
        _precision(args, workdir)
        return
    walls, summaries = {}, {}
    for jobs in (1, 2):
        root = workdir / f"project-j{jobs}"
        shutil.rmtree(root, ignore_errors=True)
        if args.torchvision:
            write_torchvision_project(root, workdir / "onnx-cache")
        else:
            write_fleet_project(root, tuple(args.models), ("fp32",))
        walls[jobs], summaries[jobs] = cold_run(root, jobs)
    root = workdir / "project-j1"
    cpu: dict[str, float] = {}
    direct = sum(direct_builds(root, cpu).values())
    busy = sum(cpu.values()) / direct  # cores one build keeps busy (the builder runs threads of its own)
    kinds = seconds_by_kind(summaries[1])
    tar = tar_seconds(root / "artifacts" / "packages")
    print(f"cold run -j 1: {walls[1]:.2f} s wall, {summaries[1]['built']} stages; -j 2: {walls[2]:.2f} s")
    print(
        f"direct TensorRT-RTX builds of the same {len([n for n in summaries[1]['nodes'] if n['kind'] == 'build'])} "
        f"engines: {direct:.2f} s"
    )
    print(
        "stage seconds by kind (-j 1): "
        + ", ".join(f"{k} {s:.2f}" for k, s in sorted(kinds.items(), key=lambda kv: -kv[1]))
    )
    print(f"packaging {kinds.get('package', 0.0):.2f} s; tar cf of the same folders {tar:.3f} s\n")
    print(verdict("1. cold -j 1 / direct builds", walls[1] / direct, GOALS["cold"], "lower"))
    print(verdict("   (stretch)", walls[1] / direct, GOALS["cold_stretch"], "lower"))
    if args.torchvision:
        by_hand_rounds(workdir, args.rounds)
    print(verdict("2. packaging / tar cf", kinds.get("package", 0.0) / max(tar, 1e-9), GOALS["packaging"], "lower"))
    print(verdict("3. -j 1 wall / -j 2 wall (whole run)", walls[1] / walls[2], GOALS["parallel"], "higher"))
    builds_only = {jobs: builds_only_rerun(workdir / f"project-j{jobs}", jobs) for jobs in (1, 2)}
    print(verdict("3. -j 1 / -j 2, independent builds", builds_only[1] / builds_only[2], GOALS["parallel"], "higher"))
    cores = os.cpu_count() or 1
    print(
        f"   one direct build keeps {busy:.2f} cores busy: on {cores} cores, two at once can gain at most "
        f"{min(2.0, cores / busy):.2f}x"
    )
    alone, at_once = sum(direct_builds(root).values()), direct_builds_at_once(root, 2)
    print(
        f"   what this machine gives: the same direct builds one after the other {alone:.2f} s, two processes at once "
        f"{at_once:.2f} s: {alone / at_once:.2f}x (the ceiling of goal 3 here, trtflow aside)"
    )
    if args.precision_model:
        _precision(args, workdir)
    print(f"(projects left in {workdir})")


if __name__ == "__main__":
    main()
