"""Reproducible release builds: `--frozen` holds an engine to the lock's bytes or, where only the backend's generated
numbering differs, to its canonical digest, and says which; a real difference still fails."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from conftest import TINY_RECIPE, trtflow, write_project

from trtflow.hashing import stage_key

BUILD, VERIFY, PACKAGE = "build:tiny/fp32/rtx-ada", "verify:tiny/fp32/rtx-ada", "package:tiny"


def _locked_project(tmp_path: Path) -> Path:
    root = write_project(tmp_path / "p", {"tiny": TINY_RECIPE.replace("[rtx-ampere, rtx-ada]", "[rtx-ada]")})
    assert trtflow(root, "run").code == 0
    shutil.rmtree(root / "artifacts")  # a clean store, as on a release machine
    return root


def _as_if_the_locked_engine_had_other_bytes(root: Path, canonical: str | None = None) -> None:
    """Rewrite the lock as a run whose engine differed in its bytes (and, if given, in its canonical digest) would have
    written it: the build's output digest; with another canonical digest, also the keys of what consumed that engine
    (they take it by its canonical digest), computed by trtflow's own hash."""
    lock = json.loads((root / "trtflow.lock").read_text())
    nodes = lock["nodes"]
    nodes[BUILD]["outputs"]["engine"] = "e" * 64
    if canonical is None:  # an equivalent engine: what consumed it has the same key; the package carried its bytes
        assert nodes[VERIFY]["inputs"]["engine"] == "canonical:" + nodes[BUILD]["canonical"]["engine"]
        nodes[PACKAGE]["outputs"]["manifest.json"] = "f" * 64  # it names the engine by its sha256
    else:
        nodes[BUILD]["canonical"]["engine"] = canonical
        for node_id, role in ((VERIFY, "engine"), (PACKAGE, "engine:fp32/rtx-ada")):
            nodes[node_id]["inputs"][role] = "canonical:" + canonical
            nodes[node_id]["key"] = stage_key(
                {k: nodes[node_id][k] for k in ("kind", "version", "params", "fingerprint", "inputs")}
            )
    (root / "trtflow.lock").write_text(json.dumps(lock, indent=1, sort_keys=True) + "\n")


def test_frozen_accepts_an_engine_equivalent_to_the_lock_and_says_so(tmp_path: Path) -> None:
    root = _locked_project(tmp_path)
    _as_if_the_locked_engine_had_other_bytes(root)
    result = trtflow(root, "run", "--frozen", "--json")
    assert result.code == 0, result.out + result.err
    nodes = {n["id"]: n for n in json.loads(result.out)["nodes"]}
    assert nodes[BUILD]["reason"].startswith(
        "equivalent to trtflow.lock: the engine differs only in the backend's generated numbering"
    )
    assert {n["status"] for n in nodes.values()} == {"built"}
    # equivalence never cascades: verify keeps its key and its bytes, the package its key (issue 39: it was refused)
    assert json.loads(result.out)["frozen"]["equivalent"] == [BUILD]
    assert json.loads(result.out)["frozen"]["engines"] == {BUILD: "equivalent"}
    manifest = json.loads((root / "artifacts" / "packages" / "tiny" / "manifest.json").read_text())
    [engine] = manifest["engines"]
    assert engine["reproducible"] == "equivalent" and len(engine["canonical_sha256"]) == 64


def test_frozen_refuses_an_engine_whose_canonical_digest_differs(tmp_path: Path) -> None:
    root = _locked_project(tmp_path)
    _as_if_the_locked_engine_had_other_bytes(root, canonical="c" * 64)
    result = trtflow(root, "run", "--frozen", "--json")
    assert result.code == 1
    nodes = {n["id"]: n for n in json.loads(result.out)["nodes"]}
    assert nodes[BUILD]["status"] == "failed"
    assert nodes[BUILD]["reason"] == (
        "engine differs from trtflow.lock and its canonical digest differs too: not reproducible; `trtflow run "
        "--check-repro 2` shows whether this machine rebuilds it the same (docs/reproducibility.md)"
    )
    assert nodes[VERIFY]["status"] == nodes[PACKAGE]["status"] == "skipped"
    assert json.loads(result.out)["frozen"]["engines"] == {BUILD: "different"}


def test_check_repro_rebuilds_every_engine_in_hermetic_workers_and_reports_each(tmp_path: Path) -> None:
    """MobileNetV3-style: hermetic rebuilds of it can still differ in numbering (a thread race): identical or
    equivalent."""
    import yaml
    from zoo import zoo_model

    model = zoo_model("mobilenet", tmp_path / "zoo")
    recipe = yaml.safe_dump(
        {"source": {"onnx": "models/mobilenet.onnx"}, "targets": ["rtx-ada"], "profiles": [model.recipe_profile()]}
    )
    root = write_project(tmp_path / "p", {"mobilenet": recipe})
    shutil.copyfile(model.path, root / "models" / "mobilenet.onnx")
    result = trtflow(root, "run", "--check-repro", "3", "--json")
    assert result.code == 0, result.out + result.err
    [check] = json.loads(result.out)["reproducibility"]
    assert check["id"] == "build:mobilenet/fp32/rtx-ada" and check["rebuilds"] == 3 and check["equivalent"] == 3
    assert check["verdict"] == ("identical" if check["identical"] == 3 else "equivalent")
    plain = trtflow(root, "run", "--check-repro", "1")  # cached stages: the gate still rebuilds
    assert plain.code == 0 and "reproducibility (1 hermetic rebuild(s) per engine):" in plain.out


def test_a_rebuild_that_is_not_equivalent_or_fails_is_different() -> None:
    from trtflow.run.repro import EngineRepro

    assert EngineRepro("b", 3, identical=3, equivalent=3).verdict == "identical"
    assert EngineRepro("b", 3, identical=1, equivalent=3).verdict == "equivalent"
    assert EngineRepro("b", 3, identical=1, equivalent=2).verdict == "different"
    assert (
        EngineRepro("b", 3, identical=2, equivalent=2, failures=("hermetic worker failed: killed by SIGSEGV",)).verdict
        == "different"
    )
