"""Stable keys: a key changes only when a stage's VERSION changes (listed in CHANGELOG.md) or the user changed
something. The keys of a fixed project (the example's models under recipes that set many options) are pinned in
tests/golden/keys.json, without the tool versions (the fingerprint), which follow the machine.

After a deliberate change (a VERSION bump listed in CHANGELOG.md), `PYTHONPATH=tests python
tests/run/test_golden_keys.py` rewrites the file.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pydantic
import pytest
from conftest import REPO, trtflow, write_project

GOLDEN = Path(__file__).parents[1] / "golden" / "keys.json"
RECIPES = {
    "plain": "source: {onnx: models/tiny_cnn.onnx}\nprecisions: [fp32]\nprofiles:\n"
    "  - inputs:\n      input: {min: [1, 3, 32, 32], opt: [4, 3, 32, 32], max: [8, 3, 32, 32]}\n",
    "defaults_written": "source: {onnx: models/tiny_cnn.onnx}\nprecisions: [fp32]\nprofiles:\n"
    "  - inputs:\n      input: {min: [1, 3, 32, 32], opt: [4, 3, 32, 32], max: [8, 3, 32, 32]}\n"
    "build: {optimization_level: 3, workspace_mib: null, profiling_verbosity: null}\n"
    "cleanup: {simplify: true}\nverify: {on_fail: fail}\n",
    "options": "source: {onnx: models/tiny_cnn.onnx}\nprecisions: [fp32, fp16, int8, fp8]\ntargets: [rtx-ada]\n"
    "calibration: {random: true, method: max}\nprofiles:\n"
    "  - inputs:\n      input: {min: [1, 3, 32, 32], opt: [4, 3, 32, 32], max: [8, 3, 32, 32]}\n"
    "  - inputs:\n      input: {shape: [32, 3, 32, 32]}\n"
    "build: {optimization_level: 5, workspace_mib: 256, profiling_verbosity: detailed}\n"
    "autocast: {keep_op_types: [Softmax]}\nquantize: {exclude_op_types: [Add]}\n"
    "accuracy: {int8: {min_cosine: 0.98}}\nverify: {rtol: 0.01, atol: 0.001, samples: 4, seed: 3}\n",
    "lstm": "source: {onnx: models/seq_lstm.onnx}\nprecisions: [fp32, fp16]\n"
    "profiles:\n  - inputs:\n      sequence: {shape: [50, 1, 32]}\n",
}


def project_keys(root: Path) -> dict[str, str]:
    """node id -> the hash of its kind, stage version and params (what the recipe and the code decide)."""
    from trtflow.hashing import stage_key
    from trtflow.recipe import load_project
    from trtflow.run.dag import dag_from_project

    dag = dag_from_project(load_project(root))
    return {node.id: stage_key({k: v for k, v in node.known_parts.items() if k != "fingerprint"}) for node in dag}


def golden_project(root: Path) -> Path:
    """The fixed project: the example's pipeline and models, the recipes above."""
    write_project(root, RECIPES)
    for name in ("tiny_cnn.onnx", "seq_lstm.onnx"):
        (root / "models" / name).write_bytes((REPO / "models" / name).read_bytes())
    return root


def stage_versions() -> dict[str, int]:
    """Each stage kind's VERSION."""
    from trtflow.stages import STAGE_KINDS, stage

    return {kind: stage(kind).version for kind in STAGE_KINDS}


def test_the_keys_of_a_fixed_project_change_only_with_a_listed_stage_version(tmp_path: Path) -> None:
    golden = json.loads(GOLDEN.read_text())
    keys = project_keys(golden_project(tmp_path / "p"))
    changed = sorted(node for node in keys.keys() | golden["keys"].keys() if keys.get(node) != golden["keys"].get(node))
    versions = stage_versions()
    assert not changed or versions != golden["versions"], (
        f"stage keys changed with no stage VERSION change: {changed[:5]}; a field added with a default must not enter "
        "a key "
        "(StageParams.key_parts); if the output really changes, bump that stage's VERSION and list it in CHANGELOG.md"
    )
    assert versions == golden["versions"] and not changed, (
        f"stage versions {versions} (golden {golden['versions']}): list the change in CHANGELOG.md, then rewrite the "
        "golden keys with `PYTHONPATH=tests python tests/run/test_golden_keys.py`"
    )


def test_the_changelog_names_the_current_stage_versions() -> None:
    top = (REPO / "CHANGELOG.md").read_text().split("\n## ")[1]  # the newest release's entry
    line = re.search(r"Stage versions now: (.*)\.", top)
    assert line, "CHANGELOG.md's newest entry must say `Stage versions now: export N, cleanup N, ...`"
    listed = {kind: int(version) for kind, version in re.findall(r"(\w+) (\d+)", line.group(1))}
    assert listed == stage_versions()


def test_written_out_defaults_make_the_same_keys_as_unset_ones(tmp_path: Path) -> None:
    keys = project_keys(golden_project(tmp_path / "p"))
    for node, key in keys.items():
        if node.startswith(("build:plain/", "cleanup:plain", "verify:plain/")):
            assert keys[node.replace("plain", "defaults_written")] == key, node


def test_a_new_option_with_a_default_changes_no_key(tmp_path: Path) -> None:
    """As if a release added a builder option: the same params with it at its default hash the same."""
    from trtflow.recipe import load_project
    from trtflow.run.dag import dag_from_project

    dag = dag_from_project(load_project(golden_project(tmp_path / "p")))
    for node in (n for n in dag if n.kind in ("build", "precision", "cleanup", "verify")):
        params = type(node.params)
        grown = pydantic.create_model(
            f"Grown{params.__name__}", __base__=params, new_option=(int, 7), new_options=(dict, {"x": 1})
        )
        fields = node.params.model_dump()
        assert grown(**fields).key_parts() == node.params.key_parts(), node.id
        # written out at its default
        assert grown(**fields, new_option=7).key_parts() == node.params.key_parts(), node.id
        assert grown(**fields, new_option=8).key_parts() != node.params.key_parts(), node.id


def test_version_is_one_number_everywhere(tmp_path: Path) -> None:
    tomllib = pytest.importorskip("tomllib")
    from trtflow import __version__

    assert tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"] == __version__
    assert f"## {__version__}" in (REPO / "CHANGELOG.md").read_text()
    shown = trtflow(tmp_path, "--version")
    assert shown.code == 0 and shown.out == f"trtflow, version {__version__}\n"


if __name__ == "__main__":  # rewrite the golden keys after a deliberate, CHANGELOG-listed change
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(
            json.dumps(
                {"versions": stage_versions(), "keys": project_keys(golden_project(Path(folder) / "p"))},
                indent=1,
                sort_keys=True,
            )
            + "\n"
        )
    print(f"wrote {GOLDEN}", file=sys.stderr)
