"""A real project is never all green: failed pairs are results. A stage's own failure is recorded under its key and
reported, not redone; the lock holds it, so `--frozen` passes while the known failures stay as they were; what a
run cannot build is listed at once by `validate`; `provision` names the engines that failed for a GPU.

The fleet here: an LSTM asked for int8 (ModelOpt quantizes none of its nodes), a ResNet whose fp16 model is held
to an impossible limit, fp32 on Turing excluded for both (TensorRT-RTX has no fp32 GEMM there).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import settle, trtflow, trtflow_process, write_project

torch = pytest.importorskip("torch")

from zoo import zoo_model  # noqa: E402  (imports torch)

FLEET = """\
store: artifacts/store
packages: artifacts/packages
recipes: [recipes/*.yaml]
targets:
  rtx-turing: {backend: tensorrt-rtx, compute_capabilities: [sm_75]}
  rtx-ampere: {backend: tensorrt-rtx, compute_capabilities: [sm_86]}
"""
IMPOSSIBLE = "accuracy: {fp16: {max_abs_error: 0.0}}\n"
LOOSE = "accuracy: {fp16: {max_abs_error: 1.0, min_cosine: 0.9, min_top1: 0.0}}\n"
FAILING = {"precision:lstm/int8", "precision:resnet/fp16"}


def _recipe(model, precisions: list[str], extra: str) -> str:
    body = {
        "source": {"onnx": f"models/{model.name}.onnx"},
        "precisions": precisions,
        "profiles": [model.recipe_profile()],
    }
    if "fp32" in precisions:
        body["exclude"] = [{"precision": "fp32", "target": "rtx-turing"}]
    return yaml.safe_dump(body, sort_keys=False) + extra


def fleet_project(root: Path, zoo_dir: Path) -> Path:
    """The fleet above, its models copied in, calibration on seeded random inputs (recorded as such)."""
    lstm, resnet = zoo_model("lstm", zoo_dir), zoo_model("resnet", zoo_dir)
    write_project(
        root,
        {
            "lstm": _recipe(lstm, ["fp32", "int8"], "calibration: {random: true}\n"),
            "resnet": _recipe(resnet, ["fp32", "fp16"], IMPOSSIBLE),
        },
        pipeline=FLEET,
    )
    for model in (lstm, resnet):
        shutil.copyfile(model.path, root / "models" / f"{model.name}.onnx")
    return root


def summary(root: Path, *args: str) -> tuple[int, dict]:
    """(exit code, the --json summary) of `trtflow run` with `args`."""
    result = trtflow(root, "run", "--json", *args)
    return result.code, json.loads(result.out)


def with_status(summary: dict, status: str) -> set[str]:
    return {node["id"] for node in summary["nodes"] if node["status"] == status}


def files_and_times(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under the project (the no-op memo aside) with its size and mtime."""
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
        if p.is_file() and ".trtflow" not in p.parts
    }


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, zoo_dir: Path) -> tuple[Path, int, dict]:
    """The fleet built once: (project, exit code, --json summary of that first run)."""
    root = fleet_project(tmp_path_factory.mktemp("fleet") / "proj", zoo_dir)
    code, first = summary(root)
    return root, code, first


@pytest.fixture
def built_fleet(fleet: tuple[Path, int, dict], tmp_path: Path) -> Path:
    return Path(shutil.copytree(fleet[0], tmp_path / "proj", symlinks=True))


def clean_clone(root: Path, dest: Path) -> Path:
    """What a fresh checkout holds: sources, recipes and the lock, no store, no packages."""
    dest.mkdir()
    for name in ("pipeline.yaml", "recipes", "models", "trtflow.lock"):
        (shutil.copytree if (root / name).is_dir() else shutil.copyfile)(root / name, dest / name)
    return dest


def test_the_first_run_fails_the_real_pairs_and_builds_the_rest(fleet: tuple[Path, int, dict]) -> None:
    root, code, first = fleet
    assert code == 1
    assert with_status(first, "failed") == FAILING
    reasons = {node["id"]: node["reason"] for node in first["nodes"] if node["status"] == "failed"}
    assert "ModelOpt quantized no node" in reasons["precision:lstm/int8"]
    assert "max abs error" in reasons["precision:resnet/fp16"]
    assert all(
        node["failure_recorded"] and not node["failure_cached"] for node in first["nodes"] if node["status"] == "failed"
    )
    assert with_status(first, "skipped") == {
        f"{kind}:{recipe}/{target}"
        for kind in ("build", "verify")
        for recipe in ("lstm/int8", "resnet/fp16")
        for target in ("rtx-turing", "rtx-ampere")
    }
    assert with_status(first, "built") >= {
        "build:lstm/fp32/rtx-ampere",
        "build:resnet/fp32/rtx-ampere",
        "package:lstm",
        "package:resnet",
    }
    lock = json.loads((root / "trtflow.lock").read_text())["nodes"]
    assert {node["id"] for node in first["nodes"]} == set(lock)  # every stage of the plan, failed and skipped ones too
    assert (
        lock["precision:lstm/int8"]["failed"] == reasons["precision:lstm/int8"] and lock["precision:lstm/int8"]["key"]
    )
    assert lock["build:resnet/fp16/rtx-ampere"] == {"skipped": "upstream precision:resnet/fp16 failed or was skipped"}


def test_the_next_run_reports_the_recorded_failures_without_redoing_or_writing_anything(built_fleet: Path) -> None:
    """The copy gave every file a new inode, so the first run re-hashes them and remembers that (as for an all-green
    project: tests/run/test_run.py); the next one is the no-op."""
    settle()
    assert trtflow(built_fleet, "run").code == 1
    before = files_and_times(built_fleet)
    started = time.perf_counter()
    run = trtflow_process(built_fleet, "run", "--json")
    seconds = time.perf_counter() - started
    second = json.loads(run.stdout)
    assert run.returncode == 1, run.stderr
    assert second["built"] == 0 and second["failed"] == 2 and second["failed_cached"] == 2
    assert all(node["failure_cached"] for node in second["nodes"] if node["status"] == "failed")
    assert files_and_times(built_fleet) == before, "a run that found only recorded failures wrote something"
    plain = trtflow(built_fleet, "run")  # the remembered no-op answers the same, with the same exit code
    assert plain.code == 1 and "failed (cached) precision:lstm/int8" in plain.err
    assert "nothing to do: the failures are recorded" in plain.out
    assert files_and_times(built_fleet) == before
    print(f"no-op of a project with recorded failures: {seconds:.2f} s (a process, imports included)")


def test_plan_shows_recorded_failures_and_what_they_skip(built_fleet: Path) -> None:
    result = trtflow(built_fleet, "plan")
    assert result.code == 0
    assert re.search(r"precision:lstm/int8\s+failed \(cached\): int8: ModelOpt quantized no node", result.out)
    assert re.search(r"build:lstm/int8/rtx-ampere\s+skipped: upstream precision:lstm/int8 failed", result.out)
    assert re.search(r"package:lstm\s+cached", result.out)


def test_frozen_in_a_clean_clone_passes_when_the_same_pairs_fail_the_same_way(
    built_fleet: Path, tmp_path: Path
) -> None:
    clone = clean_clone(built_fleet, tmp_path / "clone")
    lock = (clone / "trtflow.lock").read_bytes()
    result = trtflow(clone, "run", "--frozen")
    assert result.code == 0, result.err
    assert "the 2 failure(s) are the ones trtflow.lock records" in result.out
    assert (clone / "trtflow.lock").read_bytes() == lock


def test_frozen_fails_naming_a_pair_that_fails_another_way(built_fleet: Path, tmp_path: Path) -> None:
    """A failure's reason is part of what the package records (its missing engines): another reason is a change."""
    clone = clean_clone(built_fleet, tmp_path / "clone")
    lock = json.loads((clone / "trtflow.lock").read_text())
    lock["nodes"]["precision:lstm/int8"]["failed"] = "an old failure"
    (clone / "trtflow.lock").write_text(json.dumps(lock))
    result = trtflow(clone, "run", "--frozen")
    assert result.code == 3 and not (clone / "artifacts").exists()
    assert (
        "package:lstm: input precision:int8 changed (missing: precision:lstm/int8: int8: ModelOpt quantized no node"
        in result.err
    )
    assert "-> missing: precision:lstm/int8: an old failure)" in result.err


def test_frozen_refuses_a_lock_whose_failures_and_skips_disagree(built_fleet: Path, tmp_path: Path) -> None:
    """A lock saying a failed pair built (its builds still skipped) is named before anything runs."""
    clone = clean_clone(built_fleet, tmp_path / "clone")
    lock = json.loads((clone / "trtflow.lock").read_text())
    lock["nodes"]["precision:resnet/fp16"].pop("failed")
    lock["nodes"]["precision:resnet/fp16"]["outputs"] = {"model": "0" * 64}
    (clone / "trtflow.lock").write_text(json.dumps(lock))
    result = trtflow(clone, "run", "--frozen")
    assert result.code == 3 and not (clone / "artifacts").exists()
    assert (
        "build:resnet/fp16/rtx-ampere: trtflow.lock has it skipped (upstream precision:resnet/fp16 failed or was "
        "skipped), "
        "but its upstreams no longer fail there" in result.err
    )


def test_editing_the_impossible_limit_reruns_exactly_that_precision_and_its_builds(built_fleet: Path) -> None:
    recipe = built_fleet / "recipes" / "resnet.yaml"
    recipe.write_text(recipe.read_text().replace(IMPOSSIBLE, LOOSE))
    code, after = summary(built_fleet)
    assert code == 1  # the LSTM's int8 still fails (recorded)
    assert with_status(after, "built") == {
        "precision:resnet/fp16",
        "build:resnet/fp16/rtx-turing",
        "verify:resnet/fp16/rtx-turing",
        "build:resnet/fp16/rtx-ampere",
        "verify:resnet/fp16/rtx-ampere",
        "package:resnet",
    }
    assert with_status(after, "failed") == {"precision:lstm/int8"}
    lock = json.loads((built_fleet / "trtflow.lock").read_text())["nodes"]
    assert "failed" not in lock["precision:resnet/fp16"] and lock["build:resnet/fp16/rtx-ampere"]["outputs"]["engine"]


def test_retry_failed_reruns_the_failures_only(built_fleet: Path) -> None:
    code, retried = summary(built_fleet, "--retry-failed")
    assert code == 1
    failed = [node for node in retried["nodes"] if node["status"] == "failed"]
    assert {node["id"] for node in failed} == FAILING and not any(node["failure_cached"] for node in failed)
    assert retried["built"] == 0 and with_status(retried, "cached") == {
        n["id"] for n in retried["nodes"]
    } - FAILING - with_status(retried, "skipped")


def test_a_failure_of_the_machine_is_not_recorded(built_fleet: Path) -> None:
    """A build worker killed from outside (as the OOM killer would) fails its stage for this run only."""
    recipe = built_fleet / "recipes" / "lstm.yaml"
    recipe.write_text(recipe.read_text() + "build: {workspace_mib: 256}\n")  # new build keys
    run = subprocess.Popen(
        [sys.executable, "-m", "trtflow", "-C", str(built_fleet), "run", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    killed = 0
    while run.poll() is None:
        killed += _kill_build_workers(run.pid)
        time.sleep(0.01)
    out, _ = run.communicate()
    died = [
        n for n in json.loads(out)["nodes"] if n["status"] == "failed" and "killed by SIGKILL" in (n["reason"] or "")
    ]
    assert killed and died and run.returncode == 1
    assert not any(node["failure_recorded"] for node in died)
    lock = json.loads((built_fleet / "trtflow.lock").read_text())["nodes"]
    assert all("failed" not in lock[node["id"]] for node in died)
    code, again = summary(built_fleet)
    assert {node["id"] for node in died} <= with_status(again, "built")


def _kill_build_workers(parent: int) -> int:
    """SIGKILL every hermetic worker process the run `parent` started; how many."""
    count = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            if b"trtflow.executors.worker" in command and ppid == parent:
                os.kill(int(pid), signal.SIGKILL)
                count += 1
        except (OSError, ValueError, IndexError):
            pass
    return count


def test_check_repro_reports_every_buildable_engine_and_what_it_skipped(built_fleet: Path) -> None:
    code, checked = summary(built_fleet, "--check-repro", "2")
    assert code == 1  # the recorded failures still fail the run
    builds = {node["id"] for node in checked["nodes"] if node["kind"] == "build"}
    rebuilt = {entry["id"] for entry in checked["reproducibility"]}
    assert rebuilt == {
        node["id"] for node in checked["nodes"] if node["kind"] == "build" and node["status"] == "cached"
    }
    assert rebuilt == {"build:lstm/fp32/rtx-ampere", "build:resnet/fp32/rtx-ampere"}
    assert all(
        entry["verdict"] in ("identical", "equivalent") and entry["rebuilds"] == 2
        for entry in checked["reproducibility"]
    )
    skipped = {entry["id"]: entry["why"] for entry in checked["reproducibility_not_checked"]}
    assert set(skipped) == builds - rebuilt and all(
        why.startswith("skipped: upstream precision:") for why in skipped.values()
    )


def test_provision_names_the_engines_that_failed_for_the_gpu(built_fleet: Path, tmp_path: Path) -> None:
    package = built_fleet / "artifacts" / "packages" / "resnet"
    result = trtflow(built_fleet, "provision", str(package), "--gpu", "sm_75", "--dest", str(tmp_path / "engines"))
    assert result.code == 5
    assert (
        "rtx-turing fp16 (sm_75): not built, precision:resnet/fp16 failed: fp16 accuracy out of tolerance" in result.err
    )
    assert (
        "the engines for sm_75 (target rtx-turing) failed to build" in result.err
        and "add a pipeline target" not in result.err
    )
    as_json = trtflow(
        built_fleet, "provision", str(package), "--gpu", "sm_75", "--dest", str(tmp_path / "engines"), "--json"
    )
    answer = json.loads(as_json.out)
    assert as_json.code == 5 and answer["exit_code"] == 5 and answer["action"] == "failed"
    assert [(e["target"], e["precision"]) for e in answer["failed_engines"]] == [("rtx-turing", "fp16")]
    good = json.loads(
        trtflow(built_fleet, "provision", str(package), "--gpu", "sm_86", "--dest", str(tmp_path / "e"), "--json").out
    )
    assert good["exit_code"] == 0 and good["action"] == "installed"


# validate: every refusal at once --------------------------------------------------------------------------------------

WIDE_FLEET = """\
store: artifacts/store
packages: artifacts/packages
recipes: [recipes/*.yaml]
targets:
  turing: {backend: tensorrt-rtx, compute_capabilities: [sm_75]}
  ampere-dc: {backend: tensorrt-rtx, compute_capabilities: [sm_80]}
  ampere: {backend: tensorrt-rtx, compute_capabilities: [sm_86]}
  ada: {backend: tensorrt-rtx, compute_capabilities: [sm_89]}
"""


def lstm_only_model(path: Path) -> None:
    """An ONNX model of one LSTM and nothing ModelOpt's PTQ quantizes."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = [
        numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32) * 0.1, name)
        for name, shape in (("W", (1, 64, 8)), ("R", (1, 64, 16)), ("B", (1, 128)))
    ]
    nodes = [
        helper.make_node("LSTM", ["x", "W", "R", "B"], ["y"], hidden_size=16),
        helper.make_node("Squeeze", ["y", "axes"], ["out"]),
    ]
    axes = numpy_helper.from_array(np.array([1], dtype=np.int64), "axes")
    graph = helper.make_graph(
        nodes,
        "lstm_only",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [10, 1, 8])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [10, 1, 16])],
        [*weights, axes],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def test_validate_lists_every_refusal_at_once_with_blocks_that_settle_them(tmp_path: Path) -> None:
    """8 GEMM models x (fp32 and bf16 on Turing, fp8 on three older GPUs) = 40 refusals, plus int8/fp8 of an
    LSTM-only model: one run lists them all; pasting the printed blocks makes the project valid."""
    recipes = {
        f"cnn{i}": "source: {onnx: models/tiny_cnn.onnx}\nprecisions: [fp32, fp16, bf16, fp8]\n"
        "calibration: {random: true}\nprofiles:\n  - inputs:\n      input: {shape: [1, 3, 32, 32]}\n"
        for i in range(8)
    }
    recipes["speech"] = (
        "source: {onnx: models/lstm_only.onnx}\nprecisions: [fp16, int8, fp8]\ncalibration: {random: true}\n"
        "exclude: [{precision: fp16, target: turing}]\n"
    )
    root = write_project(tmp_path / "p", recipes, pipeline=WIDE_FLEET)
    lstm_only_model(root / "models" / "lstm_only.onnx")
    result = trtflow(root, "validate")
    assert result.code == 3
    lines = [line.removeprefix("error: ") for line in result.err.splitlines()]
    refusals = [line for line in lines if re.match(r"  recipes/\w+\.yaml:\d+: precisions\[\d\]: ", line)]
    assert len(refusals) == 8 * 5 + 2 + 3  # speech: int8 and fp8 (nothing to quantize), fp8 on the three older GPUs too
    assert lines[0] == f"{len(refusals)} pair(s) cannot be built; nothing was run:"
    assert any(
        "int8: ModelOpt PTQ quantizes Conv, ConvTranspose, Gemm, MatMul nodes and this model has none (its ops: LSTM, "
        "Squeeze)" in line
        for line in refusals
    )
    assert not any("..." in line for line in lines)
    blocks = _exclude_blocks(lines)
    assert set(blocks) == set(f"recipes/{name}.yaml" for name in recipes)
    assert sorted(blocks["recipes/speech.yaml"]) == [
        "{precision: fp16, target: turing}",
        "{precision: fp8}",
        "{precision: int8}",
    ]
    for recipe, entries in blocks.items():
        text = re.sub(r"(?m)^exclude:.*\n", "", (root / recipe).read_text())
        (root / recipe).write_text(text + "exclude:\n" + "".join(f"  - {entry}\n" for entry in entries))
    fixed = trtflow(root, "validate")
    assert fixed.code == 0, fixed.err
    run = trtflow(root, "run", "--dry-run")
    assert run.code == 0 and "cannot be built" not in run.err


def _exclude_blocks(lines: list[str]) -> dict[str, list[str]]:
    """recipe file -> the entries of the `exclude:` block printed for it."""
    blocks: dict[str, list[str]] = {}
    current = None
    for line in lines:
        header = re.match(r"(recipes/\w+\.yaml): to drop them, replace its exclude: \(if any\) with$", line)
        if header:
            current = blocks.setdefault(header.group(1), [])
        elif current is not None and line.startswith("    - "):
            current.append(line.removeprefix("    - "))
    return blocks


def test_run_refuses_every_unbuildable_pair_before_any_work(tmp_path: Path) -> None:
    root = write_project(
        tmp_path / "p",
        {
            "a": "source: {onnx: models/tiny_cnn.onnx}\nprecisions: [fp8]\ncalibration: {random: true}\n"
            "profiles:\n  - inputs:\n      input: {shape: [1, 3, 32, 32]}\n"
        },
        pipeline=WIDE_FLEET,
    )
    result = trtflow(root, "run")
    assert result.code == 3 and "3 pair(s) cannot be built" in result.err
    assert "- {precision: fp8, target: turing}" in result.err and not (root / "artifacts").exists()


def test_a_build_refused_for_its_architecture_names_the_real_target(tmp_path: Path) -> None:
    """An fp16 model whose GEMMs AutoCast keeps in fp32 (told to, here): TensorRT-RTX cannot build those for Turing."""
    root = write_project(
        tmp_path / "p",
        {
            "speech": "source: {onnx: models/seq_lstm.onnx}\nprecisions: [fp16]\n"
            "targets: [turing]\nautocast: {keep_op_types: [MatMul, LSTM]}\n"
        },
        pipeline=WIDE_FLEET,
    )
    shutil.copyfile(Path(__file__).parents[2] / "models" / "seq_lstm.onnx", root / "models" / "seq_lstm.onnx")
    code, first = summary(root)
    failed = {node["id"]: node["reason"] for node in first["nodes"] if node["status"] == "failed"}
    assert code == 1 and set(failed) == {"build:speech/fp16/turing"}
    assert failed["build:speech/fp16/turing"].startswith(
        "fp16 cannot build for sm_75 with tensorrt-rtx: FP32 GEMM is not supported"
    )
    assert failed["build:speech/fp16/turing"].endswith(
        "drop the pair with exclude: [{precision: fp16, target: turing}]"
    )


# the race behind "Unable to parse proto" ----------------------------------------------------------------------------


def test_a_precision_stage_never_writes_into_the_store_object_it_reads(tmp_path: Path, zoo_dir: Path) -> None:
    """ModelOpt's PTQ rewrites its input model in place (shape inference to the same path): through a hard link that
    rewrote the cleaned model's store object while the recipe's other precisions read it."""
    model = zoo_model("mobilenet", zoo_dir)
    recipe = _recipe(
        model,
        ["int8"],
        "calibration: {random: true}\ntargets: [rtx-ampere]\naccuracy: {int8: {min_top1: 0.0}}\n"
        "verify: {on_fail: warn}\n",
    )
    root = write_project(tmp_path / "p", {"m": recipe}, pipeline=FLEET)
    shutil.copyfile(model.path, root / "models" / f"{model.name}.onnx")
    assert trtflow(root, "run").code == 0
    objects = {p: p.stat().st_mtime_ns for p in (root / "artifacts" / "store" / "objects").rglob("*") if p.is_file()}
    (root / "recipes" / "m.yaml").write_text(recipe.replace("min_top1: 0.0", "min_top1: 0.0, min_cosine: 0.5"))
    code, rerun = summary(root)  # the int8 stage again, from the cleaned model in the store
    assert (
        code == 0 and "precision:m/int8" in with_status(rerun, "built") and "cleanup:m" in with_status(rerun, "cached")
    )
    changed = [p.name[:12] for p, mtime in objects.items() if p.exists() and p.stat().st_mtime_ns != mtime]
    assert not changed, f"store objects written in place: {changed}"


@pytest.mark.slow
def test_precision_stages_of_real_models_at_j2_never_read_a_half_written_model(tmp_path: Path, zoo_dir: Path) -> None:
    """fp16, int8 and fp8 of three real CNNs at -j 2, twice, each time with a fresh store: no stage fails."""
    models = [zoo_model(name, zoo_dir) for name in ("resnet", "mobilenet", "efficientnet")]
    extra = (
        "calibration: {random: true}\ntargets: [rtx-ada]\naccuracy: {samples: 4, fp16: {min_top1: 0.0}, "
        "int8: {min_top1: 0.0}, fp8: {min_top1: 0.0}}\nverify: {on_fail: warn}\n"  # nor are the limits, nor 16 samples
    )
    ada = FLEET.replace(
        "rtx-ampere: {backend: tensorrt-rtx, compute_capabilities: [sm_86]}",
        "rtx-ada: {backend: tensorrt-rtx, compute_capabilities: [sm_89]}",
    )
    for attempt in range(2):
        root = write_project(
            tmp_path / f"p{attempt}",
            {
                m.name: yaml.safe_dump(
                    {
                        "source": {"onnx": f"models/{m.name}.onnx"},
                        "precisions": ["fp16", "int8", "fp8"],
                        "profiles": [m.recipe_profile()],
                    }
                )
                + extra
                for m in models
            },
            pipeline=ada,
        )
        for m in models:
            shutil.copyfile(m.path, root / "models" / f"{m.name}.onnx")
        code, run = summary(root, "-j", "2")
        failed = {node["id"]: node["reason"] for node in run["nodes"] if node["status"] == "failed"}
        assert not any("parse proto" in reason for reason in failed.values()), failed
        assert code == 0, failed


def test_a_failed_recipe_says_its_package_folder_is_an_earlier_runs(tmp_path: Path) -> None:
    """The package of an earlier run stays in artifacts/packages/ (provisioning may rely on it), but a run whose
    package stage failed or was skipped says the folder is not this run's (before: not a word)."""
    from conftest import TINY_RECIPE

    fp16 = TINY_RECIPE.replace("precisions: [fp32]", "precisions: [fp16]")
    root = write_project(tmp_path / "p", {"tiny": fp16})
    assert trtflow(root, "run").code == 0 and (root / "artifacts" / "packages" / "tiny").is_dir()
    (root / "recipes" / "tiny.yaml").write_text(fp16 + "accuracy: {fp16: {max_abs_error: 0.0}}\n")
    result = trtflow(root, "run")
    assert result.code == 1
    warned = [line for line in result.err.splitlines() if "is the package of an earlier run" in line]
    assert warned == [
        f"warning: {root / 'artifacts' / 'packages' / 'tiny'}/ is the package of an earlier run: package:tiny was "
        "skipped in this one; fix that (or remove the folder) before shipping it"
    ], result.err
    assert (root / "artifacts" / "packages" / "tiny").is_dir()
