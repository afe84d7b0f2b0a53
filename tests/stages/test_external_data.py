"""ONNX sources whose weights live in files beside the graph: hashed over every file, copied into the store, built."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import trtflow, write_project
from onnx import TensorProto, helper, numpy_helper

from trtflow.hashing import RACY_WINDOW_NS, FileDigests
from trtflow.stages.modelfile import ALIGNMENT, INLINE_BELOW, external_data_locations, load_graph, save_model

RECIPE = """\
source:
  onnx: models/mlp.onnx
profiles:
  - inputs:
      input: {min: [1, 256], opt: [2, 256], max: [4, 256]}
targets: [rtx-ada]
"""


def mlp(seed: int) -> onnx.ModelProto:
    """256 -> 2048 -> 4 MLP: a 2 MiB and a 32 KiB weight (both external) and a 16-byte bias (inline: under save_model's
    size threshold)."""
    rng = np.random.default_rng(seed)
    inits = [
        numpy_helper.from_array((rng.standard_normal(shape) * 0.05).astype(np.float32), name)
        for name, shape in (("w1", (256, 2048)), ("w2", (2048, 4)), ("b2", (4,)))
    ]
    nodes = [
        helper.make_node("MatMul", ["input", "w1"], ["h"]),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("MatMul", ["r", "w2"], ["m"]),
        helper.make_node("Add", ["m", "b2"], ["output"]),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 256])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", 4])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def save_external(model: onnx.ModelProto, path: Path) -> None:
    """One file per tensor of 1 KiB or more (named after the tensor), as save_as_external_data writes them."""
    onnx.save_model(model, path, save_as_external_data=True, all_tensors_to_one_file=False, size_threshold=1024)


def components(root: Path, node_id: str) -> dict:
    return json.loads((root / "trtflow.lock").read_text())["nodes"][node_id]


@pytest.fixture
def mlp_project(tmp_path: Path) -> Path:
    root = write_project(tmp_path / "p", {"mlp": RECIPE})
    save_external(mlp(seed=0), root / "models" / "mlp.onnx")
    assert sorted(p.name for p in (root / "models").glob("w*")) == ["w1", "w2"]
    return root


def test_a_model_with_external_data_is_hashed_over_all_its_files_and_builds(mlp_project: Path) -> None:
    result = trtflow(mlp_project, "run", "--json")
    assert result.code == 0, result.err
    assert json.loads(result.out)["failed"] == 0
    lock = json.loads((mlp_project / "trtflow.lock").read_text())["nodes"]
    inputs = lock["cleanup:mlp"]["inputs"]
    assert sorted(inputs) == ["model", "model.data:w1", "model.data:w2"]
    # one weights file in the store, beside the graph
    assert sorted(lock["cleanup:mlp"]["outputs"]) == [
        "model",
        "model.data",
    ]
    assert sorted(lock["build:mlp/fp32/rtx-ada"]["inputs"]) == ["model", "model.data"]
    manifest = json.loads((mlp_project / "artifacts/packages/mlp/manifest.json").read_text())
    assert [t["shape"] for t in manifest["engines"][0]["tensors"]] == [[-1, 256], [-1, 4]]


def test_changing_only_an_external_weights_file_rebuilds(mlp_project: Path) -> None:
    assert trtflow(mlp_project, "run").code == 0
    engine = json.loads((mlp_project / "artifacts/packages/mlp/manifest.json").read_text())["engines"][0]["sha256"]
    graph = (mlp_project / "models" / "mlp.onnx").read_bytes()
    other = mlp_project / "other"
    other.mkdir()
    save_external(mlp(seed=1), other / "mlp.onnx")
    (mlp_project / "models" / "w1").write_bytes((other / "w1").read_bytes())
    assert (mlp_project / "models" / "mlp.onnx").read_bytes() == graph  # the graph file itself is unchanged
    assert (
        "cleanup:mlp" in (explained := trtflow(mlp_project, "plan", "--explain").out)
        and "input model.data:w1 changed" in explained
    )
    result = trtflow(mlp_project, "run", "--json")
    assert {n["id"] for n in json.loads(result.out)["nodes"] if n["status"] == "built"} >= {
        "cleanup:mlp",
        "build:mlp/fp32/rtx-ada",
    }
    assert (
        json.loads((mlp_project / "artifacts/packages/mlp/manifest.json").read_text())["engines"][0]["sha256"] != engine
    )


def test_a_missing_weights_file_is_named_before_anything_runs(mlp_project: Path) -> None:
    (mlp_project / "models" / "w2").unlink()
    for command in ("validate", "run", "plan"):
        result = trtflow(mlp_project, command)
        assert (
            result.code == 3
            and result.err
            == "error: recipes/mlp.yaml:2: source.onnx: external data file w2 not found beside mlp.onnx\n"
        ), (command, result.err)
    assert not (mlp_project / "artifacts").exists()


def test_cleanup_copies_large_tensors_byte_for_byte_without_loading_them(tmp_path: Path) -> None:
    save_external(mlp(seed=2), tmp_path / "mlp.onnx")
    model, unloaded = load_graph(onnx, tmp_path / "mlp.onnx")
    tensors = {t.name: t for t in model.graph.initializer}
    assert not tensors["w1"].raw_data and len(unloaded) == 1  # 2 MiB stays in its file
    assert 0 < len(tensors["w2"].raw_data) < INLINE_BELOW  # 32 KiB is read in
    out = tmp_path / "out"
    out.mkdir()
    files, inline = save_model(onnx, model, out, unloaded=unloaded)
    assert inline is None  # the weights left unloaded stay external: the checker reads the files
    original = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(tmp_path / "mlp.onnx")).graph.initializer}
    saved = onnx.load(str(files["model"]))  # its external data resolved from model.onnx.data beside it
    assert all(np.array_equal(numpy_helper.to_array(t), original[t.name]) for t in saved.graph.initializer)
    written = onnx.load(str(files["model"]), load_external_data=False).graph
    offsets = [
        int(dict((e.key, e.value) for e in t.external_data)["offset"]) for t in written.initializer if t.external_data
    ]
    assert len(offsets) == 2 and all(offset % ALIGNMENT == 0 for offset in offsets)  # w1 and w2; the bias stays inline


def test_the_external_file_list_is_parsed_only_when_the_graph_changes(tmp_path: Path) -> None:
    path = tmp_path / "mlp.onnx"
    save_external(mlp(seed=3), path)
    past = time.time_ns() - 10 * RACY_WINDOW_NS  # older than the racy window: its digest may be remembered
    os.utime(path, ns=(past, past))
    calls: list[Path] = []

    def parse(model_path: Path) -> list[str]:
        calls.append(model_path)
        return external_data_locations(model_path)

    digests = FileDigests()
    first = digests.digest_with_companions(path, parse)
    assert digests.digest_with_companions(path, parse) == first and len(calls) == 1
    assert sorted(first) == ["", "w1", "w2"]
    model = onnx.load(str(path), load_external_data=False)
    model.doc_string = "changed"
    onnx.save(model, path)
    os.utime(path, ns=(past, past + 1))
    assert digests.digest_with_companions(path, parse)[""] != first[""] and len(calls) == 2


def test_a_graph_without_the_location_key_is_not_parsed_for_external_data(tmp_path: Path) -> None:
    """Only a file holding the bytes `location` (every external reference spells the key out) is parsed; the bytes
    are found across the boundary of the chunks the file is scanned in, and an inline model names no files."""
    from trtflow.stages import modelfile

    inline = tmp_path / "inline.onnx"
    onnx.save(mlp(seed=4), inline)
    assert LOCATION not in inline.read_bytes() and external_data_locations(inline) == []
    across = tmp_path / "across.bin"
    across.write_bytes(b"\0" * (modelfile.SCAN_CHUNK - 3) + LOCATION + b"\0")
    assert modelfile._may_name_external_data(across)
    across.write_bytes(b"\0" * (modelfile.SCAN_CHUNK - 3) + LOCATION[:-1] + b"\0")
    assert not modelfile._may_name_external_data(across)
    external = tmp_path / "external.onnx"
    save_external(mlp(seed=4), external)
    assert external_data_locations(external) == ["w1", "w2"]


LOCATION = b"location"


def test_a_reduced_precision_reads_external_data_that_the_store_links(tmp_path: Path) -> None:
    """onnx refuses external data from a file with more than one hard link ("potential hardlink attack"), and the
    store links its objects into a stage's folder: precision copies a model's weights before ModelOpt loads them."""
    root = write_project(tmp_path / "p", {"mlp": RECIPE.replace("targets:", "precisions: [fp32, fp16]\ntargets:")})
    save_external(mlp(seed=0), root / "models" / "mlp.onnx")
    result = trtflow(root, "run", "--json")
    assert result.code == 0, result.err
    lock = json.loads((root / "trtflow.lock").read_text())["nodes"]
    assert sorted(lock["precision:mlp/fp16"]["inputs"]) == ["model", "model.data"]
    # the fp16 model keeps its weights outside the graph too, and was checked from those files
    assert sorted(lock["build:mlp/fp16/rtx-ada"]["inputs"]) == ["model", "model.data"]
