"""No-op benchmark: how long `trtflow run` takes when every stage is already cached, from 1000 to 10,000 stages.

    python benchmarks/noop.py [--stages 1000 3000 10000] [--workdir DIR] [--jobs 2] [--repeat 5]
                              [--dvc PATH] [--dvc-stages 1000 3000] [--no-profile]

A no-op happens on every CI job and every edit-run cycle; it only has to load the project, compute every stage
key and find it in the store, so its cost should stay close to Python's start-up and grow slowly with stages.

What is measured, each as a real subprocess (`sys.executable ...`), wall-clock time:
  1. baselines: `python -c pass`, `python -c "import trtflow"`, `python -c "import trtflow.cli"` (what every
     command pays before doing anything);
  2. for each size: a generated project of N/7 recipes x 2 tensorrt-rtx targets (sm_86, sm_89), each recipe with
     its own tiny ONNX model (Conv+Relu, weights seeded by the recipe number), fp32: 7 stages per recipe. It is
     built once with `trtflow run -j JOBS --json` (kept in --workdir, so a second benchmark run skips the builds),
     then, 2 s later (the memo does not trust newer files), one no-op that plans every stage and remembers the
     answer (trtflow/run/runmemo.py), the no-op --repeat times (answered from the memo; its JSON must say built == 0),
     and the no-op planning every stage (memo removed first) --repeat/2 times;
  3. at the --dvc-stages sizes, when DVC is installed: the same no-op of a DVC project of the same shape
     (benchmarks/dvc_twin.py: same stages, edges and source files; `dvc repro` must run nothing);
  4. a table per size, the slopes (least squares, ms per stage), and the goals: a no-op at 3000 stages <= 0.6 s,
     >= 50x faster than DVC there, <= 0.1 ms per stage. Exit status: 0 goals met, 1 a goal missed, 2 a check failed;
  5. where the largest no-op's time goes: cProfile (top trtflow functions) and `-X importtime`.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
import dvc_twin  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
STAGES_PER_RECIPE = 7  # cleanup, precision, 2 builds, 2 verifies, package
GOAL_STAGES = 3000
GOAL_SECONDS = 0.6  # a no-op at GOAL_STAGES stages
GOAL_VS_DVC = 50.0  # at least this many times faster than DVC at GOAL_STAGES
GOAL_SLOPE_MS = 0.1  # per stage

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
        nodes,
        f"tiny_{seed}",
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
    """The `trtflow run` command line for the project with `jobs` jobs."""
    return [sys.executable, "-m", "trtflow", "-C", str(project), "run", "-j", str(jobs), "--json"]


def checked_summary(result: subprocess.CompletedProcess, what: str) -> dict:
    """The --json summary of a run that must have exited 0."""
    if result.returncode != 0:
        raise CheckFailed(f"{what} exited {result.returncode}:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout)


def full_build(project: Path, jobs: int) -> tuple[float, dict]:
    """Build the project from scratch: its seconds and the run's JSON summary."""
    seconds, result = timed(run_command(project, jobs))
    summary = checked_summary(result, "the full build")
    if summary["failed"] or summary["skipped"]:
        raise CheckFailed(f"the full build had {summary['failed']} failed, {summary['skipped']} skipped stages")
    return seconds, summary


def noop_once(project: Path, jobs: int, replan: bool = False) -> float:
    """One no-op run; `replan`: without the remembered no-op (trtflow/run/runmemo.py), so every stage is resolved."""
    if replan:
        shutil.rmtree(project / ".trtflow", ignore_errors=True)
    seconds, result = timed(run_command(project, jobs))
    summary = checked_summary(result, "the no-op run")
    if summary["built"] != 0 or summary["cached"] != len(summary["nodes"]):
        raise CheckFailed(f"the no-op run was not a no-op: built={summary['built']} cached={summary['cached']}")
    return seconds


def python_once(code: str) -> float:
    """Seconds one fresh interpreter takes to run `code` (a baseline for the no-op)."""
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
    lines = [
        f"profiled no-op: {total:.3f} s in all (cProfile adds overhead); module bodies (imports) left out, see below.",
        "top trtflow functions by cumulative time:",
        f"  {'cum s':>7} {'own s':>7} {'calls':>7}  function",
    ]
    own = sorted(((ct, tt, nc, key) for key, (_, nc, tt, ct, _) in stats.items() if _in_trtflow(key)), reverse=True)
    lines += [f"  {ct:7.3f} {tt:7.3f} {nc:7d}  {_where(key)}" for ct, tt, nc, key in own[:top]]
    lines += [
        "library functions called directly by trtflow code, by cumulative time spent in those calls:",
        f"  {'cum s':>7} {'calls':>7}  function  <- called from",
    ]
    lines += [
        f"  {ct:7.3f} {nc:7d}  {_where(key)}  <- {callers}" for ct, nc, key, callers in _library_calls(stats)[:top]
    ]
    return lines


def _in_trtflow(key: tuple) -> bool:
    return f"{os.sep}trtflow{os.sep}" in key[0] and key[2] != "<module>"


def _where(key: tuple) -> str:
    filename, line, name = key
    for mark in (f"{os.sep}trtflow{os.sep}", f"{os.sep}site-packages{os.sep}", f"{os.sep}lib{os.sep}"):
        if mark in filename:
            filename = filename[filename.rfind(mark) + len(mark) :]
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
    lines = [
        f"imports of a no-op run (-X importtime): {sum(by_package.values()) / 1e6:.3f} s in all; by top-level package",
        "(module bodies summed, no overlap):",
    ]
    lines += [f"  {us / 1e6:7.3f} s  {name}" for name, us in sorted(by_package.items(), key=lambda kv: -kv[1])[:top]]
    lines += ["trtflow modules, cumulative (including everything they import first):"]
    lines += [f"  {us / 1e6:7.3f} s  {name}" for us, name in ours[:top] if us >= 1000]
    return lines


def _importtime_rows(stderr: str) -> list[tuple[int, int, str]]:
    """(self us, cumulative us, module) for every line `-X importtime` wrote."""
    rows = []
    for line in stderr.splitlines():
        if line.startswith("import time:") and "cumulative" not in line:
            self_us, cumulative, name = line[len("import time:") :].split("|")
            rows.append((int(self_us), int(cumulative), name.strip()))
    return rows


# ---------------------------------------------------------------------------------------------
# report


def table(rows: dict[str, list[float]]) -> list[str]:
    """The timing rows as aligned text: median, min and max of each."""
    lines = [f"{'measurement':<32} {'n':>3} {'min s':>8} {'median s':>9}"]
    for name, values in rows.items():
        lines.append(f"{name:<32} {len(values):>3} {min(values):8.3f} {statistics.median(values):9.3f}")
    return lines


def ratios(noop: list[float], baselines: dict[str, list[float]]) -> list[str]:
    """The no-op's median against each baseline's, as ratios."""
    lines = []
    for name, values in baselines.items():
        by_min, by_median = min(noop) / min(values), statistics.median(noop) / statistics.median(values)
        lines.append(f"no-op run / {name:<31} {by_min:5.1f}x (min)  {by_median:5.1f}x (median)")
    return lines


def positive(text: str) -> int:
    """An argparse type: a positive integer."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The benchmark's command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--stages",
        type=positive,
        nargs="+",
        default=[1000, 3000, 10000],
        help="project sizes to measure, in stages (7 per recipe, rounded)",
    )
    parser.add_argument(
        "--workdir", type=Path, help="folder for the projects, kept between runs (default: a temporary one)"
    )
    parser.add_argument("--jobs", type=positive, default=2, help="trtflow run -j")
    parser.add_argument("--repeat", type=positive, default=5, help="timed repetitions of each measurement")
    parser.add_argument(
        "--dvc", default=shutil.which("dvc"), help="the dvc executable for the comparison (default: dvc on PATH)"
    )
    parser.add_argument(
        "--dvc-stages",
        type=positive,
        nargs="*",
        default=[1000, 3000],
        help="the sizes at which DVC is measured too (it is slow: ~10 ms per stage per no-op)",
    )
    parser.add_argument("--no-profile", action="store_true", help="skip the cProfile / importtime breakdown")
    return parser.parse_args(argv)


def baselines(repetitions: int) -> dict[str, list[float]]:
    """Python start-up baselines, by the name they are shown under."""
    return {
        f"python -c {code!r}": repeat(lambda code=code: python_once(code), repetitions)
        for code in ("pass", "import trtflow", "import trtflow.cli")
    }


def measure_point(workdir: Path, stages: int, args: argparse.Namespace) -> dict:
    """Write and build one project of about `stages` stages, then time its no-op (and DVC's twin, if asked)."""
    recipes = max(1, round(stages / STAGES_PER_RECIPE))
    project = workdir / f"trtflow-{recipes}-recipes"
    project.mkdir(parents=True, exist_ok=True)
    write_project(project, recipes)
    seconds, summary = full_build(project, args.jobs)
    count = summary["cached"] + summary["built"]
    print(f"\n{count} stages ({recipes} recipes) in {project}: build {seconds:.1f} s wall ({summary['built']} built)")
    time.sleep(2.2)  # outputs written less than 2 s before a run are not trusted by the memo (trtflow/run/runmemo.py)
    point = {
        "stages": count,
        "project": project,
        "first": noop_once(project, args.jobs),
        "noop": repeat(lambda: noop_once(project, args.jobs), args.repeat),
        "replan": repeat(lambda: noop_once(project, args.jobs, replan=True), max(1, args.repeat // 2)),
    }
    if args.dvc and stages in args.dvc_stages:
        twin = workdir / f"dvc-{recipes}-recipes"
        if not dvc_twin.twin_built(twin):
            dvc_twin.write_twin(twin, project / "models", [f"r{index:04d}" for index in range(recipes)])
            print(f"  DVC twin built in {dvc_twin.build_twin(args.dvc, twin):.1f} s")
        point["dvc"] = repeat(lambda: dvc_twin.noop_twin(args.dvc, twin), max(1, args.repeat // 2))
    print("\n".join("  " + line for line in table(_point_rows(point))))
    return point


def _point_rows(point: dict) -> dict[str, list[float]]:
    rows = {
        "first no-op (plans, remembers)": [point["first"]],
        "no-op trtflow run": point["noop"],
        "no-op planning every stage": point["replan"],
    }
    if "dvc" in point:
        rows["no-op dvc repro"] = point["dvc"]
    return rows


def slope_ms(points: list[dict], which: str = "noop") -> float:
    """Milliseconds each further stage adds to a no-op: least-squares line through the (stages, median) points."""
    xs = [p["stages"] for p in points]
    ys = [statistics.median(p[which]) for p in points]
    if len(points) < 2:
        return float("nan")
    return statistics.linear_regression(xs, ys).slope * 1000


def verdicts(points: list[dict]) -> list[str]:
    """The issue's goals, met or missed, with the numbers."""
    lines = []
    at = min(points, key=lambda p: abs(p["stages"] - GOAL_STAGES))
    median = statistics.median(at["noop"])
    lines.append(_verdict(f"no-op at {at['stages']} stages (s)", median, GOAL_SECONDS, "<="))
    if "dvc" in at:
        lines.append(
            _verdict(
                f"dvc / trtflow no-op at {at['stages']} stages",
                statistics.median(at["dvc"]) / median,
                GOAL_VS_DVC,
                ">=",
            )
        )
    else:
        lines.append(f"dvc / trtflow no-op at {at['stages']} stages: not measured (no dvc, or not asked at that size)")
    if len(points) > 1:
        lines.append(_verdict("slope (ms per stage)", slope_ms(points), GOAL_SLOPE_MS, "<="))
    return lines


def _verdict(name: str, value: float, goal: float, sense: str) -> str:
    met = value <= goal if sense == "<=" else value >= goal
    return f"{name:<40} {value:8.3f}  goal {sense} {goal:<5g} {'met' if met else 'MISSED'}"


def benchmark(workdir: Path, args: argparse.Namespace) -> int:
    """Measure every size, print the table, the DVC ratios, the slope and the goals; 0 if every goal is met."""
    base = baselines(args.repeat)
    print("\n".join(table(base)))
    if not args.dvc:
        print("DVC comparison skipped: no dvc executable (pip install dvc, or pass --dvc PATH)")
    points = [measure_point(workdir, stages, args) for stages in sorted(args.stages)]
    print("\nstages   no-op median s   planning every stage s   dvc repro median s   dvc / trtflow   dvc / planning")
    for p in points:
        median, replan = statistics.median(p["noop"]), statistics.median(p["replan"])
        if "dvc" in p:
            dvc = statistics.median(p["dvc"])
            versus = f"{dvc:18.3f}   {dvc / median:12.1f}x   {dvc / replan:13.1f}x"
        else:
            versus = f"{'-':>18}   {'-':>13}   {'-':>14}"
        print(f"{p['stages']:>6}   {median:14.3f}   {replan:22.3f}   {versus}")
    if len(points) > 1:
        print(
            f"slope: {slope_ms(points):.4f} ms per stage remembered, {slope_ms(points, 'replan'):.4f} ms planning "
            "every stage"
        )
    if not args.no_profile:
        largest = points[-1]["project"]
        shutil.rmtree(largest / ".trtflow", ignore_errors=True)  # profile the planning no-op, not the memo
        print(
            "\n".join(
                [
                    "",
                    f"profile of the largest no-op ({points[-1]['stages']} stages):",
                    *cprofile_noop(largest, args.jobs),
                    "",
                    *importtime_noop(largest, args.jobs),
                ]
            )
        )
    lines = verdicts(points)
    print("\n" + "\n".join(lines))
    return 0 if all(line.endswith(" met") for line in lines if "goal" in line) else 1


def main(argv: list[str] | None = None) -> int:
    """Build the project, time its no-ops against the baselines and print the ratios."""
    args = parse_args(argv)
    try:
        if args.workdir is not None:
            args.workdir.mkdir(parents=True, exist_ok=True)
            return benchmark(args.workdir.resolve(), args)
        with tempfile.TemporaryDirectory(prefix="trtflow-noop-") as tmp:
            return benchmark(Path(tmp), args)
    except (CheckFailed, RuntimeError) as exc:
        print(f"check failed: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
