"""Release builds that survive upstream releases: the lock names the toolchain, `trtflow toolchain` prints it as pip
requirements, `doctor` and `run --frozen` hold the installed tools to it, and installing its output makes a frozen
run pass again. Packages updated by an ordinary edit are not reported as restored."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, trtflow

from trtflow.hashing import stage_key

OLDER_ONNXSLIM = "0.1.90"


def example_copy(root: Path) -> Path:
    """The repository's example project as committed (pipeline, recipes, models, lock), without a store."""
    root.mkdir()
    for name in ("pipeline.yaml", "recipes", "models", "trtflow.lock"):
        (shutil.copytree if (REPO / name).is_dir() else shutil.copyfile)(REPO / name, root / name)
    return root


def run_with(path_first: Path, root: Path, *args: str) -> subprocess.CompletedProcess:
    """`python -m trtflow` with `path_first` ahead of the installed packages (an older tool installed there)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(path_first), os.environ.get("PYTHONPATH")]))}
    return subprocess.run(
        [sys.executable, "-m", "trtflow", "-C", str(root), *args], capture_output=True, text=True, env=env, timeout=600
    )


def pip_target(target: Path, requirement: str) -> None:
    """Install one requirement (no dependencies) into `target`, replacing what is there."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--upgrade",
            "--target",
            str(target),
            requirement,
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )


def test_toolchain_prints_every_tool_the_lock_names_at_its_version() -> None:
    result = trtflow(REPO, "toolchain")
    assert result.code == 0
    pins = dict(line.split("==") for line in result.out.splitlines() if not line.startswith("#"))
    lock = json.loads((REPO / "trtflow.lock").read_text())["nodes"]
    fingerprints = [entry.get("fingerprint", {}) for entry in lock.values()]
    assert pins["onnxslim"] == next(f["onnxslim"] for f in fingerprints if "onnxslim" in f)
    assert pins["nvidia-modelopt"] == next(f["modelopt"] for f in fingerprints if "modelopt" in f)
    assert pins["tensorrt-rtx"] == next(
        f["backend_version"] for f in fingerprints if f.get("backend") == "tensorrt-rtx"
    )
    assert set(pins) == {"numpy", "nvidia-modelopt", "onnx", "onnxruntime", "onnxslim", "tensorrt-rtx"}


def test_toolchain_refuses_a_lock_whose_stages_disagree(tmp_path: Path) -> None:
    root = example_copy(tmp_path / "p")
    lock = json.loads((root / "trtflow.lock").read_text())
    entry = lock["nodes"]["cleanup:seq_lstm"]
    entry["fingerprint"]["onnxslim"] = "0.0.1"
    entry["key"] = stage_key({k: entry[k] for k in ("kind", "version", "params", "fingerprint", "inputs")})
    (root / "trtflow.lock").write_text(json.dumps(lock))
    result = trtflow(root, "toolchain")
    assert result.code == 3 and "stages name several versions of onnxslim: 0.0.1 (cleanup:seq_lstm)" in result.err


@pytest.mark.slow
def test_an_older_tool_fails_frozen_naming_it_and_the_toolchain_fixes_it(tmp_path: Path) -> None:
    """onnxslim one release behind (pip from the registry into a folder ahead on the path), as a new upstream release or
    an old tag's CI would have it: frozen names the tool, both versions and the command; installing what `trtflow
    toolchain` prints makes the same frozen run pass, every stage identical or equivalent to the lock."""
    root, older = example_copy(tmp_path / "p"), tmp_path / "older"
    pip_target(older, f"onnxslim=={OLDER_ONNXSLIM}")
    frozen = run_with(older, root, "run", "--frozen")
    locked = next(line for line in trtflow(root, "toolchain").out.splitlines() if line.startswith("onnxslim=="))
    assert frozen.returncode == 3 and not (root / "artifacts").exists()
    assert f"onnxslim: trtflow.lock has {locked.split('==')[1]}, {OLDER_ONNXSLIM} is installed" in frozen.stderr
    assert "install the locked ones: trtflow toolchain > toolchain.txt && pip install -r toolchain.txt" in frozen.stderr
    assert frozen.stderr.count("onnxslim") == 1  # named once, not once per stage
    doctor = run_with(older, root, "doctor")
    assert doctor.returncode == 1 and re.search(
        rf"onnxslim\s+{re.escape(locked.split('==')[1])}\s+{OLDER_ONNXSLIM}\s+DIFFERS", doctor.stdout
    )

    pip_target(older, locked)  # the line `trtflow toolchain` printed
    assert run_with(older, root, "doctor").returncode == 0
    passed = run_with(older, root, "run", "--frozen", "--json")
    summary = json.loads(passed.stdout)
    assert passed.returncode == 0, [(n["id"], n["reason"]) for n in summary["nodes"] if n["status"] == "failed"]
    held = summary["frozen"]["identical"] + len(summary["frozen"]["equivalent"])
    assert held >= 10 and all(node_id.startswith("build:") for node_id in summary["frozen"]["equivalent"])
    plain = run_with(older, root, "run", "--frozen")
    assert re.search(
        r"^frozen: \d+ stage\(s\) identical to trtflow.lock, \d+ engine\(s\) equivalent", plain.stdout, re.M
    )


def test_an_updated_package_is_not_reported_as_restored(project: Path) -> None:
    assert trtflow(project, "run").code == 0
    recipe = project / "recipes" / "tiny.yaml"
    recipe.write_text(recipe.read_text().replace("max: [8, 3, 32, 32]", "max: [16, 3, 32, 32]"))
    updated = trtflow(project, "run")
    assert updated.code == 0 and "package:tiny" in updated.err and "restored" not in updated.err + updated.out
    (project / "artifacts" / "packages" / "tiny" / "manifest.json").write_text("{}")
    tampered = trtflow(project, "run")
    assert tampered.code == 0 and "manifest.json changed; restored it from the store" in tampered.err


def test_a_local_version_label_is_not_pinned() -> None:
    """`torch==2.13.0+cpu` fails `pip install -r` on a machine that reaches only PyPI; `torch==2.13.0` takes the
    build pip finds (the CPU one where it is installed, PyPI's elsewhere)."""
    from trtflow.toolchain import Tool, requirements

    text = requirements([Tool(("torch",), "2.13.0+cpu", ("export:m",)), Tool(("onnx",), "1.21.0", ("cleanup:m",))])
    assert text.splitlines()[1:] == ["torch==2.13.0", "onnx==1.21.0"]
