"""External-data benchmark: peak memory and time of `trtflow run` on an ONNX model larger than 2 GB.

    python benchmarks/external_data.py [--gib 2.5] [--workdir DIR] [--keep]

The goal (from the issue): a model over 2 GB is not loaded into memory more often than needed. What is
measured, each command a real subprocess:
  1. a generated project: one recipe whose model is `--gib` GiB of float32 MatMul weights (8192 x 8192
     each, + Relu) saved beside the graph as external data, written tensor by tensor (the generator never
     holds the model); one tensorrt-rtx target (sm_89), a profile with a dynamic batch 1..4;
  2. the baselines, in the same run: the peak RSS and seconds of `onnx.load` of the model (all weights in
     memory once), of an ONNX Runtime session on it, the seconds of sha256 over all its files, and of
     `python -c "import trtflow.cli"` (what any command pays first);
  3. `trtflow run -j 1`: wall seconds, and per stage its seconds and the peak RSS of the trtflow process
     tree while it ran (/proc sampled every 20 ms), plus the peak RSS of the largest single process
     (getrusage RUSAGE_CHILDREN);
  4. a no-op rerun: wall seconds (the stat cache must spare it hashing the weights again);
  5. ratios: each stage's peak to `onnx.load`'s (1.0 = the weights in memory once), the no-op to sha256
     and to the start-up.
The working folder holds ~6 x the model size at the end (model, cleaned copy, engine, package, its
archive and extraction); it is deleted unless --keep or --workdir is given. Exit 0, or 2 if a run failed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

WIDTH = 8192  # one weight: 8192 x 8192 float32 = 256 MiB
PIPELINE = "targets:\n  rtx-ada: {backend: tensorrt-rtx, compute_capabilities: [sm_89]}\n"
RECIPE = f"""\
source: {{onnx: models/big.onnx}}
profiles:
  - inputs:
      input: {{min: [1, {WIDTH}], opt: [2, {WIDTH}], max: [4, {WIDTH}]}}
verify: {{samples: 3}}
"""


class CheckFailed(Exception):
    """A command did not do what the benchmark relies on (so its numbers would mean nothing)."""


# ---------------------------------------------------------------------------------------------
# the project


def write_model(folder: Path, layers: int, seed: int = 0) -> None:
    """big.onnx + big.onnx.weights: `layers` MatMul+Relu, each weight written straight to the data file."""
    rng = np.random.default_rng(seed)
    inits, nodes, offset, previous = [], [], 0, "input"
    with open(folder / "big.onnx.weights", "wb") as data:
        for index in range(layers):
            raw = (rng.standard_normal((WIDTH, WIDTH), dtype=np.float32) * np.float32(1 / np.sqrt(WIDTH))).tobytes()
            data.write(raw)
            inits.append(_external_tensor(f"w{index}", "big.onnx.weights", offset, len(raw)))
            offset += len(raw)
            output = "output" if index == layers - 1 else f"r{index}"
            nodes += [
                helper.make_node("MatMul", [previous, f"w{index}"], [f"m{index}"]),
                helper.make_node("Relu", [f"m{index}"], [output]),
            ]
            previous = output
    graph = helper.make_graph(
        nodes,
        "big",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", WIDTH])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", WIDTH])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, folder / "big.onnx")


def _external_tensor(name: str, location: str, offset: int, length: int) -> TensorProto:
    tensor = TensorProto(
        name=name, data_type=TensorProto.FLOAT, dims=[WIDTH, WIDTH], data_location=TensorProto.EXTERNAL
    )
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    return tensor


def write_project(root: Path, gib: float) -> int:
    """The project under `root`; returns the bytes of weights written."""
    (root / "models").mkdir(parents=True, exist_ok=True)
    (root / "recipes").mkdir(exist_ok=True)
    (root / "pipeline.yaml").write_text(PIPELINE)
    (root / "recipes" / "big.yaml").write_text(RECIPE)
    layers = max(1, round(gib * (1 << 30) / (WIDTH * WIDTH * 4)))
    write_model(root / "models", layers)
    return layers * WIDTH * WIDTH * 4


# ---------------------------------------------------------------------------------------------
# measuring


def peak_rss_of(args: list[str]) -> tuple[float, int, subprocess.CompletedProcess]:
    """(wall seconds, peak RSS in bytes of the largest process in its tree, result) of one command.

    A wrapper process runs the command, so RUSAGE_CHILDREN covers that command's tree alone.
    """
    wrapper = (
        "import resource, subprocess, sys, json; r = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
        "print(json.dumps([r.returncode, r.stdout[-20000:], r.stderr[-20000:], "
        "resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss]))"
    )
    started = time.perf_counter()
    outer = subprocess.run([sys.executable, "-c", wrapper, *args], capture_output=True, text=True, check=True)
    seconds = time.perf_counter() - started
    code, out, err, max_kib = json.loads(outer.stdout)
    return seconds, max_kib * 1024, subprocess.CompletedProcess(args, code, out, err)


def tree_rss(root_pid: int) -> int:
    """Sum of RSS over a process and its descendants, from /proc."""
    parents: dict[int, int] = {}
    rss: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
                fields = stat[stat.rindex(")") + 2 :].split()
                parents[int(entry)], rss[int(entry)] = int(fields[1]), int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
            except (OSError, ValueError, IndexError):
                continue
    tree, frontier = {root_pid}, [root_pid]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, ppid in parents.items() if ppid == parent and pid not in tree]
        tree.update(children)
        frontier += children
    return sum(rss.get(pid, 0) for pid in tree)


STREAMING_WRAPPER = (
    "import resource, subprocess, sys; code = subprocess.run(sys.argv[1:]).returncode; "
    "print('peak', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(code)"
)


def run_with_stage_peaks(project: Path) -> tuple[float, dict[str, dict], int]:
    """`trtflow run -j 1`: wall seconds, {stage: {seconds, peak_tree_rss}}, peak RSS of its largest process.

    Stages are told apart by the progress lines it writes to stderr; a wrapper process reports RUSAGE_CHILDREN.
    """
    command = [
        sys.executable,
        "-c",
        STREAMING_WRAPPER,
        sys.executable,
        "-m",
        "trtflow",
        "-C",
        str(project),
        "run",
        "-j",
        "1",
    ]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    current: list[str] = ["(planning)"]
    stages: dict[str, dict] = {}
    lines: list[str] = []

    def follow() -> None:
        for line in process.stderr:
            lines.append(line)
            started = re.match(r"run\s+(\S+)", line)
            done = re.match(r"(built|cached|failed)\s+(\S+?) in ([\d.]+) s", line.strip())
            if started:
                current[0] = started.group(1)
            elif done:
                stages.setdefault(done.group(2), {})["seconds"] = float(done.group(3))
                current[0] = "(between stages)"

    reader = threading.Thread(target=follow, daemon=True)
    reader.start()
    started = time.perf_counter()
    while process.poll() is None:
        stage = stages.setdefault(current[0], {})
        stage["peak_tree_rss"] = max(stage.get("peak_tree_rss", 0), tree_rss(process.pid))
        time.sleep(0.02)
    seconds = time.perf_counter() - started
    reader.join()
    out = process.stdout.read()
    if process.returncode != 0:
        raise CheckFailed(f"trtflow run exited {process.returncode}:\n{''.join(lines)[-3000:]}")
    return seconds, stages, int(re.findall(r"^peak (\d+)$", out, flags=re.M)[-1]) * 1024


def noop_seconds(project: Path) -> float:
    """Wall seconds of a rerun that must build nothing."""
    started = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "trtflow", "-C", str(project), "run", "--json"], capture_output=True, text=True
    )
    seconds = time.perf_counter() - started
    if result.returncode != 0 or json.loads(result.stdout)["built"] != 0:
        raise CheckFailed(f"the rerun was not a no-op:\n{result.stdout[-2000:]}{result.stderr[-2000:]}")
    return seconds


def python_code(code: str) -> list[str]:
    """The command that runs `code` in this interpreter."""
    return [sys.executable, "-c", code]


def baselines(model: Path) -> dict[str, tuple[float, int]]:
    """(seconds, peak RSS) of the reference operations, each in its own process."""
    load = f"import onnx; onnx.load({str(model)!r})"
    session = (
        f"import onnxruntime as ort; o = ort.SessionOptions(); o.intra_op_num_threads = 1; "
        f"ort.InferenceSession({str(model)!r}, o, providers=['CPUExecutionProvider'])"
    )
    files = (str(model), str(model) + ".weights")
    digest = f"from trtflow.hashing import sha256_file; [sha256_file(p) for p in {files!r}]"
    found = {}
    startup = "import trtflow.cli"
    for name, code in (
        ("onnx.load (weights in memory once)", load),
        ("ONNX Runtime session", session),
        ("sha256 of the model's files", digest),
        ("python -c 'import trtflow.cli'", startup),
    ):
        seconds, peak, result = peak_rss_of(python_code(code))
        if result.returncode != 0:
            raise CheckFailed(f"baseline {name} failed:\n{result.stderr[-2000:]}")
        found[name] = (seconds, peak)
    return found


# ---------------------------------------------------------------------------------------------
# report


def gib(value: float) -> str:
    """A byte count in GiB, for the table."""
    return f"{value / (1 << 30):6.2f} GiB"


def report(weights: int, base: dict, wall: float, stages: dict, single_peak: int, noops: list[float]) -> list[str]:
    """The benchmark's printed table: run time, per-stage peaks against loading the model, no-op times."""
    load_peak = base["onnx.load (weights in memory once)"][1]
    hash_seconds, startup = base["sha256 of the model's files"][0], base["python -c 'import trtflow.cli'"][0]
    lines = [f"model: {gib(weights)} of external weights", "", "baselines (same machine, same run):"]
    lines += [f"  {name:<38} {seconds:7.2f} s  peak RSS {gib(peak)}" for name, (seconds, peak) in base.items()]
    lines += [
        "",
        f"trtflow run -j 1: {wall:.2f} s wall; peak RSS of the largest process {gib(single_peak)} "
        f"= {single_peak / load_peak:.2f} x onnx.load",
        "",
        f"  {'stage':<34} {'seconds':>8} {'peak tree RSS':>14} {'/ onnx.load':>11}",
    ]
    for name, stage in stages.items():
        peak = stage.get("peak_tree_rss", 0)
        lines.append(
            f"  {name:<34} {stage.get('seconds', float('nan')):8.2f} {gib(peak):>14} {peak / load_peak:10.2f}x"
        )
    lines.append("")
    for label, seconds in zip(
        ("first no-op (re-hashes files written within 2 s of the last hashing: the package archive)", "second no-op"),
        noops,
        strict=True,
    ):
        lines.append(
            f"{label}: {seconds:.2f} s = {seconds / hash_seconds:.2f} x the sha256 of the model's files, "
            f"{seconds / startup:.1f} x start-up"
        )
    return lines


def benchmark(project: Path, size: float) -> int:
    """Build one generated project of `size` GiB of weights and report it; the exit code of the goals."""
    started = time.perf_counter()
    weights = write_project(project, size)
    print(f"project: {project} (model written in {time.perf_counter() - started:.1f} s)", flush=True)
    model = project / "models" / "big.onnx"
    base = baselines(model)
    wall, stages, single_peak = run_with_stage_peaks(project)
    noops = [noop_seconds(project) for _ in range(2)]
    print("\n".join(report(weights, base, wall, stages, single_peak, noops)))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments and run the benchmark."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--gib", type=float, default=2.5, help="weights to generate, in GiB (default 2.5: over protobuf's 2 GiB)"
    )
    parser.add_argument("--workdir", type=Path, help="project folder (default: a temporary one, deleted afterwards)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary project folder")
    args = parser.parse_args(argv)
    try:
        if args.workdir is not None:
            args.workdir.mkdir(parents=True, exist_ok=True)
            return benchmark(args.workdir.resolve(), args.gib)
        folder = Path(tempfile.mkdtemp(prefix="trtflow-external-"))
        try:
            return benchmark(folder, args.gib)
        finally:
            if not args.keep:
                shutil.rmtree(folder, ignore_errors=True)
    except CheckFailed as exc:
        print(f"check failed: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
