"""Explaining staleness names each changed component."""

from __future__ import annotations

from trtflow.run.plan import diff_components


def test_diff_names_changed_parameters_fingerprints_and_inputs() -> None:
    old = {
        "kind": "build",
        "version": 1,
        "params": {"profiles": [{"x": {"max": [8, 3]}}]},
        "fingerprint": {"backend_version": "1.7.1"},
        "inputs": {"model": "a" * 64},
    }
    new = {
        "kind": "build",
        "version": 2,
        "params": {"profiles": [{"x": {"max": [16, 3]}}]},
        "fingerprint": {"backend_version": "1.8.0"},
        "inputs": {"model": "b" * 64},
    }
    assert diff_components(old, new) == [
        "stage code version 1 -> 2",
        "backend_version: 1.7.1 -> 1.8.0",
        "profiles[0].x.max: [8,3] -> [16,3]",
        f"input model changed ({'a' * 12} -> {'b' * 12})",
    ]


def test_diff_of_equal_components_is_empty() -> None:
    same = {"kind": "cleanup", "version": 1, "params": {}, "fingerprint": {"onnx": "1.23"}, "inputs": {"model": "c"}}
    assert diff_components(same, dict(same)) == []


def test_unresolved_inputs_are_not_reported_as_removed() -> None:
    old = {"version": 1, "params": {}, "inputs": {"model": "a"}}
    assert diff_components(old, {"version": 1, "params": {}}, frozenset({"model"})) == []


def test_calibration_files_left_out_of_the_selection_are_named(tmp_path) -> None:
    """calibration.samples reaches the key as fewer files: `plan --explain` said `output missing from the store`."""
    import numpy as np
    from conftest import TINY_RECIPE, trtflow, write_project

    recipe = TINY_RECIPE.replace("[fp32]", "[int8]").replace("[rtx-ampere, rtx-ada]", "[rtx-ada]")
    root = write_project(tmp_path / "p", {"tiny": recipe + "calibration: {data: calib/*.npy}\n"})
    (root / "calib").mkdir()
    for index in range(6):
        batch = np.random.default_rng(index).standard_normal((4, 3, 32, 32)).astype(np.float32)
        np.save(root / "calib" / f"b{index}.npy", batch)
    assert trtflow(root, "run").code == 0
    (root / "recipes" / "tiny.yaml").write_text(recipe + "calibration: {data: calib/*.npy, samples: 1}\n")
    explained = trtflow(root, "plan", "--explain").out
    assert "output missing from the store" not in explained, explained
    assert "input calib:calib/" in explained and " removed" in explained, explained


def test_a_node_waiting_on_one_upstream_through_two_roles_names_it_once(tmp_path) -> None:
    """verify reads the precision node's model and its report: the plan says `upstream X will run first` once."""
    from trtflow.hashing import FileDigests
    from trtflow.run.plan import STALE, Resolver
    from trtflow.stages.base import Dep, Node, NodeId, StageParams
    from trtflow.store.store import Store

    store = Store.create(tmp_path / "store")
    upstream = NodeId.of("precision", "m", "int8")
    node = Node(
        NodeId.of("verify", "m", "int8", "t"),
        1,
        StageParams(),
        deps=(Dep("model", upstream, "model"), Dep("precision_report", upstream, "report")),
    )
    store.memos.set_last_run(node.id, {"key": "k", "components": dict(node.known_parts)})
    state = Resolver(store, FileDigests()).resolve(node, finished={}).state
    assert (state.status, state.reason) == (STALE, "upstream precision:m/int8 will run first")
    store.close()


def test_each_node_knows_the_longest_chain_waiting_on_it(project) -> None:
    """The runner starts the ready node with the longest chain first (with -j 2, a second model's cleanup before the
    first model's builds): cleanup 5, precision 4, build 3, verify 2, package 1."""
    from trtflow.recipe import load_project
    from trtflow.run.dag import dag_from_project

    heights = dag_from_project(load_project(project)).heights()
    by_kind = {node_id.split(":")[0]: set() for node_id in heights}
    for node_id, height in heights.items():
        by_kind[node_id.split(":")[0]].add(height)
    assert by_kind == {"cleanup": {5}, "precision": {4}, "build": {3}, "verify": {2}, "package": {1}}
