"""End to end: the real CLI builds real TensorRT-RTX engines on the CPU, packages them, and reruns incrementally."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import TINY_RECIPE, package_files, settle, trtflow, trtflow_process, write_project
from onnx import TensorProto, helper, numpy_helper


def run_json(root: Path, *args: str) -> dict:
    result = trtflow(root, "run", "--json", *args)
    assert result.code == 0, result.err
    return json.loads(result.out)


def statuses(summary: dict) -> dict[str, str]:
    return {node["id"]: node["status"] for node in summary["nodes"]}


def built(summary: dict) -> set[str]:
    return {node_id for node_id, status in statuses(summary).items() if status == "built"}


def manifest(root: Path, recipe: str = "tiny") -> dict:
    return json.loads((root / "artifacts" / "packages" / recipe / "manifest.json").read_text())


def test_run_packages_one_engine_per_precision_and_target(project: Path) -> None:
    summary = run_json(project)
    assert summary["built"] == 7 and summary["failed"] == 0
    package = project / "artifacts" / "packages" / "tiny"
    engines = manifest(project)["engines"]
    assert sorted((e["precision"], e["target"], tuple(e["compute_capabilities"])) for e in engines) == [
        ("fp32", "rtx-ada", ("sm_89",)),
        ("fp32", "rtx-ampere", ("sm_86",)),
    ]
    for engine in engines:
        data = (package / engine["file"]).read_bytes()
        assert engine["sha256"] == hashlib.sha256(data).hexdigest() and engine["size"] == len(data) > 10_000
        assert engine["backend"] == "tensorrt-rtx" and engine["backend_version"].startswith("1.")
        assert [t["name"] for t in engine["tensors"]] == ["input", "logits"]
        assert engine["tensors"][0]["profiles"] == [
            {"min": [1, 3, 32, 32], "opt": [4, 3, 32, 32], "max": [8, 3, 32, 32]}
        ]
    sums = dict(line.split("  ")[::-1] for line in (package / "SHA256SUMS").read_text().splitlines())
    assert sums["manifest.json"] == hashlib.sha256((package / "manifest.json").read_bytes()).hexdigest()
    assert set(sums) | {"SHA256SUMS"} == set(package_files(project))
    assert not (project / "artifacts" / "packages" / "tiny.tar.gz").exists(), "an archive only when asked for"


def test_inspect_shows_package_manifest_and_engine(project: Path) -> None:
    run_json(project)
    package = project / "artifacts" / "packages" / "tiny"
    for path in (package, package / "manifest.json"):
        shown = trtflow(project, "inspect", str(path))
        assert shown.code == 0 and "rtx-ada (sm_89)" in shown.out and "tensorrt-rtx 1." in shown.out
    engine = package / manifest(project)["engines"][0]["file"]
    info = json.loads(trtflow(project, "inspect", "--json", str(engine)).out)
    assert info["kind"] == "engine" and info["manifest_entry"]["file"] == manifest(project)["engines"][0]["file"]
    assert info["format"] == "TensorRT-RTX engine"
    assert "not a TensorRT engine" in trtflow(project, "inspect", str(project / "pipeline.yaml")).out


def test_second_run_executes_nothing_and_says_so(project: Path) -> None:
    run_json(project)
    again = trtflow_process(project, "run")
    assert again.returncode == 0, again.stderr
    assert "0 built, 7 cached" in again.stdout and "all stages cached" in again.stdout
    assert set(statuses(run_json(project)).values()) == {"cached"}


def _tree(root: Path) -> dict[str, tuple[int, int, int]]:
    """(mtime_ns, size, inode) of every file and folder under `root`."""
    return {
        str(p.relative_to(root)): (p.lstat().st_mtime_ns, p.lstat().st_size, p.lstat().st_ino) for p in root.rglob("*")
    }


def test_a_no_op_run_writes_nothing_at_all(built_project: Path) -> None:
    """Not the lock, not the store's cache, not a run record, not a lease: every mtime stays (a no-op runs in every CI
    job).

    The copy gave every file a new inode, so the first run re-hashes them and remembers that (and, the copy being
    settled, the no-op: trtflow.run.runmemo); the second is the no-op."""
    settle()
    assert trtflow(built_project, "run").code == 0
    before = _tree(built_project)
    result = trtflow(built_project, "run", "--json")
    assert result.code == 0 and json.loads(result.out)["built"] == 0
    assert _tree(built_project) == before


def test_changing_one_target_rebuilds_only_its_builds_and_the_package(project: Path) -> None:
    run_json(project)
    pipeline = project / "pipeline.yaml"
    pipeline.write_text(pipeline.read_text().replace("sm_89", "sm_120"))
    plan = trtflow(project, "plan", "--explain")
    assert "build:tiny/fp32/rtx-ada" in plan.out and "compute_capabilities: ['sm_89'] -> ['sm_120']" in plan.out
    assert built(run_json(project)) == {"build:tiny/fp32/rtx-ada", "verify:tiny/fp32/rtx-ada", "package:tiny"}
    assert [e["compute_capabilities"] for e in manifest(project)["engines"] if e["target"] == "rtx-ada"] == [["sm_120"]]


def test_changing_a_profile_rebuilds_only_that_recipes_builds(tmp_path: Path) -> None:
    root = write_project(tmp_path / "p", {"tiny": TINY_RECIPE, "other": TINY_RECIPE})
    run_json(root)
    recipe = root / "recipes" / "tiny.yaml"
    recipe.write_text(recipe.read_text().replace("max: [8, 3, 32, 32]", "max: [16, 3, 32, 32]"))
    explained = trtflow(root, "plan", "--explain").out
    assert "profiles[0].input.max: [8,3,32,32] -> [16,3,32,32]" in explained
    # cleanup re-proves itself over the new shapes; its bytes are unchanged, so the precision node stays cached
    assert built(run_json(root)) == {
        f"{kind}:tiny/fp32/{target}" for kind in ("build", "verify") for target in ("rtx-ampere", "rtx-ada")
    } | {"cleanup:tiny", "package:tiny"}


def test_a_cold_run_reads_what_it_hashes_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cold run plans before and after it makes its store: each source (written just now) is still hashed once;
    the objects it made are not hashed again before they are packed, nor the placed archive for its provenance
    (its object's digest is known). Those second reads were 0.9 s of a 15 s cold run of three real-size models."""
    from collections import Counter

    from trtflow import hashing
    from trtflow.store import objects

    root = write_project(tmp_path / "p")
    hashed: Counter[str] = Counter()
    verified: list[str] = []
    read, verify = hashing.sha256_file, objects.ObjectFiles.verify
    monkeypatch.setattr(hashing, "sha256_file", lambda path: hashed.update([Path(path).name]) or read(path))
    monkeypatch.setattr(
        objects.ObjectFiles, "verify", lambda self, digest: verified.append(digest) or verify(self, digest)
    )
    assert trtflow(root, "run").code == 0
    assert hashed["tiny_cnn.onnx"] == 1 and max(hashed.values()) == 1, hashed
    assert not [name for name in hashed if name.endswith(".tar.gz")] and verified == [], (hashed, verified)


def test_deleted_store_object_is_rebuilt(project: Path) -> None:
    run_json(project)
    engine_digest = manifest(project)["engines"][0]["sha256"]
    shutil.rmtree(project / "artifacts" / "packages")
    obj = project / "artifacts" / "store" / "objects" / engine_digest[:2] / engine_digest
    obj.chmod(0o644)
    obj.unlink()
    rebuilt = run_json(project)
    assert len(built(rebuilt)) == 1 and next(iter(built(rebuilt))).startswith("build:")
    assert obj.is_file() and manifest(project)["engines"][0]["sha256"] == engine_digest  # same bytes again


def test_builds_are_deterministic_and_force_reruns_everything(project: Path) -> None:
    run_json(project)
    before = package_files(project)
    assert run_json(project, "--force")["built"] == 7
    assert package_files(project) == before


def test_dry_run_writes_nothing(project: Path) -> None:
    result = trtflow(project, "run", "--dry-run")
    assert result.code == 0 and "7 stage(s) would run" in result.out
    assert not (project / "artifacts").exists()


def _unsupported_op_model(path: Path) -> None:
    """Valid ONNX (passes the checker) that no TensorRT parser can import: an op from a custom domain."""
    node = helper.make_node("Frobnicate", ["x"], ["y"], domain="com.example")
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    model.ir_version = 8
    onnx.save(model, path)


def test_a_failing_stage_stops_its_package_but_not_other_recipes(tmp_path: Path) -> None:
    root = write_project(
        tmp_path / "p", {"tiny": TINY_RECIPE, "broken": "source: {onnx: models/broken.onnx}\ntargets: [rtx-ampere]\n"}
    )
    _unsupported_op_model(root / "models" / "broken.onnx")
    result = trtflow(root, "run", "--json")
    assert result.code == 1
    states = statuses(json.loads(result.out))
    # no runtime knows the op: cleanup's ONNX Runtime proof is the first stage to fail, before any build
    assert (
        states["cleanup:broken"] == "failed"
        and states["build:broken/fp32/rtx-ampere"] == "skipped"
        and states["package:broken"] == "skipped"
    )
    assert states["package:tiny"] == "built"
    failure = next(n for n in json.loads(result.out)["nodes"] if n["status"] == "failed")
    assert "Frobnicate" in failure["reason"]
    assert (root / "artifacts" / "packages" / "tiny" / "manifest.json").is_file() and not (
        root / "artifacts" / "packages" / "broken"
    ).exists()


def test_parallel_run_builds_the_same_package(tmp_path: Path) -> None:
    serial, parallel = write_project(tmp_path / "a"), write_project(tmp_path / "b")
    run_json(serial)
    assert run_json(parallel, "-j", "2")["built"] == 7
    assert package_files(serial) == package_files(parallel)


def test_static_lstm_without_dynamic_dims_builds(tmp_path: Path) -> None:
    import numpy as np
    from conftest import example_models

    root = write_project(
        tmp_path / "p",
        {"lstm": "source: {onnx: models/lstm.onnx}\nprofiles:\n  - inputs: {sequence: {shape: [50, 1, 32]}}\n"},
    )
    onnx.save(example_models().seq_lstm(np.random.default_rng(1)), root / "models" / "lstm.onnx")
    assert run_json(root)["built"] == 7
    tensors = manifest(root, "lstm")["engines"][0]["tensors"]
    assert tensors[0]["shape"] == [50, 1, 32] and tensors[1]["shape"] == [1, 8]


def test_lock_records_every_node_and_frozen_passes_when_unchanged(project: Path) -> None:
    run_json(project)
    lock_text = (project / "trtflow.lock").read_text()
    nodes = json.loads(lock_text)["nodes"]
    assert sorted(nodes) == [
        "build:tiny/fp32/rtx-ada",
        "build:tiny/fp32/rtx-ampere",
        "cleanup:tiny",
        "package:tiny",
        "precision:tiny/fp32",
        "verify:tiny/fp32/rtx-ada",
        "verify:tiny/fp32/rtx-ampere",
    ]
    assert nodes["build:tiny/fp32/rtx-ada"]["params"]["precision"] == "fp32"
    assert nodes["package:tiny"]["outputs"] == package_files(project)
    assert run_json(project, "--frozen")["cached"] == 7
    assert (project / "trtflow.lock").read_text() == lock_text


def test_frozen_builds_from_an_empty_store_when_the_lock_matches(project: Path) -> None:
    run_json(project)
    shutil.rmtree(project / "artifacts")
    assert run_json(project, "--frozen")["built"] == 7


def test_frozen_fails_before_building_and_names_the_change(project: Path) -> None:
    run_json(project)
    shutil.rmtree(project / "artifacts")
    recipe = project / "recipes" / "tiny.yaml"
    recipe.write_text(recipe.read_text().replace("opt: [4, 3, 32, 32]", "opt: [2, 3, 32, 32]"))
    result = trtflow(project, "run", "--frozen")
    assert result.code == 3 and not (project / "artifacts").exists()
    assert "build:tiny/fp32/rtx-ada: profiles[0].input.opt: [4,3,32,32] -> [2,3,32,32]" in result.err
    assert result.err.startswith("error: trtflow.lock: the plan differs from the lock")
    assert result.err.rstrip().endswith(
        "error: undo the change, or run `trtflow run` without --frozen to rebuild and rewrite trtflow.lock, then "
        "commit it"
    )


def test_frozen_without_a_lock_says_how_to_make_one(project: Path) -> None:
    result = trtflow(project, "run", "--frozen")
    assert result.code == 3 and "trtflow.lock: not found" in result.err


def test_frozen_dry_run_checks_the_lock_too(project: Path) -> None:
    run_json(project)
    recipe = project / "recipes" / "tiny.yaml"
    recipe.write_text(recipe.read_text().replace("max: [8, 3, 32, 32]", "max: [9, 3, 32, 32]"))
    result = trtflow(project, "run", "--frozen", "--dry-run")
    assert result.code == 3 and "profiles[0].input.max: [8,3,32,32] -> [9,3,32,32]" in result.err


def test_a_builder_option_reaches_the_engine_the_key_and_the_manifest(built_project: Path) -> None:
    """profiling_verbosity: one field in the recipe schema, one line in the backend; keyed, applied, recorded."""
    recipe = built_project / "recipes" / "tiny.yaml"
    before = {e["target"]: e["sha256"] for e in manifest(built_project)["engines"]}
    recipe.write_text(recipe.read_text() + "build: {profiling_verbosity: detailed}\n")
    assert "profiling_verbosity: default -> detailed" in trtflow(built_project, "plan", "--explain").out
    assert built(run_json(built_project)) == {
        f"{kind}:tiny/fp32/{target}" for kind in ("build", "verify") for target in ("rtx-ampere", "rtx-ada")
    } | {"package:tiny"}
    engines = manifest(built_project)["engines"]
    assert all(e["builder"]["profiling_verbosity"] == "detailed" for e in engines)
    assert all(e["sha256"] != before[e["target"]] for e in engines)  # detailed layer information is in the engine


def test_a_target_whose_backend_is_not_installed_exits_4_in_one_line_before_any_work(project: Path) -> None:
    pipeline = project / "pipeline.yaml"
    pipeline.write_text(pipeline.read_text() + "  a100:\n    backend: tensorrt\n    compute_capabilities: [sm_80]\n")
    (project / "recipes" / "tiny.yaml").write_text(
        TINY_RECIPE.replace("targets: [rtx-ampere, rtx-ada]", "targets: [rtx-ada, a100]")
    )
    result = trtflow(project, "run")
    assert result.code == 4 and result.out == ""
    assert result.err == (
        "error: target a100 of recipe tiny: its backend tensorrt is not installed here: pip install "
        "'trtflow[tensorrt]'\n"
    )
    assert not (project / "artifacts").exists()


def test_servers_started_early_never_fail_a_run_that_builds_nothing(built_project: Path) -> None:
    """A run starts its build servers before it loads the project; when they cannot start (their slot folder is not
    private), a run that finds everything cached still succeeds, and only a run that must build says why (exit 4)."""
    import os

    slots = Path("/tmp") / f"trtflow-hermetic-{os.getuid()}"
    slots.mkdir(mode=0o700, exist_ok=True)
    try:
        slots.chmod(0o755)
        cached = trtflow(built_project, "run")
        assert cached.code == 0, cached.err
        pipeline = built_project / "pipeline.yaml"
        pipeline.write_text(pipeline.read_text().replace("sm_86", "sm_80"))
        building = trtflow(built_project, "run")
        assert building.code == 4 and str(slots) in building.err, building.err
    finally:
        slots.chmod(0o700)


def test_a_piped_run_says_which_stages_are_still_running(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In CI a 150 s precision stage printed nothing between its `run` and `built` lines; now a long stage is named
    every TRTFLOW_HEARTBEAT_SECONDS (30 by default; a fraction of the cleanup's second here)."""
    monkeypatch.setenv("TRTFLOW_HEARTBEAT_SECONDS", "0.1")
    result = trtflow(project, "run", "-j", "1")
    assert result.code == 0, result.err
    still = [line for line in result.err.splitlines() if line.startswith("still    ")]
    assert any(line.startswith("still    cleanup:tiny  (running for ") for line in still), result.err
    lines = result.err.splitlines()
    finished = lines.index(next(line for line in lines if line.startswith("built    cleanup:tiny")))
    assert not any(line.startswith("still    cleanup:tiny") for line in lines[finished:])


def test_a_long_precision_stage_says_what_it_is_doing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A precision stage's heartbeat names its step (a fallback search's, which can run for minutes, its trials):
    the stage writes it in its work directory, the run reads it there."""
    monkeypatch.setenv("TRTFLOW_HEARTBEAT_SECONDS", "0.1")
    recipe = TINY_RECIPE.replace("[fp32]", "[int8]").replace("[rtx-ampere, rtx-ada]", "[rtx-ada]")
    root = write_project(tmp_path / "p", {"tiny": recipe + "calibration: {random: true}\n"})
    result = trtflow(root, "run", "-j", "1")
    assert result.code == 0, result.err
    said = {line.partition(" s: ")[2].rstrip(")") for line in result.err.splitlines() if "precision:tiny/int8" in line}
    assert "ModelOpt making the int8 model" in said, result.err  # seconds long: the check after it may be too short


def test_a_fix_found_whole_in_the_cache_rewrites_the_report(tmp_path: Path) -> None:
    """fp16 against an impossible limit fails; putting the recipe back finds every stage cached. The report must then
    show the project as it is, not the failure of the run before."""
    recipe = TINY_RECIPE.replace("[fp32]", "[fp32, fp16]").replace("[rtx-ampere, rtx-ada]", "[rtx-ada]")
    root = write_project(tmp_path / "p", {"tiny": recipe})
    assert trtflow(root, "run").code == 0
    strict = recipe + "accuracy: {fp16: {min_cosine: 1.0, max_abs_error: 0.0}}\n"
    (root / "recipes" / "tiny.yaml").write_text(strict)
    assert trtflow(root, "run").code == 1

    def failed() -> list[str]:
        nodes = json.loads((root / "artifacts" / "run.json").read_text())["nodes"]
        return [n["id"] for n in nodes if n["status"] == "failed"]

    assert failed() == ["precision:tiny/fp16"]
    (root / "recipes" / "tiny.yaml").write_text(recipe)
    fixed = trtflow(root, "run")
    assert fixed.code == 0 and "0 built" in fixed.out
    assert failed() == []
    assert ", 0 failed" in trtflow(root, "report", "--format", "md").out


def test_builds_alone_runs_no_stage_beside_a_build(tmp_path: Path) -> None:
    """`--builds-alone` at -j 2: the run's own timeline (run.json) shows no stage overlapping a build, while the run
    still uses both slots for the other stages; without it, builds of two targets run side by side. One precision, so
    both targets' builds become ready together with both slots free: with two, whether two builds meet depends on when
    the other precision stage ends."""
    timelines = {}
    for mode in ("--builds-alone", None):
        root = write_project(tmp_path / str(mode), {"a": TINY_RECIPE, "b": TINY_RECIPE})
        assert trtflow(root, "run", "-j", "2", *([mode] if mode else [])).code == 0
        nodes = json.loads((root / "artifacts" / "run.json").read_text())["nodes"]
        timelines[mode] = [n for n in nodes if n["start"] is not None]

    def overlaps(nodes: list[dict]) -> list[tuple[str, str]]:
        return [
            (a["id"], b["id"])
            for a in nodes
            for b in nodes
            if a["id"] < b["id"] and a["start"] < b["end"] and b["start"] < a["end"]
        ]

    alone = overlaps(timelines["--builds-alone"])
    assert alone and not [pair for pair in alone if any(p.startswith("build:") for p in pair)], alone
    assert [pair for pair in overlaps(timelines[None]) if all(p.startswith("build:") for p in pair)]


def _dense_model(path: Path, seed: int) -> None:
    """A [N, 3, 32, 32] -> [N, 128] linear model with 1.5 MiB of seeded weights."""
    weights = np.random.default_rng(seed).standard_normal((3 * 32 * 32, 128)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Flatten", ["input"], ["flat"]), helper.make_node("MatMul", ["flat", "w"], ["output"])],
        "dense",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["n", 3, 32, 32])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["n", 128])],
        [numpy_helper.from_array(weights, "w")],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def test_a_stage_starts_while_the_outputs_before_it_are_stored(tmp_path: Path) -> None:
    """At -j 1 a finished stage's outputs of a MiB or more move into the store (hashing, fsync) in a thread beside the
    next stage: the next independent stage starts before the finished one is settled, and every record names objects
    in place. A node of the same stage (recipe c is a's) waits for it quietly: no other run is building it. Smaller
    outputs are stored at once (the tiny CNN's: its next stage starts after it is settled)."""
    dense = TINY_RECIPE.replace("tiny_cnn", "dense_a")
    recipes = {"a": dense, "b": dense.replace("dense_a", "dense_b"), "c": dense, "d": TINY_RECIPE}
    root = write_project(tmp_path / "p", recipes)
    for seed, name in enumerate(("dense_a", "dense_b")):
        _dense_model(root / "models" / f"{name}.onnx", seed)
    result = trtflow(root, "run", "-j", "1")
    assert result.code == 0, result.err
    lines = [line.split()[:2] for line in result.err.splitlines() if line.startswith(("run ", "built "))]
    first_built = min(lines.index(["built", f"cleanup:{recipe}"]) for recipe in "ab")
    assert max(lines.index(["run", f"cleanup:{recipe}"]) for recipe in "ab") < first_built, result.err
    between = lines[lines.index(["run", "cleanup:d"]) + 1 : lines.index(["built", "cleanup:d"])]
    assert not [line for line in between if line[0] == "run"], result.err  # stored at once: nothing started meanwhile
    assert "0 built" in trtflow(root, "run").out
    shutil.rmtree(root / "artifacts")
    both = trtflow(root, "run", "-j", "2")  # precision:c is ready with precision:a, which takes the key
    assert both.code == 0 and "another run" not in both.err, both.err
    assert trtflow(root, "cache", "verify").code == 0
