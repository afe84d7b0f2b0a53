"""accuracy.<precision>.fallback: auto on a model whose int8 error sits in one place: an MLP fed one unnormalized
feature (1,000x the others, compensated in the first layer's weights: the same function), the outlier that makes a
per-tensor int8 scale lose every other channel (real networks' unnormalized inputs, transformers' outlier features).
Plain PTQ misses its limit; the search keeps the one layer that reads the outlier in high precision and meets it,
with most MACs still in int8, reproducibly."""

from __future__ import annotations

import functools
import json
import re
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import stage_record, trtflow, write_project
from onnx import numpy_helper
from zoo import zoo_model

from trtflow.stages import accuracy, compare, convert, fallback, fallback_cuts, fallback_switch, fallback_trial
from trtflow.stages.emulation import ort_runnable
from trtflow.stages.fallback_blocks import balanced, blocks
from trtflow.stages.fallback_ranking import shortest_passing_prefix

OUTLIER, SCALE = 5, 1000.0
RECIPE = """\
source: {onnx: models/m.onnx}
precisions: [int8]
targets: [rtx-ada]
calibration: {data: "calib/*.npy"}
accuracy: {samples: 8, int8: {min_cosine: 0.999%s}}
profiles:
  - inputs:
      features: {min: [1, 64], opt: [16, 64], max: [64, 64]}
"""


def _with_outlier(path: Path, out: Path) -> list[str]:
    """The zoo MLP with its first layer's weights for feature OUTLIER SCALE times smaller (fed SCALE times larger,
    it computes what it did); returns the Gemm names in order."""
    model = onnx.load(path)
    gemms = [n for n in model.graph.node if n.op_type == "Gemm"]
    weights = next(i for i in model.graph.initializer if i.name == gemms[0].input[1])
    array = numpy_helper.to_array(weights).copy()
    array[:, OUTLIER] /= SCALE  # torch's Linear: weight [out, in] (transB)
    weights.CopyFrom(numpy_helper.from_array(array, weights.name))
    onnx.save(model, out)
    return [n.name for n in gemms]


def _project(root: Path, zoo_dir: Path, extra: str = "") -> tuple[Path, list[str]]:
    root = write_project(root, {"m": RECIPE % extra})
    gemms = _with_outlier(zoo_model("classifier", zoo_dir).path, root / "models" / "m.onnx")
    (root / "calib").mkdir()
    rng = np.random.default_rng(3)
    for index in range(24):
        features = rng.standard_normal((16, 64)).astype(np.float32)
        features[:, OUTLIER] *= SCALE
        np.save(root / "calib" / f"{index:02d}.npy", features)
    return root, gemms


def test_plain_int8_misses_the_limit_of_a_model_with_an_outlier_channel(tmp_path: Path, zoo_dir: Path) -> None:
    root, _ = _project(tmp_path / "p", zoo_dir)
    result = trtflow(root, "run")
    assert result.code == 1 and "int8 accuracy out of tolerance" in result.err, result.err
    assert "fallback" not in result.err


@pytest.mark.slow
def test_fallback_keeps_the_layer_that_reads_the_outlier_and_meets_the_limit(tmp_path: Path, zoo_dir: Path) -> None:
    root, gemms = _project(tmp_path / "p", zoo_dir, ", fallback: auto, min_share: 0.5")
    result = trtflow(root, "run", "--json")
    assert result.code == 0, result.err
    record = stage_record(root, "precision:m/int8")
    search = record["fallback"]
    assert search["passed"] and record["accuracy"]["passed"]
    assert [row["name"] for row in search["kept"]] == [gemms[0]]  # the layer reading the outlier feature, only
    assert search["kept"][0]["sensitivity"] > 0 and search["sensitivity"][0]["name"] == gemms[0]
    assert search["before"]["outputs"]["logits"]["cosine_similarity"] < 0.999
    assert search["after"]["outputs"]["logits"]["cosine_similarity"] >= 0.999
    assert record["composition"]["mac_share"] > 0.6  # the other layers are still int8
    # the package's manifest and inspect say so
    manifest = json.loads((root / "artifacts" / "packages" / "m" / "manifest.json").read_text())
    (engine,) = manifest["engines"]
    assert engine["verification"]["precision_fallback"]["kept"] == search["kept"]
    shown = trtflow(root, "inspect", str(root / "artifacts" / "packages" / "m")).out
    assert f"{gemms[0]} (Gemm" in shown and "kept by fallback: auto (sensitivity" in shown, shown
    provisioned = trtflow(root, "provision", str(root / "artifacts" / "packages" / "m"), "--gpu", "sm_89", "--dest",
        str(tmp_path / "dest"))  # fmt: skip
    assert "int8 with 1 node(s) kept higher by fallback: auto (65% of MACs in int8)" in provisioned.out, provisioned
    assert search["modelopt_runs"] == 1 and search["trial_models"] >= search["candidates"]
    # cached: a repeat run is a no-op; reproducible: another folder builds the same bytes and passes --frozen
    assert "0 built" in trtflow(root, "run").out
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(root, elsewhere, ignore=shutil.ignore_patterns("artifacts"))
    frozen = trtflow(elsewhere, "run", "--frozen")
    assert frozen.code == 0, frozen.err
    locks = [json.loads((r / "trtflow.lock").read_text())["nodes"]["precision:m/int8"] for r in (root, elsewhere)]
    assert locks[0]["outputs"] == locks[1]["outputs"]


def test_a_limit_fallback_cannot_reach_within_min_share_fails_with_the_best_it_found(
    tmp_path: Path, zoo_dir: Path
) -> None:
    """min_share 0.9: keeping the one layer would leave 65% of the MACs in int8; the stage fails, saying what the
    search reached and within what."""
    root, _ = _project(tmp_path / "p", zoo_dir, ", fallback: auto, min_share: 0.9")
    result = trtflow(root, "run")
    assert result.code == 1
    assert "fallback: auto (" in result.err and "(min_share 0.9)" in result.err, result.err
    assert "keeping the 1 most sensitive node(s) meets the limits but leaves 65% of the MACs" in result.err


def test_the_shortest_passing_prefix_is_found_by_doubling_then_bisecting() -> None:
    asked: list[int] = []

    def passes(count: int) -> bool:
        asked.append(count)
        return count >= 11

    assert shortest_passing_prefix(40, passes) == 11
    assert asked == [1, 2, 4, 8, 16, 12, 10, 11]
    assert shortest_passing_prefix(5, lambda count: False) is None
    assert shortest_passing_prefix(0, lambda count: True) is None
    # with a cap (the most min_share allows), nothing past it: the doubling stops there
    asked.clear()
    assert shortest_passing_prefix(40, passes, cap=8) is None and asked == [1, 2, 4, 8]
    asked.clear()
    assert shortest_passing_prefix(40, passes, cap=20) == 11 and asked == [1, 2, 4, 8, 16, 12, 10, 11]
    # more kept can miss where fewer meet the limits (a near-tied row flipped): the cap missing ends nothing
    asked.clear()
    assert shortest_passing_prefix(67, lambda count: asked.append(count) or 4 <= count < 21, cap=21) == 4
    assert asked == [1, 2, 4, 3]


def test_a_confirmations_step_is_cut_short_where_it_would_go_past_min_share() -> None:
    within = lambda count: count <= 13  # noqa: E731 (keeping more than 13 leaves less than min_share)
    assert fallback._next_count(10, 1, within) == 11
    assert fallback._next_count(10, 2, within) == 12
    assert fallback._next_count(11, 4, within) == 13  # 15 would go past: the most within
    # nothing more fits: one more, which the search judges without a ModelOpt run and reports as below min_share
    assert fallback._next_count(13, 2, within) == 14


def test_a_trial_computes_modelopts_model_keeping_the_same_nodes_bit_for_bit(tmp_path: Path, zoo_dir: Path) -> None:
    """ModelOpt's model keeping nodes out of int8 (`nodes_to_exclude`) reads more than them off its Q/DQ, and less:
    the ReduceMean beside a kept squeeze-excitation Mul and the residual Add beside a kept Conv come off where nothing
    else quantizes what they read; a kept ReduceMean changes nothing while the Mul beside it stays quantized; a kept
    residual Add still reads quantized the input that the next layer's projections quantize (a transformer). The
    search's trial keeping the same nodes computes ModelOpt's model bit for bit; a copy rewired to read every input of
    the kept nodes off its Q/DQ does not."""
    rng = np.random.default_rng(5)
    options = {"method": "entropy", "exclude_op_types": [], "exclude_nodes": [], "high_precision": "fp16"}
    options["external_data"] = False
    mean = ""
    for model, feeds in (
        ("mobilenet", [{"input": rng.standard_normal((4, 3, 64, 64)).astype(np.float32)} for _ in range(2)]),
        ("encoder", [{"embeddings": rng.standard_normal((4, 16, 64)).astype(np.float32)} for _ in range(2)]),
    ):
        source = zoo_model(model, zoo_dir).path
        quantized = convert.quantize(source, tmp_path / f"{model}.onnx", "int8", feeds, options)
        found = fallback.candidates(quantized)
        names, of = [name for name, _ in found], [op for _, op in found]
        switched, inputs = fallback_switch.switched(quantized, names)
        board = ort_runnable(switched)[0]
        run = functools.partial(_run, feeds=feeds)
        reads = _quantized_reads(quantized)
        if model == "mobilenet":
            mean, mul = (names[of.index(op)] for op in ("ReduceMean", "Mul"))
            # a Conv that quantizes a tensor a residual Add reads too: keeping the Conv takes it off for both
            conv = next(
                readers[0]
                for readers in reads.values()
                if sorted(of[names.index(r)] for r in readers) == ["Add", "Conv"]
                and of[names.index(readers[0])] == "Conv"
            )
            keeps = [[mean], [mul], [conv]]
        else:  # a residual Add one of whose inputs a MatMul also reads quantized
            add = next(
                r
                for t, readers in reads.items()
                for r in readers
                if of[names.index(r)] == "Add" and any(of[names.index(o)] == "MatMul" for o in readers if o != r)
            )
            keeps = [[add]]
        plain = run(ort_runnable(quantized)[0])
        for kept in keeps:
            exclude = [f"^{re.escape(name)}$" for name in kept]
            made = convert.quantize(source, tmp_path / "e.onnx", "int8", feeds, {**options, "exclude_nodes": exclude})
            want = run(ort_runnable(made)[0])
            assert _same(run(fallback_switch.resolved(board, fallback_switch.wiring(inputs, kept))), want), kept
            assert _same(run(ort_runnable(_as_modelopt(quantized, kept))[0]), want), kept  # the test's own account
            assert not _same(run(ort_runnable(_rewired(quantized, kept))[0]), want), kept
            assert _same(want, plain) is (kept == [mean]), kept  # a kept ReduceMean beside a quantized Mul: no change


@pytest.mark.slow
def test_fp16_fallback_keeps_nodes_in_fp32_through_autocast_until_the_limit_holds(
    tmp_path: Path, zoo_dir: Path
) -> None:
    """fp16 of the zoo encoder misses top-1 (0.94 against 0.99: its logits nearly tie) and a cosine of 0.9999999; the
    search keeps nodes in fp32 (what AutoCast's nodes_to_exclude does, tried on its model without running it), then
    AutoCast makes the model with them kept, and the check passes with at least 30% of the MACs in fp16. The kept
    nodes carry their reason."""
    limits = "fp16: {min_cosine: 0.9999999, fallback: auto, min_share: 0.3}"
    recipe = ENCODER_RECIPE.replace("[int8]", "[fp16]").replace(
        "int8: {min_cosine: 0.9999, fallback: auto, min_share: 0.0}", limits
    )
    root = write_project(tmp_path / "p", {"e": recipe.replace("calibration: {random: true, samples: 4}\n", "")})
    shutil.copyfile(zoo_model("encoder", zoo_dir).path, root / "models" / "e.onnx")
    assert trtflow(root, "validate").code == 0
    result = trtflow(root, "run")
    assert result.code == 0, result.err
    record = stage_record(root, "precision:e/fp16")
    search = record["fallback"]
    assert not search["before"]["outputs"]["logits"]["top1_agreement"] >= 0.99, search["before"]
    assert record["accuracy"]["passed"] and search["passed"] and search["modelopt_runs"] >= 1, search
    assert search["kept"] and search["after"]["mac_share"] >= search["min_share"] == 0.3, search
    reasons = {row["name"]: row["reason"] for row in record["composition"]["kept"]}
    assert any(reason.startswith("kept by fallback: auto") for reason in reasons.values()), reasons


@pytest.mark.slow
def test_a_labelled_task_missing_max_drop_meets_it_with_fallback(tmp_path: Path, zoo_dir: Path) -> None:
    """The same model scored on labelled rows (labels: what fp32 answers, so fp32's top-1 is 1.0): plain int8 drops
    far past `max_drop: {top1: 0.05}`; with fallback the search holds its trial models to max_drop too (the
    labelled rows, not only the outputs' limits) and the stage meets it."""
    import onnxruntime

    limits = "max_drop: {top1: 0.05}%s"
    recipe = RECIPE.replace("accuracy: {samples: 8, int8: {min_cosine: 0.999%s}}", "accuracy:\n"
        "  data: val/*.npz\n  labels: val/labels.npy\n  int8: {" + limits + "}")  # fmt: skip
    results = {}
    for name, extra in (("plain", ""), ("fallback", ", fallback: auto")):
        root, _ = _project(tmp_path / name, zoo_dir)
        (root / "recipes" / "m.yaml").write_text(recipe % extra)
        rows = np.random.default_rng(11).standard_normal((128, 64)).astype(np.float32)
        rows[:, OUTLIER] *= SCALE
        (root / "val").mkdir()
        np.savez(root / "val" / "rows.npz", features=rows)
        session = onnxruntime.InferenceSession(str(root / "models" / "m.onnx"), providers=["CPUExecutionProvider"])
        np.save(root / "val" / "labels.npy", session.run(None, {"features": rows})[0].argmax(axis=1).astype(np.int64))
        results[name] = (trtflow(root, "run"), root)
    plain, _ = results["plain"]
    assert plain.code == 1 and "[task accuracy: int8 top1" in plain.err and "> 0.05)" in plain.err, plain.err
    found, root = results["fallback"]
    assert found.code == 0, found.err
    record = stage_record(root, "precision:m/int8")
    task = record["accuracy"]["task"]
    assert task["fp32"] == 1.0 and task["drop"] <= 0.05 and task["passed"] and record["fallback"]["passed"]


def test_a_search_that_must_keep_every_node_fails_in_one_line_not_a_crash(tmp_path: Path, zoo_dir: Path) -> None:
    """Limits only fp32 meets: the shortest passing prefix keeps every candidate, and ModelOpt then quantizes nothing.
    The stage fails saying so, with what the search reached (before: ModelOpt's "quantized no node" refusal ended
    the stage as if int8 could not be made at all; BERT-base met it after a 724 s search)."""
    root, _ = _project(tmp_path / "p", zoo_dir, "95, fallback: auto, min_share: 0.0")  # 0.99995: both nodes
    result = trtflow(root, "run")
    assert result.code == 1, result.err
    assert "keeping the 2 most sensitive node(s) leaves ModelOpt nothing to quantize" in result.err, result.err
    assert "Traceback" not in result.err


ENCODER_RECIPE = """\
source: {onnx: models/e.onnx}
precisions: [int8]
targets: [rtx-ada]
calibration: {random: true, samples: 4}
accuracy: {samples: 4, int8: {min_cosine: 0.9999, fallback: auto, min_share: 0.0}}
verify: {on_fail: warn}
profiles:
  - inputs:
      embeddings: {min: [1, 16, 64], opt: [4, 16, 64], max: [8, 16, 64]}
"""


def test_candidates_split_into_blocks_where_residual_connections_join(zoo_dir: Path) -> None:
    """The zoo's 4-layer encoder: each layer's attention half and feed-forward half end at a residual Add, so its
    compute nodes fall into 8 blocks in graph order (bias Adds, whose other input is a weight, split nothing)."""
    model = onnx.load(zoo_model("encoder", zoo_dir).path, load_external_data=False)
    found = [(n.name, n.op_type) for n in model.graph.node if n.op_type in ("MatMul", "Gemm", "Add")]
    split = blocks(model, found)
    assert len(split) == 9  # 4 layers x 2 halves, then the head after the last residual join
    assert [c for block in split for c in block] == found  # every candidate once, in graph order
    assert all(block[-1][1] == "Add" for block in split[:-1])  # each block ends with its residual Add
    residual = [n for n in model.graph.node if n.op_type == "Add" and n.name == split[0][-1][0]]
    inits = {i.name for i in model.graph.initializer}
    assert residual and not any(i in inits for i in residual[0].input)


@pytest.mark.slow
def test_a_residual_model_is_searched_block_by_block_in_fewer_trials(
    tmp_path: Path, zoo_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The zoo encoder at a cosine limit int8 misses (its error in a few nodes): blocks are ranked first, then the
    nodes of the blocks the search keeps, so the search takes fewer trial models than it has candidates (ranking every
    node alone took one each) and keeps a few nodes, the most sensitive ones. Meanwhile the run's heartbeat says
    which step of the search it is at."""
    monkeypatch.setenv("TRTFLOW_HEARTBEAT_SECONDS", "0.1")
    root = write_project(tmp_path / "p", {"e": ENCODER_RECIPE})
    shutil.copyfile(zoo_model("encoder", zoo_dir).path, root / "models" / "e.onnx")
    result = trtflow(root, "run")
    assert result.code == 0, result.err
    steps = [line.partition(" s: ")[2] for line in result.err.splitlines() if line.startswith("still    precision:e")]
    assert any(step.startswith("fallback: sensitivity measured for ") for step in steps), result.err
    assert any(step.startswith("fallback: trial model ") for step in steps), result.err
    search = stage_record(root, "precision:e/int8")["fallback"]
    # 8 blocks (one per half layer) joined into about sqrt(36) groups
    assert 2 <= search["blocks"] <= 8 and search["candidates"] == 36, search
    assert search["trial_models"] < search["candidates"], search
    assert search["after"]["outputs"]["logits"]["cosine_similarity"] >= 0.9999 or search.get("below_min_share")
    assert search["kept"] and all(isinstance(row["sensitivity"], float) for row in search["kept"])
    assert [row["name"] for row in search["sensitivity"]][: len(search["kept"])] == [r["name"] for r in search["kept"]]


def test_where_the_error_removed_keeps_too_much_the_search_ranks_by_the_error_each_node_adds_alone(
    tmp_path: Path, zoo_dir: Path
) -> None:
    """The same encoder and limit with min_share 0.85: ranked by the error each group removes, the search would keep
    about a third of the model high (the test above); ranked again by the error each node adds alone, it keeps a
    few nodes and leaves at least 85% of the weights and MACs in int8, and the record says which ranking chose."""
    recipe = ENCODER_RECIPE.replace("min_share: 0.0", "min_share: 0.85")
    root = write_project(tmp_path / "p", {"e": recipe})
    shutil.copyfile(zoo_model("encoder", zoo_dir).path, root / "models" / "e.onnx")
    result = trtflow(root, "run")
    assert result.code == 0, result.err
    record = stage_record(root, "precision:e/int8")
    search = record["fallback"]
    assert search["passed"] and search["ranked_by"] == "error added alone", search
    assert min(search["after"]["weight_share"], search["after"]["mac_share"]) >= 0.85, search
    assert 0 < len(search["kept"]) <= 8 and record["accuracy"]["passed"], search


def test_the_search_ranks_by_the_agreements_the_first_try_misses() -> None:
    """Only the metrics whose limits are missed rank nodes (a top-1 already met only adds near-tie flips); all of
    them when another limit misses."""
    outputs = [{"cosine_similarity": 0.99, "top1_agreement": 0.95}, {"set_agreement": 0.5}]
    tolerance = {"min_cosine": 0.995, "min_top1": 0.9, "min_set_agreement": 0.4}
    assert accuracy.missed(outputs, tolerance) == ("cosine_similarity",)
    assert accuracy.missed(outputs, {**tolerance, "min_top1": 0.99}) == ("cosine_similarity", "top1_agreement")
    assert accuracy.missed(outputs, {"max_abs_error": 0.1}) == ("cosine_similarity", "top1_agreement", "set_agreement")
    assert accuracy.badness(outputs, ("cosine_similarity",)) == pytest.approx(0.01)
    assert accuracy.badness(outputs) == pytest.approx(0.5)


def test_blocks_are_joined_into_about_sqrt_candidates_groups_in_order() -> None:
    """36 blocks of 118 candidates (about BERT-base's shape) make 9 groups of 11 to 14 (each closed once it reaches
    ceil(118 / 11) = 11), every candidate once, in order."""
    split = [[(f"n{b}.{i}", "MatMul") for i in range(4 if b % 3 == 0 else 3)] for b in range(36)]
    split[-1] = split[-1][:1]
    groups = balanced(split)
    assert [c for group in groups for c in group] == [c for block in split for c in block]
    assert [len(group) for group in groups] == [14, 13, 13, 14, 13, 13, 14, 13, 11]


def test_every_trial_and_every_cut_ranking_trial_compute_what_a_rewired_copy_does_bit_for_bit(
    tmp_path: Path, zoo_dir: Path
) -> None:
    """An int8/fp8 search makes its trials from one switched model (fallback_switch), and runs its ranking's trials
    from where they differ from the baseline (fallback_cuts). For any nodes kept high, both compute exactly what a
    copy rewired to read off their Q/DQ the tensors ModelOpt's model keeping them reads so (_as_modelopt) computes:
    ModelOpt's Q/DQ encoder with its fp16 rest, as the check emulates it."""
    source = zoo_model("encoder", zoo_dir).path
    rng = np.random.default_rng(5)
    feeds = [{"embeddings": rng.standard_normal((4, 16, 64)).astype(np.float32)} for _ in range(3)]
    options = {"method": "entropy", "exclude_op_types": [], "exclude_nodes": [], "high_precision": "fp16"}
    quantized = convert.quantize(source, tmp_path / "q.onnx", "int8", feeds, {**options, "external_data": False})
    names = [name for name, _ in fallback.candidates(quantized)]
    model, inputs = fallback_switch.switched(quantized, names)
    board = ort_runnable(model)[0]
    assert len(inputs) == len(names) > 30 and fallback_switch.prunable(board)

    run = functools.partial(_run, feeds=feeds)

    plain = run(ort_runnable(quantized)[0])
    trial = fallback_trial.Trial(tmp_path / "q.onnx", feeds, plain, {}, {})
    groups = [names[:9], names[9:20], names[20:]]
    for baseline in ([], names):
        cuts = fallback_cuts.Cuts(board, inputs, trial, groups, baseline, len(feeds))
        units = [groups[1], names[3:4], names[25:27], names[-1:]]
        for unit, got in zip(units, cuts.run(units), strict=True):
            high = sorted(set(baseline) ^ set(unit))
            want = run(ort_runnable(_as_modelopt(quantized, high))[0])
            assert _same(got, want), unit
            assert _same(run(fallback_switch.resolved(board, fallback_switch.wiring(inputs, high))), want), high
    assert not _same(run(ort_runnable(_rewired(quantized, names))[0]), plain)  # keeping every node high changes it


def _rewired(graph: onnx.ModelProto, high: list[str]) -> onnx.ModelProto:
    """A copy whose `high` nodes read each input that comes through QuantizeLinear -> DequantizeLinear before it."""
    copy = onnx.ModelProto()
    copy.CopyFrom(graph)
    for node, index, before in _qdq_reads(copy):
        if node.name in high:
            node.input[index] = before
    return copy


def _qdq_reads(graph: onnx.ModelProto) -> list[tuple[onnx.NodeProto, int, str]]:
    """(node, input index, the tensor its QuantizeLinear reads) of each node input that comes through QuantizeLinear
    -> DequantizeLinear."""
    made_by = {o: n for n in graph.graph.node for o in n.output}
    reads = []
    for node in graph.graph.node:
        for index, name in enumerate(node.input):
            dequantize = made_by.get(name)
            if dequantize is not None and dequantize.op_type == "DequantizeLinear":
                quantize = made_by.get(dequantize.input[0])
                if quantize is not None and quantize.op_type == "QuantizeLinear":
                    reads.append((node, index, str(quantize.input[0])))
    return reads


def _quantized_reads(graph: onnx.ModelProto) -> dict[str, list[str]]:
    """{a tensor ModelOpt quantized (what its QuantizeLinear reads): the nodes reading its DequantizeLinear}."""
    reads: dict[str, list[str]] = {}
    for node, _, before in _qdq_reads(graph):
        reads.setdefault(before, []).append(node.name)
    return reads


def _as_modelopt(graph: onnx.ModelProto, kept: list[str]) -> onnx.ModelProto:
    """A copy read as ModelOpt's model keeping `kept` reads, by ONNX Runtime's quantizer's rule: a tensor keeps its
    Q/DQ while a reader of it that is not kept quantizes it for its own sake (a Conv, MatMul, Gemm, Mul, ...: any but
    an Add, Sum or ReduceMean, which do only where nothing else reads it), and a kept Conv, MatMul or Gemm reads its
    inputs before it whatever the others do."""
    ops = {n.name: n.op_type for n in graph.graph.node}
    beside = ("Add", "Sum", "ReduceMean")
    quantized = {
        t
        for t, readers in _quantized_reads(graph).items()
        if any(r not in kept for r in ([r for r in readers if ops[r] not in beside] or readers))
    }
    copy = onnx.ModelProto()
    copy.CopyFrom(graph)
    for node, index, before in _qdq_reads(copy):
        linear = node.op_type in ("Conv", "ConvTranspose", "MatMul", "Gemm") and node.name in kept
        if linear or before not in quantized:
            node.input[index] = before
    return copy


def _run(graph: onnx.ModelProto, feeds: list[dict]) -> list[dict]:
    """Each feed's outputs of `graph` on a session of its own."""
    return compare.run_all(compare.session(graph.SerializeToString()), feeds)


def _same(got: list[dict], want: list[dict]) -> bool:
    """Whether two runs' outputs are equal bit for bit."""
    return all(np.array_equal(g[k], w[k]) for g, w in zip(got, want, strict=True) for k in w)
