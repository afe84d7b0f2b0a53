"""Real architectures from the zoo (tests/zoo.py) through the whole pipeline: legacy IR 3 files, weights computed
by ops, and a dynamo export of ResNet-18 left unoptimized by the exporter."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import onnx
import pytest
import yaml
from conftest import stage_record, trtflow, write_project

from trtflow.util.onnxio import model_io_of_file

torch = pytest.importorskip("torch")

from zoo import ZooModel, zoo_model  # noqa: E402  (imports torch)

FOLD_LIMIT = 16 << 20  # cleanup's default fold_size_limit_mib, in bytes


def onnx_recipe(model: ZooModel, extra: str = "") -> str:
    """A recipe building the zoo model (copied to models/<name>.onnx) with its suggested profile."""
    return (
        yaml.safe_dump({"source": {"onnx": f"models/{model.name}.onnx"}, "profiles": [model.recipe_profile()]}) + extra
    )


def zoo_project(root: Path, zoo_dir: Path, recipes: dict[str, tuple[str, str]]) -> Path:
    """A project whose recipes (name -> (zoo model, extra recipe text)) build zoo models from ONNX files."""
    models = {name: zoo_model(name, zoo_dir) for name in {model for model, _ in recipes.values()}}
    write_project(root, {recipe: onnx_recipe(models[name], extra) for recipe, (name, extra) in recipes.items()})
    for model in models.values():
        shutil.copyfile(model.path, root / "models" / f"{model.name}.onnx")
    return root


def engine_sizes(root: Path, recipe: str) -> list[int]:
    """Bytes of each engine file the recipe's package ships."""
    folder = root / "artifacts" / "packages" / recipe
    return [
        (folder / engine["file"]).stat().st_size
        for engine in json.loads((folder / "manifest.json").read_text())["engines"]
    ]


def test_ir3_models_with_initializers_as_inputs_clean_build_and_package(tmp_path: Path, zoo_dir: Path) -> None:
    root = zoo_project(tmp_path / "p", zoo_dir, {"ir3": ("legacy_ir3", ""), "ir3_dynamic": ("legacy_ir3_dynamic", "")})
    result = trtflow(root, "run")
    assert result.code == 0, result.err + result.out
    for recipe in ("ir3", "ir3_dynamic"):
        cleaned = stage_record(root, f"cleanup:{recipe}")
        assert (
            cleaned["before"]["ir_version"] == 3
            and cleaned["after"]["ir_version"] >= 4
            and cleaned["equality"]["passed"]
        )
        assert (
            "initializer_inputs_removed 10" in cleaned["passes"] and "BatchNormalization" not in cleaned["after"]["ops"]
        )
        assert [i["name"] for i in cleaned["after"]["inputs"]] == ["data_0"]
        assert (
            len(engine_sizes(root, recipe)) == 2 and (root / "artifacts" / "packages" / recipe / "SHA256SUMS").is_file()
        )


def test_folding_stops_at_the_size_limit_and_the_engine_stays_near_a_direct_build(
    tmp_path: Path, zoo_dir: Path
) -> None:
    """opweights computes a 32 MiB weight from a 8 kB seed: folded, its engine was 55x a direct build's."""
    from trtflow.backends.base import BuildRequest, get_backend

    one_target = "targets: [rtx-ada]\n"
    root = zoo_project(
        tmp_path / "p",
        zoo_dir,
        {
            "bounded": ("opweights", one_target),
            "unbounded": ("opweights", one_target + "cleanup: {fold_size_limit_mib: null}\n"),
        },
    )
    result = trtflow(root, "run")
    assert result.code == 0, result.err + result.out
    model = zoo_model("opweights", zoo_dir)
    direct = tmp_path / "direct.engine"
    profile = {name: (shapes.min, shapes.opt, shapes.max) for name, shapes in model.profile.items()}
    get_backend("tensorrt-rtx").engine_from_onnx(
        BuildRequest(onnx_path=model.path, engine_path=direct, compute_capabilities=["sm_89"], profiles=[profile])
    )
    [bounded], [unbounded] = engine_sizes(root, "bounded"), engine_sizes(root, "unbounded")
    assert bounded < 2 * direct.stat().st_size < unbounded / 10
    cleaned = stage_record(root, "cleanup:bounded")
    assert cleaned["before"]["initializer_bytes"] == 54448 and cleaned["after"]["initializer_bytes"] < FOLD_LIMIT
    assert stage_record(root, "cleanup:unbounded")["after"]["initializer_bytes"] > 32 << 20
    # the big weight stays computed
    assert cleaned["equality"]["passed"] and {"Tile", "Mul"} <= set(cleaned["after"]["ops"])


LIGHT_ZOO = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
OPWEIGHTS_ZOO = ("light_bvlc_alexnet", "light_vgg19", "light_zfnet512")  # weights made by ConstantOfShape from shapes


def _static_input(path: Path) -> tuple[str, list[int]]:
    """The name and shape of a legacy model's one real input (IR 3 lists its initializers as inputs too)."""
    [value] = model_io_of_file(path).inputs
    return value.name, [int(d) for d in value.dims]


def _direct_engine(path: Path, engine: Path) -> int:
    """Bytes of the engine TensorRT-RTX builds straight from the ONNX file (its one static input's shape)."""
    from trtflow.backends.base import BuildRequest, get_backend

    name, shape = _static_input(path)
    get_backend("tensorrt-rtx").engine_from_onnx(
        BuildRequest(
            onnx_path=path, engine_path=engine, compute_capabilities=["sm_89"], profiles=[{name: (tuple(shape),) * 3}]
        )
    )
    return engine.stat().st_size


def test_folding_never_inflates_the_legacy_zoo_whose_weights_are_computed(tmp_path: Path) -> None:
    """Under a 16 MiB limit alone, every weight but the largest was folded: 27.0 / 35.9 / 38.7 MB engines vs 2.08 /
    1.96 /
    1.87 MB built directly. A fold larger than its seeds is not made now (fp32 only: AutoCast of VGG-19 took 17.7
    GB)."""
    recipes = {}
    for name in OPWEIGHTS_ZOO:
        input_name, shape = _static_input(LIGHT_ZOO / f"{name}.onnx")
        recipes[name] = yaml.safe_dump(
            {
                "source": {"onnx": f"models/{name}.onnx"},
                "targets": ["rtx-ada"],
                "profiles": [{"inputs": {input_name: {"min": shape, "opt": shape, "max": shape}}}],
            }
        )
    root = write_project(tmp_path / "p", recipes)
    for name in OPWEIGHTS_ZOO:
        shutil.copyfile(LIGHT_ZOO / f"{name}.onnx", root / "models" / f"{name}.onnx")
    result = trtflow(root, "run")
    assert result.code == 0, result.err + result.out
    for name in OPWEIGHTS_ZOO:
        [size] = engine_sizes(root, name)
        assert size <= 1.25 * _direct_engine(LIGHT_ZOO / f"{name}.onnx", tmp_path / f"{name}.engine"), name
        cleaned = stage_record(root, f"cleanup:{name}")
        assert cleaned["after"]["initializer_bytes"] < 100_000 and cleaned["equality"]["passed"]
        assert any(p.startswith("fold_kept_computed ") for p in cleaned["passes"])


@pytest.mark.slow  # about 11 s: exports ResNet-18 twice (the stage without the optimizer, the zoo with it)
def test_a_dynamo_resnet_exported_without_the_optimizer_comes_out_of_cleanup_fused(
    tmp_path: Path, zoo_dir: Path
) -> None:
    recipe = {
        "source": {"torch": {"factory": "models.zoo:resnet", "inputs": [{"name": "input"}]}},
        "profiles": [zoo_model("resnet", zoo_dir).recipe_profile()],
        "targets": ["rtx-ada"],
    }
    root = write_project(tmp_path / "p", {"resnet": yaml.safe_dump(recipe)})
    shutil.copyfile(Path(__file__).parents[1] / "zoo.py", root / "models" / "zoo.py")
    result = trtflow(root, "run")
    assert result.code == 0, result.err + result.out
    # the exporter's optimizer
    optimized = len(onnx.load(zoo_model("resnet", zoo_dir).path, load_external_data=False).graph.node)
    exported, cleaned = stage_record(root, "export:resnet"), stage_record(root, "cleanup:resnet")
    assert exported["nodes"] == cleaned["before"]["nodes"] > 3 * optimized  # optimize: false is the default
    assert cleaned["before"]["ops"]["BatchNormalization"] == 20 and "BatchNormalization" not in cleaned["after"]["ops"]
    assert (
        cleaned["after"]["nodes"] <= optimized + 2
        and "castlike_to_cast 20" in cleaned["passes"]
        and cleaned["equality"]["passed"]
    )
    assert len(engine_sizes(root, "resnet")) == 1
