"""The models teams ship today: each precision stage against the bare ModelOpt call on the same model and data, and
each stage's peak memory, for BERT-base, GPT-2 small, ViT-B/16, the Whisper-tiny encoder and a Stable-Diffusion-like
UNet at their real sizes (random weights, seeded).

    python benchmarks/model_families.py [--models bert gpt2 vit whisper unet] [--precisions fp16 int8] [--files 5]
        [--workdir DIR]

What is measured, in one run:
  1. a project with one recipe per model (its ONNX from tests/families.py, fp32 and the precisions, one target:
     rtx-ada (sm_89: fp8 too), `--files` calibration files (text: batch 4 of token ids within the vocabulary, padded
     masks; images: batch 4 of normal values; Whisper and the UNet: their static shapes), accuracy limits at their
     defaults with `verify: {on_fail: warn}` so a miss is recorded, not fatal); a cold `trtflow run -j 1`; seconds
     and peak RSS per stage from artifacts/run.json;
  2. the baseline, per (model, precision), in a fresh subprocess, timed after the imports, with its peak RSS, on the
     very cleaned model the stage read (from the store) and the very calibration files it calibrated on: for
     fp16/bf16 ModelOpt AutoCast as a user calls it, its own reference run over those files included (trtflow
     measures the value ranges itself, stages.ranges); for int8/fp8 the PTQ call the stage makes, with ModelOpt's
     own whole-model passes (trtflow's passes on stand-ins, stages.modelopt_passes, are the stage's own gain);
  3. a table: stage seconds, bare seconds, their ratio; stage peak and bare peak (GiB); the accuracy it reached;
  4. goal 3: each precision stage's peak against 4 GiB (a GPT-2-large-size model's against 3x its weights), and with
     `--scaling K` the same project again with K times the calibration files, each peak against the first (met within
     1.1x: a peak independent of the samples); the scheduler's expectation of each precision stage against its peak.
The ratio is the precision stage's own cost around ModelOpt: copying the model in, the accuracy check on the held-out
file, the fp16 emulation, writing the model and its record. The run's first precision stage waits for what is left of
ModelOpt's import (the worker server imports it while its first task runs), taken off its seconds (the import timed
apart in a fresh process).

    python benchmarks/model_families.py --models whisper --precisions fp16 int8 --files 2 --scaling 4
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from conftest import write_project  # noqa: E402
from families import family_model  # noqa: E402

from trtflow.executors.forking import TOOLS_SERVED  # noqa: E402
from trtflow.stages.base import Node, NodeId, NodeInfo, StageParams  # noqa: E402
from trtflow.stages.precision import expected_memory  # noqa: E402
from trtflow.util.inputvalues import padded_mask  # noqa: E402
from trtflow.util.memory import expected_peak  # noqa: E402

TEXT = ("input_ids", "attention_mask", "token_type_ids")
PROFILES = {
    "bert": ({n: "{min: [1, 16], opt: [4, 64], max: [8, 128]}" for n in TEXT}, (4, 64), 30522),
    "gpt2": ({n: "{min: [1, 8], opt: [2, 32], max: [4, 64]}" for n in TEXT[:2]}, (4, 32), 50257),
    "gpt2_large": ({n: "{min: [1, 8], opt: [1, 16], max: [2, 32]}" for n in TEXT[:2]}, (2, 16), 50257),
    "vit": ({"pixel_values": "{min: [1, 3, 224, 224], opt: [2, 3, 224, 224], max: [4, 3, 224, 224]}"}, None, None),
    "whisper": ({"input_features": "{shape: [1, 80, 3000]}"}, None, None),
    "unet": (
        {
            "sample": "{shape: [2, 4, 64, 64]}",
            "timestep": "{shape: [2]}",
            "encoder_hidden_states": "{shape: [2, 77, 768]}",
        },
        None,
        None,
    ),
}
# float inputs of each file: [4, 3, 224, 224] for ViT (4 images), the static shape for the others
FLOAT_SHAPES = {
    "vit": {"pixel_values": (4, 3, 224, 224)},
    "whisper": {"input_features": (1, 80, 3000)},
    "unet": {"sample": (2, 4, 64, 64), "timestep": (2,), "encoder_hidden_states": (2, 77, 768)},
}


def recipe(name: str, precisions: list[str]) -> str:
    """The recipe of one model: fp32 and `precisions` for rtx-ada, calibrated on its files, misses recorded."""
    inputs = "".join(f"      {input_name}: {shape}\n" for input_name, shape in PROFILES[name][0].items())
    return (
        f"source: {{onnx: models/{name}.onnx}}\nprecisions: [fp32, {', '.join(precisions)}]\ntargets: [rtx-ada]\n"
        f"calibration: {{data: calib/{name}/*.npz}}\nverify: {{on_fail: warn}}\nprofiles:\n  - inputs:\n{inputs}"
    )


def write_calibration(folder: Path, name: str, files: int) -> None:
    """`files` seeded batches of 4 at the profile's opt shape."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(7)
    _, shape, vocabulary = PROFILES[name]
    for index in range(files):
        if shape is None:
            arrays = {k: rng.standard_normal(size).astype(np.float32) for k, size in FLOAT_SHAPES[name].items()}
        else:
            arrays = {"input_ids": rng.integers(0, vocabulary, shape), "attention_mask": padded_mask(rng, list(shape))}
            if "token_type_ids" in PROFILES[name][0]:
                arrays["token_type_ids"] = rng.integers(0, 2, shape)
        np.savez(folder / f"{index}.npz", **arrays)


def bare_call(model: str, precision: str, files: list[str], options: str, out: str) -> None:
    """The child: the ModelOpt call of the precision stage, timed after the imports; prints seconds and peak RSS."""
    from trtflow.stages import convert, modelopt_passes

    convert.modelopt_onnx()
    feeds = [dict(np.load(path)) for path in files]
    source = Path(out) / "source" / "model.onnx"  # ModelOpt takes only a path ending in .onnx, and writes into it
    source.parent.mkdir()
    shutil.copyfile(model, source)
    started = time.perf_counter()
    if precision in ("fp16", "bf16"):
        from modelopt.onnx.autocast import convert_to_mixed_precision

        folder = Path(out) / "autocast-data"
        folder.mkdir(parents=True)
        for index, feed in enumerate(feeds):
            np.savez(folder / f"{index:06d}.npz", **feed)
        given = json.loads(options)
        with convert.quiet():  # AutoCast with its own reference run over the same files
            convert_to_mixed_precision(
                onnx_path=str(source),
                low_precision_type=precision,
                keep_io_types=given["keep_io_types"],
                op_types_to_exclude=given["keep_op_types"],
                nodes_to_exclude=given["keep_nodes"],
                calibration_data=str(folder),
                providers=["cpu"],
            )
    else:  # the stage's call, with ModelOpt's own whole-model passes (not trtflow's: stages.modelopt_passes)
        modelopt_passes.quantize_passes = lambda *_: contextlib.nullcontext()
        with convert.quiet():
            convert.quantize(source, Path(out) / "q" / "model.onnx", precision, feeds, json.loads(options))
    seconds = time.perf_counter() - started
    print(json.dumps({"seconds": seconds, "peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))


def stage_inputs(root: Path, node_id: str) -> tuple[str, list[str], str]:
    """The cleaned model the stage read (a store object), the calibration files it calibrated on, and the options
    trtflow passed to ModelOpt (the mask nodes it kept out included)."""
    from trtflow.calibration import CALIBRATION_ROLE
    from trtflow.stages.precision_params import Params
    from trtflow.store import Store

    store = Store(root / "artifacts" / "store")
    try:
        run = store.memos.last_run(node_id)
        record = store.records.get(run["key"])["record"]
        components = run["components"]
    finally:
        store.close()
    model = str(store.objects.path(components["inputs"]["model"]))
    roles = components["inputs"]
    files = sorted(
        str(root / name.removeprefix(CALIBRATION_ROLE)) for name in roles if name.startswith(CALIBRATION_ROLE)
    )
    params = Params(**components["params"])
    if params.autocast is not None:
        return model, files, json.dumps(params.autocast.model_dump())
    options = params.quantize.model_dump() if params.quantize else {}
    kept = record.get("kept_for_masks", {}).get("nodes", [])
    options |= {"exclude_nodes": sorted({*options["exclude_nodes"], *kept}), "external_data": False}
    return model, files, json.dumps(options)


def measure_bare(root: Path, node_id: str, precision: str) -> dict:
    """The bare call in its own process (its peak is its own)."""
    model, files, options = stage_inputs(root, node_id)
    with tempfile.TemporaryDirectory() as out:
        done = subprocess.run(
            [sys.executable, __file__, "--child", model, precision, json.dumps(files), options, out],
            capture_output=True,
            text=True,
        )
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def modelopt_import_seconds() -> float:
    """What a worker's first precision stage pays before its work: importing ModelOpt (torch with it), in a fresh
    process that has onnx and ONNX Runtime already, as a worker server has."""
    code = (
        "import time, onnx, onnxruntime; started = time.perf_counter(); "
        "import modelopt.onnx.autocast, modelopt.onnx.quantization; print(time.perf_counter() - started)"
    )
    return float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)


def without_import(nodes: dict[str, dict], imported: float) -> dict[str, float]:
    """Each reduced-precision stage's seconds, less what the first of them to start waited for ModelOpt's import (with
    `-j 1` one worker server runs them all, and forks the ones after from itself with ModelOpt loaded). The server
    imports it while its first task of the run runs (executors.forking): the first reduced precision waits for what
    is left, `imported` less the time since that task started, or nothing. The estimate errs toward charging the
    stage: beside a task, the import takes longer than the `imported` measured alone."""
    reduced = [
        n
        for n in nodes.values()
        if n["kind"] == "precision" and not n["id"].endswith("/fp32") and n.get("start") is not None
    ]
    if not reduced:
        return {}
    first = min(reduced, key=lambda n: n["start"])
    began = min(n["start"] for n in nodes.values() if n["kind"] in TOOLS_SERVED and n.get("start") is not None)
    left = max(0.0, imported - (first["start"] - began))
    return {n["id"]: (n["seconds"] or 0.0) - (left if n is first else 0.0) for n in reduced}


def main() -> int:
    """Build the project, run it cold, measure the bare calls, print the table."""
    if sys.argv[1:2] == ["--child"]:
        model, precision, files, options, out = sys.argv[2:7]
        bare_call(model, precision, json.loads(files), options, out)
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["bert", "gpt2", "vit", "whisper"], choices=list(PROFILES))
    parser.add_argument("--precisions", nargs="+", default=["fp16", "int8"])
    parser.add_argument("--files", type=int, default=5, help="calibration files per model (one is held out)")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument(
        "--skip-bare",
        nargs="*",
        default=["unet", "gpt2_large"],
        help="models whose bare fp16 call is not run: AutoCast's own reference run keeps every activation of every "
        "sample (21.7 GB for one sample of the UNet) and would take the machine down",
    )
    parser.add_argument(
        "--scaling",
        type=int,
        default=0,
        metavar="K",
        help="then the same models again with K times the calibration files, to compare each stage's peak",
    )
    args = parser.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="trtflow-families-"))
    root, nodes = cold_project(work, "p", args.models, args.precisions, args.files)
    imported = modelopt_import_seconds()
    own = without_import(nodes, imported)
    print(
        f"precision seconds less what the run's first precision stage waited of ModelOpt's import ({imported:.1f} s "
        "alone; the worker server imports it while its first task runs)"
    )
    print(f"{'stage':<28} {'seconds':>8} {'bare':>7} {'ratio':>6} {'peak GiB':>9} {'bare GiB':>9}  accuracy")
    expectations = []
    for name in args.models:
        for node_id in sorted(n for n in nodes if n.split(":", 1)[1].startswith(f"{name}/") or n.endswith(f":{name}")):
            node = nodes[node_id]
            seconds = own.get(node_id, node.get("seconds") or 0.0)
            line = f"{node_id:<28} {seconds:8.1f}"
            precision = node_id.rsplit("/", 1)[-1]
            skipped = name in args.skip_bare and precision in ("fp16", "bf16")
            if node["kind"] == "precision" and precision != "fp32" and node["status"] != "skipped" and skipped:
                line += f" {'-':>7} {'-':>6} {(node.get('peak_rss') or 0) / 2**30:9.2f} {'-':>9}  "
                line += f"{_accuracy(root, node_id)} (bare call skipped)"
            elif node["kind"] == "precision" and precision != "fp32" and node["status"] != "skipped":
                bare = measure_bare(root, node_id, precision)
                if "error" in bare:
                    line += f"  bare call failed: {bare['error']}"
                else:
                    ratio = seconds / bare["seconds"]
                    line += f" {bare['seconds']:7.1f} {ratio:6.2f} {(node.get('peak_rss') or 0) / 2**30:9.2f}"
                    line += f" {bare['peak'] / 2**30:9.2f}  {_accuracy(root, node_id)}"
            else:
                line += f" {'':7} {'':6} {(node.get('peak_rss') or 0) / 2**30:9.2f}"
            print(line)
            if node["kind"] == "precision" and precision != "fp32" and node.get("peak_rss"):
                weights = _weights(name, work)
                declared = expected_memory(Node(NodeId(node_id), 1, StageParams(), info=NodeInfo(precision=precision)))
                expectations.append((node_id, expected_peak(declared, weights, None), node["peak_rss"]))
    print("\ngoal 3: every precision stage at most 4 GiB (a GPT-2-large-size model: at most 3x its weights):")
    for node_id, _, peak in expectations:
        weights = _weights(node_id.split(":", 1)[1].split("/")[0], work)
        limit = 3 * weights if node_id.startswith("precision:gpt2_large/") else 4 * 2**30
        verdict = "met" if peak <= limit else "missed"
        print(f"  {node_id:<28} {peak / 2**30:6.2f} GiB against {limit / 2**30:.2f}: {verdict}")
    if args.scaling:
        files = args.files * args.scaling
        _, more = cold_project(work, f"p-x{args.scaling}", args.models, args.precisions, files)
        print(
            f"\ngoal 3: peaks independent of the calibration samples ({args.files} files, then {files}; within 1.1x):"
        )
        for node_id, _, peak in expectations:
            again = more[node_id].get("peak_rss") or 0
            ratio = again / peak
            print(f"  {node_id:<28} {peak / 2**30:6.2f} GiB, then {again / 2**30:6.2f} GiB: {ratio:.2f}x "
                  f"({'met' if ratio <= 1.1 else 'missed'})")  # fmt: skip
    print("\nthe scheduler's expectation of a precision stage (before it has a measured peak) against its peak:")
    for node_id, expected, peak in expectations:
        ratio = max(expected / peak, peak / expected)
        verdict = "met" if ratio <= 1.5 else "missed"
        side = "over" if expected >= peak else "under"
        print(f"  {node_id:<28} expected {expected / 2**30:6.2f} GiB, peak {peak / 2**30:6.2f} GiB: "
              f"{ratio:.2f}x {side} ({verdict}: goal within 1.5x)")  # fmt: skip
    return 0


def cold_project(work: Path, folder: str, models: list[str], precisions: list[str], files: int) -> tuple[Path, dict]:
    """A project of `models` at `precisions` with `files` calibration files each, run cold with `-j 1`: its folder and
    its run.json nodes by id."""
    root = write_project(work / folder, {name: recipe(name, precisions) for name in models})
    for name in models:
        model = family_model(name, work / "models-cache")
        for file in model.path.parent.iterdir():  # the model, and its external data when it has some
            target = root / "models" / file.name
            if not target.exists():
                os.link(file, target)
        write_calibration(root / "calib" / name, name, files)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "trtflow", "-C", str(root), "run", "-j", "1"], text=True)
    print(f"run: exit {done.returncode} in {time.perf_counter() - started:.0f} s ({root}; its cold run's stages below)")
    if not (root / "artifacts" / "run.json").is_file():
        sys.exit(f"the run wrote no run.json (exit {done.returncode}): nothing to measure")
    return root, {n["id"]: n for n in json.loads((root / "artifacts" / "run.json").read_text())["nodes"]}


def _weights(name: str, work: Path) -> int:
    """The bytes of a model's largest file: its weights (its external data when it has some)."""
    return max(f.stat().st_size for f in family_model(name, work / "models-cache").path.parent.iterdir())


def _accuracy(root: Path, node_id: str) -> str:
    from conftest import stage_record

    outputs = (stage_record(root, node_id).get("accuracy") or {}).get("outputs") or [{}]
    cosine = outputs[0].get("cosine_similarity")
    return f"cosine {cosine:.6f}" if cosine is not None else "-"


if __name__ == "__main__":
    sys.exit(main())
