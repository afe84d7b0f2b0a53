"""Explaining staleness names each changed component."""

from __future__ import annotations

from trtflow.plan import diff_components


def test_diff_names_changed_parameters_fingerprints_and_inputs() -> None:
    old = {"kind": "build", "version": 1, "params": {"profiles": [{"x": {"max": [8, 3]}}]},
           "fingerprint": {"backend_version": "1.7.1"}, "inputs": {"model": "a" * 64}}
    new = {"kind": "build", "version": 2, "params": {"profiles": [{"x": {"max": [16, 3]}}]},
           "fingerprint": {"backend_version": "1.8.0"}, "inputs": {"model": "b" * 64}}
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
    assert diff_components(old, {"version": 1, "params": {}}) == []
