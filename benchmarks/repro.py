"""Reproducibility benchmark: distinct engines per model over N rebuilds, hermetic workers vs. today's pool, and
what a hermetic worker costs per build.

    python benchmarks/repro.py [--models resnet mobilenet efficientnet encoder lstm] [-n 6] [--cc sm_89]

For each model of the test corpus (tests/zoo.py), fp32, one target, the same build stage (trtflow.stages.build) is run:
  1. pool: N builds in one long-lived worker process, as the process pool ran them (`run_task` in a process that
     has built before);
  2. plain: N builds, each in a fresh ordinary process (address-space randomization on);
  3. hermetic: N builds in hermetic workers (executors.hermetic: fresh process, ASLR off, fixed environment, slot
     folder and names);
  4. forked: N builds in hermetic workers forked by a build server (what `trtflow run` does), from two servers in
     turn (N/2 builds each: a server started later must give the same bytes as one started earlier);
and prints, per mode, the distinct engine byte sequences and distinct canonical digests (backends.engine_identity),
then the seconds per build of the pool, of fresh hermetic workers and of forked ones, and their ratios to the pool
(what a fresh process and its imports cost, and what a fork costs).
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from zoo import ZOO, zoo_model  # noqa: E402

from trtflow.backends.engine_identity import canonical_digest  # noqa: E402
from trtflow.executors.forking import ForkServers  # noqa: E402
from trtflow.executors.hermetic import run_hermetic  # noqa: E402
from trtflow.util.settings import Settings  # noqa: E402

POOL = """
import pickle, sys, time
from trtflow.executors import run_task
for path in sys.argv[1:]:
    task = pickle.loads(open(path, "rb").read())
    started = time.perf_counter(); result = run_task(task)
    print(result.files["engine"], time.perf_counter() - started, flush=True)
"""


def pool_builds(model, cc: str, n: int, scratch: Path) -> tuple[list[Path], list[float]]:
    """N builds in one worker process, one after another."""
    import pickle

    paths = []
    for index in range(n):
        path = scratch / f"pool-task-{index}.pickle"
        path.write_bytes(pickle.dumps(model.build_task(cc, scratch / f"pool-{index}")))
        paths.append(str(path))
    lines = subprocess.run(
        [sys.executable, "-c", POOL, *paths], check=True, capture_output=True, text=True
    ).stdout.split("\n")
    done = [line.rsplit(" ", 1) for line in lines if line.strip()]
    return [Path(engine) for engine, _ in done], [float(seconds) for _, seconds in done]


def plain_builds(model, cc: str, n: int, scratch: Path) -> list[Path]:
    """N builds, each in a fresh ordinary process."""
    import pickle

    engines = []
    for index in range(n):
        path = scratch / f"plain-task-{index}.pickle"
        path.write_bytes(pickle.dumps(model.build_task(cc, scratch / f"plain-{index}")))
        line = subprocess.run(
            [sys.executable, "-c", POOL, str(path)], check=True, capture_output=True, text=True
        ).stdout.split()
        engines.append(Path(line[0]))
    return engines


def hermetic_builds(model, cc: str, n: int, scratch: Path, forked: bool = False) -> tuple[list[Path], list[float]]:
    """N builds in hermetic workers, timed end to end (process start-up or fork included); `forked`: by two build
    servers (started before the builds, as a run starts them), N/2 builds each."""
    engines, seconds = [], []
    for half in (range(n // 2), range(n // 2, n)) if forked else (range(n),):
        servers = ForkServers.for_builds(Settings.from_environ()) if forked else None
        if servers is not None:
            servers.fill(1)
        for index in half:
            started = time.perf_counter()
            result = run_hermetic(model.build_task(cc, scratch / f"hermetic-{index}"), Settings.from_environ(), servers)
            seconds.append(time.perf_counter() - started)
            if result.error:
                sys.exit(f"{model.name}: hermetic build failed: {result.error}")
            engines.append(Path(result.files["engine"]))
        if servers is not None:
            servers.close()
    return engines, seconds


def distinct(engines: list[Path]) -> str:
    """`raw/canonical` distinct counts."""
    raw = {hashlib.sha256(path.read_bytes()).hexdigest() for path in engines}
    return f"{len(raw)}/{len({canonical_digest(path) for path in engines})}"


def main() -> None:
    """Build each model N times per mode and print the distinct counts and the cost ratio."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--models", nargs="+", default=["resnet", "mobilenet", "efficientnet", "encoder", "lstm"], choices=ZOO
    )
    parser.add_argument("-n", type=int, default=6)
    parser.add_argument("--cc", default="sm_89")
    args = parser.parse_args()
    print(f"distinct engines over {args.n} builds, as raw bytes / canonical digests (1/1: byte-reproducible)")
    print(
        f"{'model':<14} {'pool':>8} {'plain':>8} {'hermetic':>9} {'forked':>7} {'pool s/build':>13} "
        f"{'hermetic s/build':>17} {'forked s/build':>15} {'ratios':>12}"
    )
    ratios, forked_ratios = [], []
    with tempfile.TemporaryDirectory() as scratch_dir:
        scratch = Path(scratch_dir)
        for name in args.models:
            model = zoo_model(name, scratch / "zoo")
            pooled, pool_seconds = pool_builds(model, args.cc, args.n, scratch / name / "pool")
            plain = plain_builds(model, args.cc, args.n, scratch / name / "plain")
            hermetic, hermetic_seconds = hermetic_builds(model, args.cc, args.n, scratch / name / "hermetic")
            forked, forked_seconds = hermetic_builds(model, args.cc, args.n, scratch / name / "forked", forked=True)
            pool_s, hermetic_s = statistics.median(pool_seconds), statistics.median(hermetic_seconds)
            forked_s = statistics.median(forked_seconds)
            ratios.append(hermetic_s / pool_s)
            forked_ratios.append(forked_s / pool_s)
            print(
                f"{name:<14} {distinct(pooled):>8} {distinct(plain):>8} {distinct(hermetic):>9} {distinct(forked):>7} "
                f"{pool_s:>13.2f} {hermetic_s:>17.2f} {forked_s:>15.2f} {ratios[-1]:>5.2f}x {forked_ratios[-1]:>5.2f}x"
            )
    print(
        f"\nper build, against the pool: fresh hermetic worker median {statistics.median(ratios):.2f}x (a fresh "
        f"process, its imports and the slot), forked hermetic worker {statistics.median(forked_ratios):.2f}x (a fork "
        "and the slot)"
    )


if __name__ == "__main__":
    main()
