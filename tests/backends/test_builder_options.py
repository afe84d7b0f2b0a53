"""trtexec-level builder options: each a recipe `build:` field, applied to a real TensorRT-RTX builder config, in the
key only when set, recorded in the manifest; an option the installed backend has no API for is refused by name.
Networks are strongly typed; the network's layers are recorded per engine without a GPU."""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest
from conftest import TINY_RECIPE, trtflow

trt = pytest.importorskip("tensorrt_rtx")

from trtflow.backends.trt_common import BUILDER_OPTIONS, network_flags, unsupported_options  # noqa: E402

# option -> (value, how to read it back from the config)
READ_BACK = {
    "tiling_optimization_level": ("full", lambda c: c.tiling_optimization_level == trt.TilingOptimizationLevel.FULL),
    "l2_limit_for_tiling": (1 << 20, lambda c: c.l2_limit_for_tiling == 1 << 20),
    "max_aux_streams": (0, lambda c: c.max_aux_streams == 0),
    "max_num_tactics": (2, lambda c: c.max_num_tactics == 2),
    "sparse_weights": (True, lambda c: c.get_flag(trt.BuilderFlag.SPARSE_WEIGHTS)),
    "tf32": (False, lambda c: not c.get_flag(trt.BuilderFlag.TF32)),
    "direct_io": (True, lambda c: c.get_flag(trt.BuilderFlag.DIRECT_IO)),
    "strict_nans": (True, lambda c: c.get_flag(trt.BuilderFlag.STRICT_NANS)),
    "weight_streaming": (True, lambda c: c.get_flag(trt.BuilderFlag.WEIGHT_STREAMING)),
    "profiling_verbosity": ("detailed", lambda c: c.profiling_verbosity == trt.ProfilingVerbosity.DETAILED),
    "optimization_level": (5, lambda c: c.builder_optimization_level == 5),
    "workspace_mib": (64, lambda c: c.get_memory_pool_limit(trt.MemoryPoolType.WORKSPACE) == 64 << 20),
}
# Measured with TensorRT-RTX 1.7.1 on the example's CNN for sm_89: these change the engine's bytes; the others are
# accepted and leave this small network's engine as it was.
CHANGES_BYTES = {"tf32", "weight_streaming", "profiling_verbosity"}


def test_every_option_has_a_read_back_check() -> None:
    assert set(READ_BACK) == set(BUILDER_OPTIONS)


@pytest.mark.parametrize("name", sorted(READ_BACK))
def test_each_option_is_applied_to_a_real_tensorrt_rtx_config(name: str) -> None:
    value, applied = READ_BACK[name]
    config = trt.Builder(trt.Logger()).create_builder_config()
    assert not applied(config), f"{name}: the backend's default already equals the test value"
    BUILDER_OPTIONS[name].apply(trt, config, value)
    assert applied(config)


@pytest.mark.parametrize("name", sorted(CHANGES_BYTES - {"profiling_verbosity"}))
def test_options_that_change_the_engine_rebuild_it_and_are_recorded(name: str, built_project: Path) -> None:
    value = READ_BACK[name][0]
    before = {e["target"]: e["sha256"] for e in _manifest(built_project)["engines"]}
    recipe = built_project / "recipes" / "tiny.yaml"
    recipe.write_text(recipe.read_text() + f"build: {{{name}: {json.dumps(value)}}}\n")
    explained = trtflow(built_project, "plan", "--explain").out
    assert f"{name}: default -> {str(value).replace(' ', '')}" in explained
    result = trtflow(built_project, "run")
    assert result.code == 0, result.err
    engines = _manifest(built_project)["engines"]
    assert all(e["builder"][name] == value for e in engines)
    assert all(e["sha256"] != before[e["target"]] for e in engines)


def test_an_option_the_backend_lacks_is_refused_by_name(project: Path) -> None:
    """The installed TensorRT-RTX minus one BuilderFlag stands for a release without it."""
    without = types.SimpleNamespace(
        **{n: getattr(trt, n) for n in ("IBuilderConfig", "TilingOptimizationLevel")},
        BuilderFlag=types.SimpleNamespace(
            **{m: getattr(trt.BuilderFlag, m) for m in dir(trt.BuilderFlag) if m.isupper() and m != "DIRECT_IO"}
        ),
    )
    assert unsupported_options(without, {"direct_io", "tf32", "max_aux_streams"}) == ["direct_io"]
    assert unsupported_options(trt, set(BUILDER_OPTIONS)) == []


def test_an_unknown_option_is_a_recipe_error_with_its_line(project: Path) -> None:
    recipe = project / "recipes" / "tiny.yaml"
    recipe.write_text(TINY_RECIPE + "build: {tiling_optimization_level: extreme}\n")
    result = trtflow(project, "validate")
    assert (
        result.code == 3
        and "recipes/tiny.yaml:8: build.tiling_optimization_level: 'extreme' is not one of" in result.err
    )


def test_networks_are_strongly_typed_and_their_layers_are_recorded(built_project: Path) -> None:
    assert network_flags(trt) == 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    [engine, *_] = _manifest(built_project)["engines"]
    network = engine["network"]
    assert network["by_type"]["convolution"] == 2 and sum(network["by_type"].values()) == len(network["layers"])
    assert {"name", "type", "dtype"} == set(network["layers"][0]) and "needs a GPU" in network["device_memory"]
    shown = trtflow(built_project, "inspect", str(built_project / "artifacts" / "packages" / "tiny"), "--layers")
    assert shown.code == 0 and "network: " in shown.out and "convolution      float32" in shown.out


def test_full_tensorrt_networks_are_strongly_typed_where_it_imports() -> None:
    full = pytest.importorskip(
        "tensorrt", reason="full TensorRT is not installed (NVIDIA's package index, a GPU to build)"
    )
    builder = full.Builder(full.Logger())
    network = builder.create_network(network_flags(full))
    flag = getattr(full.NetworkDefinitionCreationFlag, "STRONGLY_TYPED", None)
    assert flag is None or network.get_flag(flag)


def _manifest(root: Path) -> dict:
    return json.loads((root / "artifacts" / "packages" / "tiny" / "manifest.json").read_text())
