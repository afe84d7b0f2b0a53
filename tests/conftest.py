"""Shared fixtures: a real project tree on disk (pipeline, recipes, ONNX models) built in one call."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import onnx
import pytest

from trtflow.cli import main

REPO = Path(__file__).resolve().parent.parent

# The example project's fleet (rtx-ampere sm_86, rtx-ada sm_89): one definition shared with benchmarks/noop.py.
PIPELINE = (REPO / "pipeline.yaml").read_text()
# the profile of the example models made by models/make_models.py (tiny_cnn, wide_cnn): one 3x32x32 input
PROFILE_YAML = "profiles:\n  - inputs:\n      input: {min: [1, 3, 32, 32], opt: [4, 3, 32, 32], max: [8, 3, 32, 32]}\n"

TINY_RECIPE = """\
source:
  onnx: models/tiny_cnn.onnx
precisions: [fp32]
targets: [rtx-ampere, rtx-ada]
profiles:
  - inputs:
      input: {min: [1, 3, 32, 32], opt: [4, 3, 32, 32], max: [8, 3, 32, 32]}
"""


def example_models():
    """The repo's model generators (models/make_models.py), shared with the example project."""
    spec = importlib.util.spec_from_file_location("make_models", REPO / "models" / "make_models.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclass
class Result:
    code: int
    out: str
    err: str


def trtflow(root: Path, *args: str) -> Result:
    """Run the real CLI entry point in this process (errors and exit codes as a user sees them)."""
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(["-C", str(root), *args])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return Result(code, out.getvalue(), err.getvalue())


def trtflow_process(root: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run `python -m trtflow` as a separate process, as CI and users do."""
    return subprocess.run(
        [sys.executable, "-m", "trtflow", "-C", str(root), *args], capture_output=True, text=True, timeout=timeout
    )


def settle() -> None:
    """Wait out the window in which a run distrusts files touched just before it (trtflow.run.runmemo.RACY_NS)."""
    from trtflow.run.runmemo import RACY_NS

    time.sleep(RACY_NS / 1e9 + 0.2)


def package_files(root: Path, recipe: str = "tiny") -> dict[str, str]:
    """The sha256 of every file of a placed package folder, by relative path (what "the same package" compares)."""
    import hashlib

    folder = root / "artifacts" / "packages" / recipe
    return {
        path.relative_to(folder).as_posix(): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


ARCHIVE = "package: {archive: true}\n"  # a recipe's line asking for `<recipe>.tar.gz` beside its folder


def write_project(root: Path, recipes: dict[str, str] | None = None, pipeline: str = PIPELINE) -> Path:
    """pipeline.yaml, recipes/<name>.yaml and models/tiny_cnn.onnx under `root`."""
    (root / "recipes").mkdir(parents=True, exist_ok=True)
    (root / "models").mkdir(exist_ok=True)
    (root / "pipeline.yaml").write_text(pipeline)
    for name, text in (recipes if recipes is not None else {"tiny": TINY_RECIPE}).items():
        (root / "recipes" / f"{name}.yaml").write_text(text)
    import numpy as np

    onnx.save(example_models().tiny_cnn(np.random.default_rng(0)), root / "models" / "tiny_cnn.onnx")
    return root


@pytest.fixture(scope="session")
def zoo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One folder the zoo (tests/zoo.py) generates its models into, once per test run (shared by xdist's workers)."""
    return shared_dir(tmp_path_factory, "zoo")


def shared_dir(tmp_path_factory: pytest.TempPathFactory, name: str) -> Path:
    """A folder every worker of this test run sees (xdist's workers share the base temp's parent); its writers lock."""
    base = tmp_path_factory.getbasetemp()
    folder = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / name
    folder.mkdir(exist_ok=True)
    return folder


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A fresh project: one recipe (tiny_cnn, fp32) and two TensorRT-RTX targets (sm_86, sm_89)."""
    return write_project(tmp_path / "proj")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The `project` fixture's project, built once per test module (tests that change it take `built_project`)."""
    root = write_project(tmp_path_factory.mktemp("built") / "proj")
    assert trtflow(root, "run").code == 0
    return root


@pytest.fixture
def built_project(built: Path, tmp_path: Path) -> Path:
    """A copy of the built project, store included."""
    return Path(shutil.copytree(built, tmp_path / "proj", symlinks=True))


def record_for(digest: str, node: str = "build:m/fp32/t") -> tuple[str, dict]:
    """(key, record) shaped as a run writes them (the components hash to the key), naming one output object."""
    from trtflow.hashing import stage_key

    components = {"kind": node.split(":")[0], "node": node, "inputs": {}}
    key = stage_key(components)
    return key, {"key": key, "components": components, "node": node, "outputs": {"engine": digest}}


def read_remote_record(path: Path) -> dict:
    """The stage record inside a remote cache's record envelope."""
    import base64

    return json.loads(base64.b64decode(json.loads(path.read_text())["payload"]))


def write_remote_record(path: Path, record: dict, signer=None) -> None:
    """Put `record` in a remote cache's envelope, signed by `signer` (a trtflow.signing.Signer) or unsigned."""
    from trtflow.signing import RECORD_TYPE, envelope_of

    path.write_text(json.dumps(envelope_of(RECORD_TYPE, record, signer)))


def stage_entry(root: Path, node_id: str) -> dict:
    """The store's whole entry of a node's last run in the project at `root`: its record, outputs, seconds..."""
    from trtflow.store import Store

    store = Store(root / "artifacts" / "store")
    try:
        return store.records.get(store.memos.last_run(node_id)["key"])
    finally:
        store.close()


def stage_record(root: Path, node_id: str) -> dict:
    """The store record (the stage's own JSON) of a node's last run in the project at `root`."""
    return stage_entry(root, node_id)["record"]


@pytest.fixture(scope="module")
def s3():
    """A counting S3 server (moto) on 127.0.0.1 for one test module (tests/s3server.py); stopped after it."""
    pytest.importorskip("s3fs", reason="the S3 tests need s3fs: pip install 'trtflow[s3]'")
    pytest.importorskip("moto.server", reason="the S3 tests need moto[server]")
    from s3server import CountingS3

    server = CountingS3()
    yield server
    server.stop()
