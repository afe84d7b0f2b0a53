"""Release reproducibility on a fleet-like matrix: a release built twice, the second time from the first one's lock
with `--frozen`, in another checkout, and each engine and package compared byte for byte.

    python benchmarks/repro_matrix.py [--models resnet18 mobilenet_v3_small efficientnet lstm encoder]
        [--precisions fp32 fp16 int8] [--targets rtx-ampere rtx-ada rtx-blackwell] [--keep] [--workdir DIR]
        [--builds-alone]

The project: targets rtx-ampere (sm_86), rtx-ada (sm_89) and rtx-blackwell (sm_120), backend tensorrt-rtx; one
recipe per model: torchvision's ResNet-18 and MobileNetV3-small at their real sizes (benchmarks/torchvision_like.py,
[N, 3, 224, 224], batch 1/8/32) and tests/zoo.py's EfficientNet-style CNN, LSTM and transformer encoder, each an ONNX
source with its profile and 4 seeded calibration batches (as tests/run/test_release_build.py writes them), in fp32, fp16
and int8; the LSTM's int8 is excluded as tests/fleet.py excludes it (ModelOpt quantizes none of its nodes).

What is done:
  1. build A: the project in a short folder, `python -m trtflow -C A run -j 2 --json` with PYTHONHASHSEED=1;
  2. build B: a copy of A without its artifacts (a clean store, A's trtflow.lock) at a much longer path,
     `python -m trtflow -C B run -j 1 --frozen --json` with PYTHONHASHSEED=4242.

What it prints:
  - per engine (model, precision, target): `identical` (same bytes), `equivalent` (other bytes, same
    `canonical_sha256` in artifacts/packages/<recipe>/manifest.json) or `different`, with both sha256 prefixes
    (`not built (skipped)` where a stage above the build failed in both runs);
  - per package whether the folder artifacts/packages/<recipe>/ is byte-identical (its SHA256SUMS, which lists every
    file, the same), and if not, the files that differ;
  - the frozen run's exit code and its `frozen:` summary line (the line `trtflow run --frozen` prints, formatted from
    the `"frozen"` object of its --json output), and any stage that failed in either build with its reason;
  - the wall seconds of each build (and the seconds trtflow's summary reports).
Exit status 0 whatever the comparison says (a benchmark reports; it does not gate), 2 if build A wrote no lock.
Folders are made under --workdir (default: a new temporary folder) and deleted at the end unless --keep; the
exported ONNX of the models is cached in <workdir>/onnx-cache (kept when --workdir is given).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from fleet import MORE_EXCLUDES  # noqa: E402
from torchvision_like import MODELS as TORCHVISION  # noqa: E402
from torchvision_like import _calibration_batches  # noqa: E402
from zoo import _export, zoo_model  # noqa: E402

from trtflow.manifest import SUMS_FILE, read_sums  # noqa: E402

TARGETS = {"rtx-ampere": "sm_86", "rtx-ada": "sm_89", "rtx-blackwell": "sm_120"}
PRECISIONS = ("fp32", "fp16", "int8")
TORCHVISION_MODELS = ("resnet18", "mobilenet_v3_small")
ZOO_MODELS = ("efficientnet", "lstm", "encoder")
MODELS = TORCHVISION_MODELS + ZOO_MODELS
# Build B's checkout: far longer than A's, as a second clone in a CI runner's deep work folder would be.
LONG = "a-second-checkout-of-the-release-at-a-much-longer-path/than-the-first-one-had/to-move-any-path-dependence"


def write_project(
    root: Path, cache: Path, models: tuple[str, ...], precisions: tuple[str, ...], targets: tuple[str, ...]
) -> dict[str, list[dict]]:
    """pipeline.yaml with the targets, one recipe per model with its ONNX, profile and calibration batches; returns
    each recipe's `exclude:` rules."""
    (root / "recipes").mkdir(parents=True)
    (root / "models").mkdir()
    pipeline = {"targets": {t: {"backend": "tensorrt-rtx", "compute_capabilities": [TARGETS[t]]} for t in targets}}
    (root / "pipeline.yaml").write_text(yaml.safe_dump(pipeline))
    cache.mkdir(parents=True, exist_ok=True)
    excludes = {}
    for name in models:
        if name in TORCHVISION:
            make, profile = TORCHVISION[name]
            onnx_file = cache / f"{name}.onnx"
            if not onnx_file.is_file():
                partial = cache / f".{name}.{os.getpid()}.partial"
                with torch.no_grad():
                    _export(make(), profile, partial)
                os.replace(partial, onnx_file)
            _calibration_batches(root / "calib" / name, profile)
            recipe_profile = {"inputs": {input_name: s.as_recipe() for input_name, s in profile.items()}}
        else:
            model = zoo_model(name, cache)
            onnx_file = model.path
            model.calibration_batches(root / "calib" / name)
            recipe_profile = model.recipe_profile()
        shutil.copyfile(onnx_file, root / "models" / f"{name}.onnx")
        excludes[name] = [rule for rule in MORE_EXCLUDES.get(name, []) if rule["precision"] in precisions]
        recipe = {
            "source": {"onnx": f"models/{name}.onnx"},
            "precisions": list(precisions),
            "exclude": excludes[name],
            "profiles": [recipe_profile],
            "calibration": {"data": f"calib/{name}/*"},
        }
        (root / "recipes" / f"{name}.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    return excludes


def run_trtflow(root: Path, seed: int, *args: str) -> tuple[int, float, dict | None, str]:
    """`python -m trtflow -C root run ARGS --json` with PYTHONHASHSEED=seed: exit code, wall seconds, the JSON
    summary (None if it printed none) and stderr."""
    env = {**os.environ, "PYTHONHASHSEED": str(seed)}
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "trtflow", "-C", str(root), "run", *args, "--json"],
        capture_output=True,
        text=True,
        env=env,
    )
    seconds = time.perf_counter() - started
    try:
        summary = json.loads(done.stdout) if done.stdout.strip() else None
    except json.JSONDecodeError:
        summary = None
    return done.returncode, seconds, summary, done.stderr


def frozen_line(frozen: dict) -> str:
    """The `frozen:` line `trtflow run --frozen` prints without --json (trtflow/cli/output.py), from `"frozen"`."""
    equivalent = frozen["equivalent"]
    named = f": {', '.join(equivalent[:10])}{' ...' if len(equivalent) > 10 else ''}" if equivalent else ""
    return (
        f"frozen: {frozen['identical']} stage(s) identical to trtflow.lock, {len(equivalent)} engine(s) "
        f"equivalent, not identical (only the backend's generated numbering differs: same canonical digest){named}"
    )


def engines(root: Path, name: str) -> dict[tuple[str, str], dict]:
    """The package manifest's engines of a recipe by (precision, target); empty if there is no package."""
    manifest = root / "artifacts" / "packages" / name / "manifest.json"
    if not manifest.is_file():
        return {}
    return {(e["precision"], e["target"]): e for e in json.loads(manifest.read_text())["engines"]}


def members(folder: Path) -> dict[str, str]:
    """sha256 of each file of a package folder, by name, as its SHA256SUMS lists them (itself by its own bytes)."""
    sums = folder / SUMS_FILE
    return read_sums(sums.read_text()) | {sums.name: hashlib.sha256(sums.read_bytes()).hexdigest()}


def verdict(a: dict | None, b: dict | None, status: tuple[str | None, str | None]) -> str:
    """identical / equivalent / different; `not built (skipped)` (or failed) when neither build has the engine and
    both runs say why (`status`: the build stage's status in A and in B), else which build lacks it."""
    if a is None and b is None and status[0] == status[1] and status[0] in ("failed", "skipped"):
        return f"not built ({status[0]})"
    if a is None or b is None:
        return "missing in " + ("A and B" if a is None and b is None else "A" if a is None else "B")
    if a["sha256"] == b["sha256"]:
        return "identical"
    return "equivalent" if a["canonical_sha256"] == b["canonical_sha256"] else "different"


def failures(summary: dict | None) -> list[str]:
    """`id: reason` of every failed stage of a run."""
    return [f"{n['id']}: {n['reason']}" for n in (summary or {}).get("nodes", []) if n["status"] == "failed"]


def statuses(summary: dict | None) -> dict[str, str]:
    """Each stage's status in a run's --json summary, by id."""
    return {n["id"]: n["status"] for n in (summary or {}).get("nodes", [])}


def report(
    a: Path,
    b: Path,
    models: tuple[str, ...],
    precisions: tuple[str, ...],
    targets: tuple[str, ...],
    excludes: dict,
    runs: tuple[dict | None, dict | None],
) -> set[str]:
    """Print the engine table and the package table; returns the ids of the engines found only equivalent."""
    status_a, status_b = statuses(runs[0]), statuses(runs[1])
    print(f"{'model':<20} {'precision':<9} {'target':<14} {'verdict':<19} {'sha256 A':<12} {'sha256 B':<12}")
    counts: dict[str, int] = {}
    equivalent = set()
    for name in models:
        before, after = engines(a, name), engines(b, name)
        for precision in precisions:
            for target in targets:
                if any(r["precision"] == precision and r.get("target") in (None, target) for r in excludes[name]):
                    continue
                x, y = before.get((precision, target)), after.get((precision, target))
                node = f"build:{name}/{precision}/{target}"
                said = verdict(x, y, (status_a.get(node), status_b.get(node)))
                counts[said] = counts.get(said, 0) + 1
                if said == "equivalent":
                    equivalent.add(node)
                print(
                    f"{name:<20} {precision:<9} {target:<14} {said:<19} {(x or {}).get('sha256', '-')[:12]:<12} "
                    f"{(y or {}).get('sha256', '-')[:12]:<12}"
                )
    print("engines: " + ", ".join(f"{n} {said}" for said, n in counts.items()))
    print(f"\n{'package':<20} {'folder':<15} {'MB':>6}  files that differ")
    for name in models:
        x, y = a / "artifacts" / "packages" / name, b / "artifacts" / "packages" / name
        if not ((x / SUMS_FILE).is_file() and (y / SUMS_FILE).is_file()):
            print(f"{name:<20} {'missing in ' + ('A' if not (x / SUMS_FILE).is_file() else 'B'):<15}")
            continue
        mine, theirs = members(x), members(y)
        differ = sorted(m for m in mine.keys() | theirs.keys() if mine.get(m) != theirs.get(m))
        size = sum(p.stat().st_size for p in x.rglob("*") if p.is_file())
        print(f"{name:<20} {'differs' if differ else 'identical':<15} {size / 1e6:>6.1f}  {', '.join(differ) or '-'}")
    return equivalent


def main() -> None:
    """Write the project, build it twice (the second frozen, elsewhere) and print the comparison."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--precisions", nargs="+", default=list(PRECISIONS), choices=PRECISIONS)
    parser.add_argument("--targets", nargs="+", default=list(TARGETS), choices=list(TARGETS))
    parser.add_argument("--keep", action="store_true", help="keep the two project folders")
    parser.add_argument("--builds-alone", action="store_true", help="both builds with `run --builds-alone`")
    parser.add_argument("--workdir", type=Path, help="where to make them (default: a new temporary folder)")
    args = parser.parse_args()
    models = tuple(m for m in MODELS if m in args.models)
    precisions = tuple(p for p in PRECISIONS if p in args.precisions)
    targets = tuple(t for t in TARGETS if t in args.targets)
    made = args.workdir is None
    workdir = Path(tempfile.mkdtemp(prefix="rm-")) if made else args.workdir.resolve()
    a, b = workdir / "a", workdir / "b" / LONG
    for folder in (a, workdir / "b"):
        shutil.rmtree(folder, ignore_errors=True)
    try:
        excludes = write_project(a, workdir / "onnx-cache", models, precisions, targets)
        dropped = [
            f"{n}/{r['precision']}" + (f"/{r['target']}" if "target" in r else "") for n in models for r in excludes[n]
        ]
        print(
            f"matrix: {len(models)} model(s) x {len(precisions)} precision(s) x {len(targets)} target(s) "
            f"({', '.join(models)}; {', '.join(precisions)}; "
            + ", ".join(f"{t} {TARGETS[t]}" for t in targets)
            + ")"
            + (f", excluded: {', '.join(dropped)}" if dropped else "")
        )
        alone = ("--builds-alone",) if args.builds_alone else ()
        code_a, seconds_a, summary_a, err_a = run_trtflow(a, 1, "-j", "2", *alone)
        if not (a / "trtflow.lock").is_file():
            print(f"build A (exit {code_a}) wrote no trtflow.lock: {err_a[-2000:]}", file=sys.stderr)
            sys.exit(2)
        shutil.copytree(a, b, ignore=shutil.ignore_patterns("artifacts"))
        code_b, seconds_b, summary_b, err_b = run_trtflow(b, 4242, "-j", "1", "--frozen", *alone)
        print(f"build A: {a} ({len(str(a))} chars); build B: {b} ({len(str(b))} chars)\n")
        equivalent = report(a, b, models, precisions, targets, excludes, (summary_a, summary_b))
        print(f"\nfrozen run (B): exit {code_b}")
        frozen = (summary_b or {}).get("frozen")
        if frozen is not None:
            print(frozen_line(frozen))
            if set(frozen["equivalent"]) != equivalent:
                print(f"  (the run's equivalent engines differ from the manifests': {sorted(equivalent)})")
        else:
            print(f"frozen: no summary ({err_b.strip()[-2000:] or 'no output'})")
        for label, code, seconds, summary, err, how in (
            ("A", code_a, seconds_a, summary_a, err_a, "-j 2, PYTHONHASHSEED=1"),
            ("B", code_b, seconds_b, summary_b, err_b, "-j 1 --frozen, PYTHONHASHSEED=4242"),
        ):
            reported = f"{summary['seconds']:.1f} s by trtflow, {summary['built']} built" if summary else "no summary"
            print(f"build {label} ({how}): exit {code}, {seconds:.1f} s wall ({reported})")
            for line in failures(summary):
                print(f"  failed {line}")
            if code != 0 and summary is None:
                print(f"  {err.strip()[-2000:]}")
    finally:
        if not args.keep:
            shutil.rmtree(workdir if made else workdir / "a", ignore_errors=True)
            shutil.rmtree(workdir / "b", ignore_errors=True)
        else:
            print(f"(projects kept in {workdir})")


if __name__ == "__main__":
    main()
