"""Ray executor overhead: the same cold run on the local process pool and on a local Ray instance, and a projection.

    python benchmarks/ray.py [--recipes 25] [--jobs 2] [--build-seconds 120]

What is measured, in one run, inside a network namespace with only loopback up (re-executed under `unshare -n`
when it can be, so Ray's traffic never leaves the machine):
  1. a project of N recipes (default 25) x 2 TensorRT-RTX targets, each with its own tiny ONNX model (the noop
     benchmark's), fp32: 2N builds among 7N stages;
  2. a cold `trtflow run -j JOBS --json` with the local executor, then the same project (fresh store) with
     `--executor ray` (a local Ray instance of JOBS CPUs; its start-up is timed apart);
  3. wall times, the median stage seconds of each kind on both (a Ray stage's seconds include shipping its
     inputs to the exchange and fetching its outputs), and the extra per stage: summed stage seconds, (ray - local) /
     stages;
  4. a projection for a build farm: 100 nodes in 3 GPU classes, a 500-recipe zoo at fp16 + int8 for 3 targets
     (3000 builds), each build --build-seconds long on its GPU (full TensorRT builds take minutes; this is an
     input, not a measurement), with the measured extra per stage added to every stage.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from noop import write_project  # noqa: E402


def cold(project: Path, jobs: int, *extra: str) -> tuple[float, dict]:
    """Wall seconds and --json summary of a cold run (the store removed first)."""
    shutil.rmtree(project / "artifacts", ignore_errors=True)
    shutil.rmtree(project / ".trtflow", ignore_errors=True)
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "trtflow", "-C", str(project), "run", "-j", str(jobs), "--json", *extra],
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"trtflow run {' '.join(extra)} exited {done.returncode}:\n{done.stderr[-3000:]}")
    return wall, json.loads(done.stdout)


def ray_start_seconds(jobs: int) -> float:
    """How long a local Ray instance takes to start and stop (paid once per run)."""
    started = time.perf_counter()
    subprocess.run(
        [
            sys.executable,
            "-c",
            f"import ray; ray.init(num_cpus={jobs}, include_dashboard=False, log_to_driver=False, "
            "logging_level='ERROR'); ray.shutdown()",
        ],
        check=True,
        capture_output=True,
    )
    return time.perf_counter() - started


def medians(summary: dict) -> dict[str, float]:
    """Median seconds per stage kind."""
    kinds: dict[str, list[float]] = {}
    for node in summary["nodes"]:
        kinds.setdefault(node["kind"], []).append(node["seconds"] or 0.0)
    return {kind: statistics.median(values) for kind, values in kinds.items()}


def projection(extra_per_stage: float, build_seconds: float) -> list[str]:
    """Wall of a 500-recipe zoo on 100 nodes in 3 GPU classes, with the measured extra per stage."""
    nodes_per_class, recipes, precisions, classes = 100 // 3, 500, 2, 3
    builds_per_class = recipes * precisions
    per_class = builds_per_class * (build_seconds + extra_per_stage) / nodes_per_class
    other_stages = recipes * (1 + precisions + precisions * classes + 1)  # cleanup, precision, verify, package
    other = other_stages * (2.0 + extra_per_stage) / 100  # ~2 s each on any node (measured order on this CPU)
    return [
        f"projection: 500 recipes x fp16/int8 x 3 GPU classes = {builds_per_class * classes} builds of "
        f"{build_seconds:g} s "
        f"on 3 x {nodes_per_class} nodes: ~{(per_class + other) / 60:.1f} min wall "
        f"({per_class / 60:.1f} min of builds per class, {other / 60:.1f} min of other stages); "
        f"Ray's extra {extra_per_stage:.2f} s per stage is {100 * extra_per_stage / build_seconds:.1f}% of a build"
    ]


def main() -> int:
    """Run the project locally and on a loopback Ray cluster and print the per-stage overhead."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipes", type=int, default=25)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument(
        "--build-seconds", type=float, default=120.0, help="one full TensorRT build on its GPU (projection input)"
    )
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not args.inside and shutil.which("unshare") and os.geteuid() == 0:
        command = f"ip link set lo up && exec {sys.executable} {Path(__file__).resolve()} --inside " + " ".join(
            sys.argv[1:]
        )
        return subprocess.run(["unshare", "-n", "bash", "-c", command]).returncode
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    with tempfile.TemporaryDirectory(prefix="trtflow-ray-bench-") as tmp:
        os.environ["HOME"] = tmp  # Ray keeps a token for local instances in ~/.ray: not the user's
        project = Path(tmp) / "project"
        project.mkdir()
        write_project(project, args.recipes)
        local_wall, local = cold(project, args.jobs)
        ray_wall, distributed = cold(project, args.jobs, "--executor", "ray")
        startup = ray_start_seconds(args.jobs)
    stages = len(local["nodes"])
    local_busy, ray_busy = (sum(n["seconds"] or 0.0 for n in s["nodes"]) for s in (local, distributed))
    # a stage's seconds, dispatch to collection: shipping, the Ray task, fetching
    extra = (ray_busy - local_busy) / stages
    print(f"{stages} stages ({sum(n['kind'] == 'build' for n in local['nodes'])} builds), -j {args.jobs}")
    print(
        f"local pool: {local_wall:.2f} s wall; Ray local instance: {ray_wall:.2f} s wall (a Ray start and stop alone: "
        f"{startup:.2f} s)"
    )
    print(
        f"ratio ray / local: {ray_wall / local_wall:.2f}x; without Ray's start-up: "
        f"{(ray_wall - startup) / local_wall:.2f}x"
    )
    print(f"stage seconds summed: local {local_busy:.2f} s, ray {ray_busy:.2f} s: {extra:+.3f} s per stage on Ray")
    local_m, ray_m = medians(local), medians(distributed)
    for kind in local_m:
        print(f"  median {kind:<9} stage: local {local_m[kind]:6.3f} s   ray {ray_m.get(kind, float('nan')):6.3f} s")
    print("\n".join(projection(max(extra, 0.0), args.build_seconds)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
