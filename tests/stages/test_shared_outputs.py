"""The fp32 outputs a run's reduced precisions check against, computed once and read by the others
(stages.shared_outputs), on real models and real ONNX Runtime sessions."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import PROFILE_YAML, example_models, stage_record, trtflow, write_project

from trtflow.recipe import load_project
from trtflow.run.dag import dag_from_project
from trtflow.stages import compare, shared_outputs
from trtflow.stages import precision as precision_stage
from trtflow.stages.base import Upstream
from trtflow.util.servers import SHARED_OUTPUTS_ENV

RECIPE = (
    "source: {onnx: models/tiny.onnx}\nprecisions: [fp32, fp16, int8]\ntargets: [rtx-ada]\n"
    + PROFILE_YAML
    + "calibration: {data: calib/*.npz}\naccuracy: {samples: 4}\n"
)


def _feeds(count: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"input": rng.standard_normal((4, 3, 32, 32)).astype(np.float32)} for _ in range(count)]


@pytest.fixture
def shared(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder of the run's model tools' workers, as the stage sees it."""
    folder = tmp_path / "shared"
    folder.mkdir()
    monkeypatch.setenv(SHARED_OUTPUTS_ENV, str(folder))
    return folder


@pytest.fixture
def model(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.onnx"
    onnx.save(example_models().tiny_cnn(np.random.default_rng(0)), path)
    return path


def test_the_first_stage_leaves_the_outputs_and_the_next_reads_them_without_the_model(
    model: Path, tmp_path: Path, shared: Path
) -> None:
    feeds = _feeds(3)
    assert shared_outputs.fp32_outputs(model, {"model": "a" * 64}, feeds) is None  # a check computes them beside
    first = shared_outputs.fp32_outputs(model, {"model": "a" * 64}, feeds, needed=True)  # a search: at once
    assert first is not None and len(list(shared.glob("*.npz"))) == 1
    alone = compare.run_all(compare.session(model), feeds)  # what a check's own fp32 session gives
    assert all(
        np.array_equal(mine[name], theirs[name]) for mine, theirs in zip(first, alone, strict=True) for name in mine
    )
    # read back: no model file is opened (it is gone)
    again = shared_outputs.fp32_outputs(tmp_path / "gone.onnx", {"model": "a" * 64}, feeds)
    assert again is not None and all(
        np.array_equal(mine[name], theirs[name]) and mine[name].dtype == theirs[name].dtype
        for mine, theirs in zip(again, first, strict=True)
        for name in mine
    )
    # another model file, or one value of one feed changed: not the entry, so computed (and the gone model fails)
    changed = [dict(feed) for feed in feeds]
    changed[2] = {"input": changed[2]["input"].copy()}
    changed[2]["input"][0, 0, 0, 0] += 1.0
    for digests, fed in (({"model": "b" * 64}, feeds), ({"model": "a" * 64}, changed)):
        assert shared_outputs.fp32_outputs(tmp_path / "gone.onnx", digests, fed) is None
        with pytest.raises(Exception, match="gone.onnx|NO_SUCHFILE|No such file"):
            shared_outputs.fp32_outputs(tmp_path / "gone.onnx", digests, fed, needed=True)
    # a model of unknown digests shares nothing
    shared_outputs.leave_outputs({}, feeds, alone)
    assert len(list(shared.glob("*.npz"))) == 1 and shared_outputs.fp32_outputs(model, {}, feeds) is None
    # what a check computed beside its candidate, left for the others
    shared_outputs.leave_outputs({"model": "b" * 64}, feeds, alone)
    assert shared_outputs.fp32_outputs(tmp_path / "gone.onnx", {"model": "b" * 64}, feeds) is not None


def test_an_entry_that_cannot_be_read_is_computed_again(model: Path, tmp_path: Path, shared: Path) -> None:
    feeds = _feeds(2)
    entry = shared / f"{shared_outputs.entry_key('outputs', {'model': 'c' * 64}, feeds)}.npz"
    entry.write_bytes(b"PK\x03\x04 cut short")
    assert shared_outputs.fp32_outputs(model, {"model": "c" * 64}, feeds) is None
    outputs = shared_outputs.fp32_outputs(model, {"model": "c" * 64}, feeds, needed=True)
    assert outputs is not None and len(outputs) == 2
    assert shared_outputs.fp32_outputs(tmp_path / "gone.onnx", {"model": "c" * 64}, feeds) is not None  # rewritten
    ranges = shared / f"{shared_outputs.entry_key('ranges', {'model': 'c' * 64}, feeds)}.npz"
    np.savez(ranges, names=np.array('["a", "b"]'), lows=np.zeros(2, np.float64), highs=np.ones(2, np.float32))
    assert shared_outputs.known_ranges({"model": "c" * 64}, feeds) is None  # not float32: not what fp16 leaves
    ranges.write_bytes(b"not a zip")
    assert shared_outputs.known_ranges({"model": "c" * 64}, feeds) is None


def test_without_a_shared_folder_a_check_runs_fp32_beside_its_candidate_unless_asked(
    model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(SHARED_OUTPUTS_ENV, raising=False)
    assert shared_outputs.fp32_outputs(model, {"model": "d" * 64}, _feeds(1)) is None
    assert shared_outputs.fp32_outputs(model, {"model": "d" * 64}, _feeds(1), needed=True) is not None


def test_a_runs_precisions_record_what_each_stage_records_computing_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fp16, int8 and fp8 of one model in one run, their model tools' servers sharing a folder. Each stage then runs
    here again without it (its check runs fp32 beside the candidate, fp8 calibrates by running the model) and makes
    and records the same. With a folder of its own again, fp16 leaves the fp32 outputs and its value ranges, and fp8
    reads both: it quantizes without running the model over the data, to the same bytes."""
    from modelopt.onnx.quantization import ort_patching

    root = write_project(tmp_path / "proj", {"wide": RECIPE.replace("[fp32, fp16, int8]", "[fp32, fp16, int8, fp8]")})
    onnx.save(example_models().wide_cnn(np.random.default_rng(0)), root / "models" / "tiny.onnx")
    (root / "calib").mkdir()
    for index, feed in enumerate(_feeds(8, seed=3)):
        np.savez(root / "calib" / f"batch_{index:02d}.npz", **feed)
    result = trtflow(root, "run", "--json")
    assert result.code == 0, result.err + result.out
    lock = json.loads((root / "trtflow.lock").read_text())["nodes"]
    cleaned = lock["cleanup:wide"]["outputs"]["model"]
    objects = root / "artifacts" / "store" / "objects"

    def alone(precision: str) -> tuple[str, dict]:
        node = dag_from_project(load_project(root)).nodes[f"precision:wide/{precision}"]
        inputs = {"model": Upstream(files={"model": objects / cleaned[:2] / cleaned}, sha256={"model": cleaned})}
        inputs.update({role: Upstream(files={role: path}) for role, path in node.sources})
        workdir = tmp_path / f"alone-{precision}-{len(list(tmp_path.glob('alone-*')))}"
        workdir.mkdir()
        made = precision_stage.run(node.params, inputs, workdir)
        return hashlib.sha256(made.files["model"].read_bytes()).hexdigest(), made.record

    monkeypatch.delenv(SHARED_OUTPUTS_ENV, raising=False)
    for precision in ("fp16", "int8", "fp8"):
        digest, record = alone(precision)
        assert record["accuracy"] == stage_record(root, f"precision:wide/{precision}")["accuracy"], precision
        assert digest == lock[f"precision:wide/{precision}"]["outputs"]["model"], precision

    shared = tmp_path / "shared"
    shared.mkdir()
    monkeypatch.setenv(SHARED_OUTPUTS_ENV, str(shared))
    alone("fp16")
    assert len(list(shared.glob("*.npz"))) == 2  # the fp32 outputs and the value ranges
    own_collect, collected = ort_patching._collect_data_minmax_calibrator, []
    monkeypatch.setattr(
        ort_patching, "_collect_data_minmax_calibrator", lambda *args: collected.append(1) or own_collect(*args)
    )
    digest, record = alone("fp8")
    assert not collected and digest == lock["precision:wide/fp8"]["outputs"]["model"]
    assert record["accuracy"] == stage_record(root, "precision:wide/fp8")["accuracy"]


def test_a_stages_reference_is_computed_at_most_once_and_only_when_no_check_computed_it(
    model: Path, tmp_path: Path, shared: Path
) -> None:
    """A fallback search's trials need fp32's outputs, but only once its first try missed: the first check computes them
    beside its candidate and the stage holds them; the search computes them only where nothing did."""
    feeds = _feeds(2)
    alone = compare.run_all(compare.session(model), feeds)
    checked = shared_outputs.Reference(tmp_path / "gone.onnx", {"model": "d" * 64}, feeds)
    assert checked.outputs is None  # nothing left: the first check computes them
    checked.keep(alone)
    assert checked.needed() is alone  # held: the gone model is never opened
    assert shared_outputs.Reference(tmp_path / "gone.onnx", {"model": "d" * 64}, feeds).outputs is not None  # left
    unchecked = shared_outputs.Reference(model, {"model": "e" * 64}, feeds)
    first = unchecked.needed()
    assert unchecked.needed() is first and all(
        np.array_equal(mine[name], theirs[name]) for mine, theirs in zip(first, alone, strict=True) for name in mine
    )
    assert shared_outputs.Reference(tmp_path / "gone.onnx", {"model": "e" * 64}, feeds).outputs is not None
