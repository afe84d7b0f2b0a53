"""Task accuracy on labelled data (issue 25 item 5) and calibration methods on real data (item 6).

The model is a tiny CNN trained at test time on a separable synthetic task (tests/labelled.py), so top-1 means
something: fp32 reaches ~0.92 on 256 fresh rows, and every precision is scored on the same rows.
"""

from __future__ import annotations

import json
from pathlib import Path

import labelled
import numpy as np
import pytest
from conftest import trtflow, write_project

from trtflow.errors import StageError
from trtflow.recipe.load import load_project
from trtflow.run.dag import dag_from_project
from trtflow.stages import compare, task
from trtflow.stages import precision as precision_stage
from trtflow.stages.base import Upstream

RECIPE = """\
source: {onnx: models/labelled_cnn.onnx}
precisions: [fp32, fp16, int8]
targets: [rtx-ada]
profiles:
  - inputs:
      input: {min: [1, 1, 16, 16], opt: [16, 1, 16, 16], max: [256, 1, 16, 16]}
calibration: {data: calib/*.npz}
accuracy:
  data: val/*.npz
  labels: val/labels.npy
  metric: top1
  int8: {max_drop: {top1: 0.05}}
"""


@pytest.fixture(scope="session")
def labelled_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The trained CNN, its labelled validation rows and structured calibration batches, made once per session."""
    folder = tmp_path_factory.mktemp("labelled")
    labelled.make(folder)
    return folder


def _project(tmp_path: Path, labelled_dir: Path, text: str = RECIPE) -> Path:
    root = write_project(tmp_path / "proj", {"cnn": text})
    for part in (
        "models/labelled_cnn.onnx",
        "val/rows.npz",
        "val/labels.npy",
        *(f"calib/{i:02d}.npz" for i in range(16)),
    ):
        (root / part).parent.mkdir(parents=True, exist_ok=True)
        (root / part).write_bytes((labelled_dir / part).read_bytes())
    return root


def _run_node(root: Path, precision: str, workdir: Path) -> dict:
    """One precision node run in this process exactly as the DAG defines it; its record."""
    node = dag_from_project(load_project(root)).nodes[f"precision:cnn/{precision}"]
    inputs = {"model": Upstream(files={"model": root / "models" / "labelled_cnn.onnx"})}
    inputs.update({role: Upstream(files={role: path}) for role, path in node.sources})
    workdir.mkdir(parents=True)
    return precision_stage.run(node.params, inputs, workdir).record


def test_scores_follow_their_definitions() -> None:
    logits = np.array([[0.1, 0.9, 0.0, 0.0, 0.0, 0.0], [0.8, 0.1, 0.0, 0.0, 0.0, 0.05]])
    assert task.score(logits, np.array([1, 1]), "top1") == 0.5
    assert task.score(logits, np.array([1, 5]), "top5") == 1.0
    assert task.score(np.array([[1.0], [3.0]]), np.array([1.0, 1.0]), "mse") == 2.0


def test_fp32_fp16_int8_top1_in_the_manifest_inspect_and_provision(tmp_path: Path, labelled_dir: Path) -> None:
    root = _project(tmp_path, labelled_dir)
    run = trtflow(root, "run")
    assert run.code == 0, run.out + run.err
    manifest = json.loads((root / "artifacts" / "packages" / "cnn" / "manifest.json").read_text())
    tasks = {e["precision"]: (e["verification"]["precision_accuracy"] or {}).get("task") for e in manifest["engines"]}
    assert tasks["fp32"] is None  # fp32 is the baseline: each reduced precision records its score as `fp32`
    fp32 = tasks["int8"]["fp32"]
    assert tasks["fp16"]["fp32"] == fp32 and 0.85 < fp32 < 0.99 and tasks["int8"]["rows"] == 256
    assert abs(tasks["fp16"]["drop"]) <= 0.01 and tasks["int8"]["drop"] <= 0.05 and tasks["int8"]["max_drop"] == 0.05
    shown = trtflow(root, "inspect", str(root / "artifacts" / "packages" / "cnn"))
    int8 = tasks["int8"]
    assert (
        f"int8 top1 {int8['value']:.3f} (fp32 {fp32:.3f}, drop {int8['drop']:.3f} <= 0.05) on 256 labelled rows"
        in shown.out
    )
    chosen = trtflow(
        root,
        "provision",
        str(root / "artifacts" / "packages" / "cnn"),
        "--gpu",
        "sm_89",
        "--prefer",
        "drop",
        "--dest",
        str(tmp_path / "dest"),
        "--json",
    )
    assert chosen.code == 0, chosen.out + chosen.err
    lowest = min(
        ("fp32", 0.0),
        ("fp16", tasks["fp16"]["drop"]),
        ("int8", int8["drop"]),
        key=lambda p: (p[1], ["int8", "fp16", "fp32"].index(p[0])),
    )
    record = json.loads(chosen.out)
    assert record["chosen"]["manifest_entry"]["precision"] == lowest[0], chosen.out
    assert all(
        "task accuracy" in other["reason"] for other in record["not_chosen"] if other["precision"] != lowest[0]
    ), chosen.out


def test_a_drop_past_max_drop_fails_the_stage_unless_warn(tmp_path: Path, labelled_dir: Path) -> None:
    """mse against the fp32 model's own logits: fp32 scores exactly 0, so any int8 rounding is a positive drop."""
    strict = RECIPE.replace("metric: top1", "metric: mse").replace("max_drop: {top1: 0.05}", "max_drop: {mse: 0.0}")
    root = _project(tmp_path, labelled_dir, strict)
    rows = np.load(root / "val" / "rows.npz")["input"]
    np.save(
        root / "val" / "labels.npy",
        task.first_output(compare.session(root / "models" / "labelled_cnn.onnx"), [{"input": rows}]),
    )
    with pytest.raises(
        StageError,
        match=r"int8 task accuracy out of limits: int8 mse \S+ \(fp32 0, drop \S+ > 0\) on 256 labelled rows; "
        r"loosen accuracy\.int8\.max_drop",
    ):
        _run_node(root, "int8", tmp_path / "strict")
    (root / "recipes" / "cnn.yaml").write_text(strict + "verify: {on_fail: warn}\n")
    accuracy = _run_node(root, "int8", tmp_path / "warn")["accuracy"]
    assert not accuracy["passed"] and not accuracy["task"]["passed"] and accuracy["task"]["drop"] > 0
    assert accuracy["problems"][-1].startswith("task accuracy: int8 mse")


@pytest.mark.parametrize(
    ("edit", "where", "message"),
    [
        (
            lambda root: np.save(root / "val" / "labels.npy", np.zeros(255, np.int64)),
            "recipes/cnn.yaml:10: accuracy.labels",
            "holds 255 label(s) but the data holds 256 row(s); give one label per row, in sorted file order",
        ),
        (
            lambda root: np.save(root / "val" / "labels.npy", np.zeros(256, np.float32)),
            "recipes/cnn.yaml:11: accuracy.metric",
            "top1 needs integer class ids of shape [rows], the labels are float32 [256] (use metric: mse for float "
            "targets)",
        ),
        (
            lambda root: (root / "val" / "labels.npy").unlink(),
            "recipes/cnn.yaml:10: accuracy.labels",
            "val/labels.npy not found",
        ),
        (
            lambda root: (root / "val" / "rows.npz").unlink(),
            "recipes/cnn.yaml:9: accuracy.data",
            "no .npy/.npz file matches 'val/*.npz'",
        ),
    ],
    ids=["count", "dtype", "no-labels", "no-data"],
)
def test_labelled_data_that_does_not_fit_is_refused_before_any_work(
    tmp_path: Path, labelled_dir: Path, edit, where: str, message: str
) -> None:
    root = _project(tmp_path, labelled_dir)
    edit(root)
    result = trtflow(root, "validate")
    assert result.code == 3 and f"{where}: {message}" in result.err, result.err


def test_recipes_without_labels_keep_their_keys(tmp_path: Path, labelled_dir: Path) -> None:
    """The option at its default is absent from the key and adds no source: no precision VERSION bump was needed."""
    plain = "\n".join(
        line
        for line in RECIPE.splitlines()
        if not line.startswith(("  data:", "  labels:", "  metric:", "  int8:", "accuracy:"))
    )
    root = _project(tmp_path, labelled_dir, plain + "\n")
    node = dag_from_project(load_project(root)).nodes["precision:cnn/int8"]
    assert "task" not in node.params.key_parts()[0] and not any(role.startswith("task:") for role, _ in node.sources)
    labelled_node = dag_from_project(load_project(_project(tmp_path / "b", labelled_dir))).nodes["precision:cnn/int8"]
    assert [role for role, _ in labelled_node.sources if role.startswith("task:")] == [
        "task:data/val/rows.npz",
        "task:labels",
    ]


def test_calibration_methods_on_structured_data_keep_top1(tmp_path: Path, labelled_dir: Path) -> None:
    """int8 calibrated by entropy, max and percentile on rows of the same task (not noise): each records its method and
    top-1, within 3 points of fp32 and far above chance (0.25); entropy clips ranges max keeps (the methods really
    differ)."""
    found, scales = {}, {}
    for method in ("entropy", "max", "percentile"):
        root = _project(
            tmp_path / method,
            labelled_dir,
            RECIPE.replace("calibration: {data: calib/*.npz}", f"calibration: {{data: calib/*.npz, method: {method}}}"),
        )
        record = _run_node(root, "int8", tmp_path / method / "work")
        assert record["calibration"]["method"] == method and record["calibration"]["rows"] == 8 * 16
        found[method] = record["accuracy"]["task"]
        scales[method] = _activation_scales(next((tmp_path / method / "work").glob("model.onnx")))
    for method, result in found.items():
        assert result["fp32"] > 0.85 and result["value"] > 0.8 and abs(result["drop"]) <= 0.03 and result["passed"], (
            method,
            result,
        )
    assert scales["entropy"] != scales["max"] and max(scales["entropy"]) <= max(scales["max"])
    print(
        "; ".join(
            f"{m}: int8 top1 {r['value']:.4f} (fp32 {r['fp32']:.4f}, drop {r['drop']:+.4f})" for m, r in found.items()
        )
    )


def _activation_scales(path: Path) -> list[float]:
    """The scalar scales of the model's QuantizeLinear nodes (activations; weights are per channel)."""
    import onnx
    from onnx import numpy_helper

    graph = onnx.load(path).graph
    values = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    return [
        float(values[n.input[1]])
        for n in graph.node
        if n.op_type == "QuantizeLinear" and values.get(n.input[1], np.zeros(2)).size == 1
    ]


def test_prefer_drop_needs_task_metrics_in_the_manifest(built: Path, tmp_path: Path) -> None:
    result = trtflow(
        built,
        "provision",
        str(built / "artifacts" / "packages" / "tiny"),
        "--gpu",
        "sm_89",
        "--prefer",
        "drop",
        "--dest",
        str(tmp_path),
    )
    assert result.code == 2 and "--prefer drop: package tiny records no task accuracy drop" in result.err, result.err
