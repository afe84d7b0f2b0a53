"""No-op benchmark: how long `trtflow run` takes when every stage is already cached.

    python benchmarks/noop.py [--recipes 100] [--workdir DIR] [--jobs 2] [--repeat 5]

The goal (from the issue): a no-op `trtflow run` of a realistic project finishes in under 1 s on this
2-core machine. A no-op happens on every CI job and every edit-run cycle; it only has to load the
project, compute every stage key and find it in the store, so its cost should be close to Python's
own start-up, not grow with the number of stages.

What is measured, each as a real subprocess (`sys.executable ...`), wall-clock time:
  1. a generated project: N recipes (default 100) x 2 tensorrt-rtx targets (sm_86, sm_89), each with
     its own tiny ONNX model (Conv+Relu, weights seeded by the recipe number), fp32, one profile with a
     dynamic batch. That is 4 stages per recipe (cleanup, 2 builds, package): 400 stages by default;
  2. the full build, `python -m trtflow -C DIR run -j JOBS --json`, once (must exit 0);
  3. the same command again, --repeat times: the no-op (its JSON must say built == 0). The first no-op
     after the build is reported on its own line, since it may re-hash files written less than
     2 s before they were first hashed (the stat cache's racy window);
  4. the baselines, measured the same way in the same run: `python -c pass` (bare interpreter),
     `python -c "import trtflow"` (the baseline the goal is set against) and
     `python -c "import trtflow.cli"` (what every command pays before doing anything);
  5. a table of min/median, the ratios of the no-op to the baselines, and the goal check
     (median no-op < 1 s). Exit status: 0 goal met, 1 goal missed, 2 a correctness check failed;
  6. where the no-op's time goes: one no-op under cProfile (top trtflow functions by cumulative
     time) and one under `-X importtime` (slowest top-level imports).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper

REPO = Path(__file__).resolve().parent.parent
GOAL_SECONDS = 1.0

PIPELINE = (REPO / "pipeline.yaml").read_text()  # the example fleet: rtx-ampere sm_86, rtx-ada sm_89

RECIPE = """\
source:
  onnx: models/{name}.onnx
precisions: [fp32]
profiles:
  - inputs:
      input: {{min: [1, 1, 8, 8], opt: [4, 1, 8, 8], max: [8, 1, 8, 8]}}
"""


class CheckFailed(Exception):
    """A run did not do what the benchmark relies on (so its timings would mean nothing)."""


# ---------------------------------------------------------------------------------------------
# the project


def load_make_models():
    """models/make_models.py, imported by path (its seeded-initializer and model helpers)."""
    spec = importlib.util.spec_from_file_location("make_models", REPO / "models" / "make_models.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tiny_model(make_models, seed: int):
    """Conv(1->4, 3x3) + Relu on [batch, 1, 8, 8]; the weights (so the file) differ for every seed."""
    rng = np.random.default_rng(seed)
    inits = [make_models._init(rng, "conv.w", 4, 1, 3, 3), make_models._init(rng, "conv.b", 4)]
    nodes = [
        helper.make_node("Conv", ["input", "conv.w", "conv.b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["output"]),
    ]
    graph = helper.make_graph(
        nodes, f"tiny_{seed}",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 1, 8, 8])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", 4, 8, 8])],
        inits,
    )
    return make_models._model(graph)


def write_project(root: Path, recipes: int) -> None:
    """pipeline.yaml, recipes/rNNN.yaml and models/rNNN.onnx for `recipes` recipes (other recipes removed)."""
    make_models = load_make_models()
    (root / "recipes").mkdir(parents=True, exist_ok=True)
    (root / "models").mkdir(exist_ok=True)
    names = [f"r{index:04d}" for index in range(recipes)]
    for old in (root / "recipes").glob("*.yaml"):
        if old.stem not in names:
            old.unlink()
    write_if_changed(root / "pipeline.yaml", PIPELINE.encode())
    for index, name in enumerate(names):
        write_if_changed(root / "models" / f"{name}.onnx", tiny_model(make_models, index).SerializeToString())
        write_if_changed(root / "recipes" / f"{name}.yaml", RECIPE.format(name=name).encode())


def write_if_changed(path: Path, data: bytes) -> None:
    """Leave an identical file untouched, so re-using a --workdir keeps its mtimes (and stat cache)."""
    if not path.is_file() or path.read_bytes() != data:
        path.write_bytes(data)


# ---------------------------------------------------------------------------------------------
# timing


def timed(args: list[str]) -> tuple[float, subprocess.CompletedProcess]:
    """Wall seconds of one subprocess, and its result (stdout/stderr captured, stdin not a terminal)."""
    started = time.perf_counter()
    result = subprocess.run(args, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    return time.perf_counter() - started, result


def run_command(project: Path, jobs: int) -> list[str]:
    return [sys.executable, "-m", "trtflow", "-C", str(project), "run", "-j", str(jobs), "--json"]


def checked_summary(result: subprocess.CompletedProcess, what: str) -> dict:
    """The --json summary of a run that must have exited 0."""
    if result.returncode != 0:
        raise CheckFailed(f"{what} exited {result.returncode}:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout)


def full_build(project: Path, jobs: int) -> tuple[float, dict]:
    seconds, result = timed(run_command(project, jobs))
    summary = checked_summary(result, "the full build")
    if summary["failed"] or summary["skipped"]:
        raise CheckFailed(f"the full build had {summary['failed']} failed, {summary['skipped']} skipped stages")
    return seconds, summary


def noop_once(project: Path, jobs: int) -> float:
    seconds, result = timed(run_command(project, jobs))
    summary = checked_summary(result, "the no-op run")
    if summary["built"] != 0 or summary["cached"] != len(summary["nodes"]):
        raise CheckFailed(f"the no-op run was not a no-op: built={summary['built']} cached={summary['cached']}")
    return seconds


def python_once(code: str) -> float:
    seconds, result = timed([sys.executable, "-c", code])
    if result.returncode != 0:
        raise CheckFailed(f"python -c {code!r} exited {result.returncode}:\n{result.stderr[-2000:]}")
    return seconds


def repeat(measure, repetitions: int) -> list[float]:
    """`repetitions` timings after one untimed warm-up (bytecode caches, page cache)."""
    measure()
    return [measure() for _ in range(repetitions)]


# ---------------------------------------------------------------------------------------------
# where the time goes


def cprofile_noop(project: Path, jobs: int, top: int = 10) -> list[str]:
    """One no-op run under cProfile: the top trtflow functions, and the library calls they spend time in."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "noop.prof"
        _, result = timed([sys.executable, "-m", "cProfile", "-o", str(out), *run_command(project, jobs)[1:]])
        checked_summary(result, "the profiled no-op run")
        stats = pstats.Stats(str(out)).stats
    total = max(ct for _, _, _, ct, _ in stats.values())
    lines = [f"profiled no-op: {total:.3f} s in all (cProfile adds overhead); module bodies (imports) left out, see below.",
             "top trtflow functions by cumulative time:", f"  {'cum s':>7} {'own s':>7} {'calls':>7}  function"]
    own = sorted(((ct, tt, nc, key) for key, (_, nc, tt, ct, _) in stats.items() if _in_trtflow(key)), reverse=True)
    lines += [f"  {ct:7.3f} {tt:7.3f} {nc:7d}  {_where(key)}" for ct, tt, nc, key in own[:top]]
    lines += ["library functions called directly by trtflow code, by cumulative time spent in those calls:",
              f"  {'cum s':>7} {'calls':>7}  function  <- called from"]
    lines += [f"  {ct:7.3f} {nc:7d}  {_where(key)}  <- {callers}" for ct, nc, key, callers in _library_calls(stats)[:top]]
    return lines


def _in_trtflow(key: tuple) -> bool:
    return f"{os.sep}trtflow{os.sep}" in key[0] and key[2] != "<module>"


def _where(key: tuple) -> str:
    filename, line, name = key
    for mark in (f"{os.sep}trtflow{os.sep}", f"{os.sep}site-packages{os.sep}", f"{os.sep}lib{os.sep}"):
        if mark in filename:
            filename = filename[filename.rfind(mark) + len(mark):]
            break
    return f"{filename}:{line} {name}" if line else name


def _library_calls(stats: dict) -> list[tuple]:
    """(cumulative s, calls, function, trtflow callers) for non-trtflow functions that trtflow calls."""
    rows = []
    for key, (_, _, _, _, callers) in stats.items():
        if f"{os.sep}trtflow{os.sep}" in key[0]:
            continue
        ours = {caller: v for caller, v in callers.items() if _in_trtflow(caller)}
        if ours:
            names = ", ".join(sorted({caller[2] for caller in ours}))
            rows.append((sum(v[3] for v in ours.values()), sum(v[0] for v in ours.values()), key, names))
    return sorted(rows, key=lambda row: -row[0])


def importtime_noop(project: Path, jobs: int, top: int = 10) -> list[str]:
    """Import cost of one no-op run: self time summed by top-level package, and trtflow's modules."""
    _, result = timed([sys.executable, "-X", "importtime", *run_command(project, jobs)[1:]])
    checked_summary(result, "the -X importtime no-op run")
    rows = _importtime_rows(result.stderr)
    by_package: dict[str, int] = {}
    for self_us, _, name in rows:
        by_package[name.split(".")[0]] = by_package.get(name.split(".")[0], 0) + self_us
    ours = sorted(((cumulative, name) for _, cumulative, name in rows if name.startswith("trtflow")), reverse=True)
    lines = [f"imports of a no-op run (-X importtime): {sum(by_package.values()) / 1e6:.3f} s in all; by top-level package",
             "(module bodies summed, no overlap):"]
    lines += [f"  {us / 1e6:7.3f} s  {name}" for name, us in sorted(by_package.items(), key=lambda kv: -kv[1])[:top]]
    lines += ["trtflow modules, cumulative (including everything they import first):"]
    lines += [f"  {us / 1e6:7.3f} s  {name}" for us, name in ours[:top] if us >= 1000]
    return lines


def _importtime_rows(stderr: str) -> list[tuple[int, int, str]]:
    """(self us, cumulative us, module) for every line `-X importtime` wrote."""
    rows = []
    for line in stderr.splitlines():
        if line.startswith("import time:") and "cumulative" not in line:
            self_us, cumulative, name = line[len("import time:"):].split("|")
            rows.append((int(self_us), int(cumulative), name.strip()))
    return rows


# ---------------------------------------------------------------------------------------------
# report


def table(rows: dict[str, list[float]]) -> list[str]:
    lines = [f"{'measurement':<32} {'n':>3} {'min s':>8} {'median s':>9}"]
    for name, values in rows.items():
        lines.append(f"{name:<32} {len(values):>3} {min(values):8.3f} {statistics.median(values):9.3f}")
    return lines


def ratios(noop: list[float], baselines: dict[str, list[float]]) -> list[str]:
    lines = []
    for name, values in baselines.items():
        by_min, by_median = min(noop) / min(values), statistics.median(noop) / statistics.median(values)
        lines.append(f"no-op run / {name:<31} {by_min:5.1f}x (min)  {by_median:5.1f}x (median)")
    return lines


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipes", type=positive, default=100, help="recipes to generate (4 stages each)")
    parser.add_argument("--workdir", type=Path, help="project folder to use (default: a temporary one)")
    parser.add_argument("--jobs", type=positive, default=2, help="trtflow run -j")
    parser.add_argument("--repeat", type=positive, default=5, help="timed repetitions of each measurement")
    parser.add_argument("--no-profile", action="store_true", help="skip the cProfile / importtime breakdown")
    return parser.parse_args(argv)


def measure(project: Path, jobs: int, repetitions: int) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """(no-op timings, baseline timings), each by the name it is shown under."""
    noop = {"first no-op after the build": [noop_once(project, jobs)],
            "no-op trtflow run": repeat(lambda: noop_once(project, jobs), repetitions)}
    baselines = {f"python -c {code!r}": repeat(lambda: python_once(code), repetitions)
                 for code in ("pass", "import trtflow", "import trtflow.cli")}
    return noop, baselines


def benchmark(project: Path, args: argparse.Namespace) -> int:
    """Write the project, build it, time the no-op and the baselines, print the report; 0 if the goal is met."""
    started = time.perf_counter()
    write_project(project, args.recipes)
    print(f"project: {project} ({args.recipes} recipes x 2 targets, written in {time.perf_counter() - started:.2f} s)")
    seconds, summary = full_build(project, args.jobs)
    print(f"full build: {seconds:.2f} s wall, exit 0, {summary['built']} built, {summary['cached']} cached (-j {args.jobs})")
    noop, baselines = measure(project, args.jobs, args.repeat)
    print("\n".join(["", *table({**noop, **baselines}), "", *ratios(noop["no-op trtflow run"], baselines)]))
    if not args.no_profile:
        print("\n".join(["", *cprofile_noop(project, args.jobs), "", *importtime_noop(project, args.jobs)]))
    median = statistics.median(noop["no-op trtflow run"])
    passed = median < GOAL_SECONDS
    stages = summary["cached"] + summary["built"]
    print(f"\nno-op under {GOAL_SECONDS:g} s: {'PASS' if passed else 'FAIL'} (median {median:.3f} s, {stages} stages)")
    return 0 if passed else 1


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if args.workdir is not None:
            args.workdir.mkdir(parents=True, exist_ok=True)
            return benchmark(args.workdir.resolve(), args)
        with tempfile.TemporaryDirectory(prefix="trtflow-noop-") as tmp:
            return benchmark(Path(tmp), args)
    except CheckFailed as exc:
        print(f"check failed: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
