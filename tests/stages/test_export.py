"""PyTorch sources end to end: real torch.nn models exported by the export stage, cleaned, built by TensorRT-RTX.

The models live in the test project as ordinary Python modules (models/convnet.py, models/seq.py), the way
a user's do, so editing one of them is a real edit of the factory's source file.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import stage_entry, stage_record, trtflow
from torchsources import CONVNET, ONE_TARGET, torch_recipe, write_torch_project

torch = pytest.importorskip("torch")


SEQ = '''\
"""Sequence models: a 2-layer LSTM (50 steps, 128 features in, 256 out) and a small TransformerEncoder."""
from torch import nn


class Lstm(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(128, 256, num_layers=2, batch_first=True)

    def forward(self, x):
        return self.lstm(x)[0]


def encoder(layers=2):
    layer = nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64, dropout=0.1, batch_first=True)
    return nn.TransformerEncoder(layer, num_layers=layers, enable_nested_tensor=False)
'''

CONV_RECIPE = (
    """\
source:
  torch:
    factory: models.convnet:make
    kwargs: {classes: 10}
    weights: models/convnet.pt
    inputs: [{name: image}]
    outputs: [logits]
profiles:
  - inputs:
      image: {min: [1, 3, 32, 32], opt: [4, 3, 32, 32], max: [8, 3, 32, 32]}
"""
    + ONE_TARGET
)
LSTM_RECIPE = (
    """\
source:
  torch: {factory: "models.seq:Lstm", inputs: [{name: sequence}], outputs: [features]}
profiles:
  - inputs:
      sequence: {shape: [1, 50, 128]}  # static: torch.export takes 2-3 s longer per dynamic model
"""
    + ONE_TARGET
)
ENCODER_RECIPE = (
    """\
source:
  torch: {factory: "models.seq:encoder", kwargs: {layers: 2}, inputs: [{name: tokens, shape: [2, 16, 32]}]}
profiles:
  - inputs:
      tokens: {min: [1, 16, 32], opt: [2, 16, 32], max: [8, 16, 32]}
"""
    + ONE_TARGET
)


def save_weights(root: Path, seed: int) -> None:
    """A state_dict for the conv net with seeded values (BatchNorm statistics included)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("convnet_for_weights", root / "models" / "convnet.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    generator = torch.Generator().manual_seed(seed)
    state = {
        k: (torch.rand(v.shape, generator=generator) + 0.5 if v.is_floating_point() else v)
        for k, v in module.make().state_dict().items()
    }
    torch.save(state, root / "models" / "convnet.pt")


def run_json(root: Path, *args: str) -> dict:
    result = trtflow(root, "run", "--json", *args)
    assert result.code == 0, result.err + result.out
    return json.loads(result.out)


def built(summary: dict) -> set[str]:
    return {node["id"] for node in summary["nodes"] if node["status"] == "built"}


def plan_reasons(root: Path) -> dict[str, str]:
    """Each node's status, or its reason when it is stale."""
    result = trtflow(root, "plan", "--json")
    assert result.code == 0, result.err
    return {node["id"]: node["reason"] or node["status"] for node in json.loads(result.out)["nodes"]}


def engine_digests(root: Path, recipe: str) -> list[str]:
    manifest = json.loads((root / "artifacts" / "packages" / recipe / "manifest.json").read_text())
    return [engine["sha256"] for engine in manifest["engines"]]


@pytest.fixture(scope="module")
def torch_project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The three test models, exported, cleaned and built once for the tests of this module."""
    root = write_torch_project(
        tmp_path_factory.mktemp("torch") / "proj",
        {"conv": CONV_RECIPE, "lstm": LSTM_RECIPE, "encoder": ENCODER_RECIPE},
        {"convnet.py": CONVNET, "seq.py": SEQ, "unrelated.py": "VALUE = 1\n"},
    )
    save_weights(root, seed=1)
    summary = run_json(root)  # one worker: torch's import and the exporter's warm-up are paid once
    assert summary["failed"] == 0 and summary["built"] == len(summary["nodes"]) == 3 * 6
    return root


def test_torch_sources_export_clean_and_build(torch_project: Path) -> None:
    for recipe in ("conv", "lstm", "encoder"):
        export = stage_record(torch_project, f"export:{recipe}")
        assert export["exporter"] == "torch.onnx.export(dynamo=True)" and export["torch_equality"]["passed"]
        assert len(engine_digests(torch_project, recipe)) == 1
    conv = stage_record(torch_project, "cleanup:conv")
    assert conv["before"]["nodes"] > conv["after"]["nodes"] and conv["equality"]["passed"]
    assert conv["before"]["ops"]["BatchNormalization"] == 2 and not {"BatchNormalization", "Identity", "Dropout"} & set(
        conv["after"]["ops"]
    )
    assert stage_record(torch_project, "export:conv")["dynamic"] == {"image": {"0": [1, 8]}}
    manifest = json.loads((torch_project / "artifacts/packages/lstm/manifest.json").read_text())
    assert [(t["name"], t["shape"]) for t in manifest["engines"][0]["tensors"]] == [
        ("sequence", [1, 50, 128]),
        ("features", [1, 50, 256]),
    ]


def test_every_module_the_export_server_loads_exists_in_the_installed_torch() -> None:
    """The server loads the exporter's internals ahead of each child (torch.export, dynamo, onnxscript's torch ops);
    it skips a module it cannot import, so one that a torch or onnxscript release moved would cost every export its
    import again, silently. The names are held to the installed tools here instead."""
    import importlib.util

    from trtflow.stages.export.torch_module import EXPORTER_MODULES

    assert [name for name in EXPORTER_MODULES if importlib.util.find_spec(name) is None] == []


@pytest.mark.slow  # two exports in fresh processes: 25-30 s
def test_an_export_forked_by_the_user_code_server_is_what_a_fresh_process_exports(
    torch_project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Exports run in children of a server that imported torch and its exporter once (a fork instead of 5.4 s of
    imports); where processes cannot fork, and on Ray, each runs in a fresh process. Both write the same models, byte
    for byte, in another folder; the second model is exported by a child of a server that has already served one."""
    import shutil

    from trtflow.executors import local

    copy = tmp_path / "proj"
    shutil.copytree(torch_project, copy, ignore=shutil.ignore_patterns("artifacts", "trtflow.lock", "lstm.yaml"))
    monkeypatch.setattr(local, "SERVED", {kind: group for kind, group in local.SERVED.items() if kind != "export"})
    assert trtflow(copy, "validate", "--export").code == 0  # the exports alone, cached as a run caches them
    for recipe in ("conv", "encoder"):
        forked, fresh = (stage_entry(root, f"export:{recipe}")["outputs"] for root in (torch_project, copy))
        assert fresh == forked, recipe


def test_rerun_is_a_no_op_and_an_unrelated_edit_exports_nothing(torch_project: Path) -> None:
    (torch_project / "models" / "unrelated.py").write_text("VALUE = 2\n")
    (torch_project / "README.md").write_text("notes\n")
    assert built(run_json(torch_project)) == set()


def test_changing_verify_on_fail_reexports_and_recleans_nothing(torch_project: Path) -> None:
    """on_fail decides whether a failed check fails the stage; it is not in the export's or cleanup's key."""
    recipe = torch_project / "recipes" / "conv.yaml"
    original = recipe.read_text()
    recipe.write_text(original + "verify: {on_fail: warn}\n")
    try:
        reasons = plan_reasons(torch_project)
    finally:
        recipe.write_text(original)
    assert reasons["export:conv"] == reasons["cleanup:conv"] == "cached"


def test_editing_the_factory_source_or_the_weights_reexports_and_rebuilds_that_model(torch_project: Path) -> None:
    before = engine_digests(torch_project, "conv")
    save_weights(torch_project, seed=2)
    module = torch_project / "models" / "convnet.py"
    module.write_text(
        module.read_text().replace("return self.head(self.features(x))", "return self.head(self.features(x)) * 2")
    )
    explained = trtflow(torch_project, "plan", "--explain").out
    assert "export:conv" in explained and "input factory changed" in explained and "input weights changed" in explained
    assert built(run_json(torch_project)) == {
        "export:conv",
        "cleanup:conv",
        "precision:conv/fp32",
        "build:conv/fp32/rtx-ada",
        "verify:conv/fp32/rtx-ada",
        "package:conv",
    }
    assert engine_digests(torch_project, "conv") != before


# ---------------------------------------------------------------------------------------------
# bad input: what can be checked without running the user's code is refused by `validate` with file:line


TORCH_RECIPE_CASES = [
    pytest.param(
        torch_recipe(factory="models.nothere:make"),
        "recipes/bad.yaml:3: source.torch.factory",
        "cannot find module 'models.nothere'",
        id="no-module",
    ),
    pytest.param(
        torch_recipe(factory="models.convnet:mkae"),
        "recipes/bad.yaml:3: source.torch.factory",
        "module 'models.convnet' (models/convnet.py) defines no 'mkae'",
        id="no-callable",
    ),
    pytest.param(
        torch_recipe(factory="models.syntax:make"),
        "recipes/bad.yaml:3: source.torch.factory",
        "cannot import 'models.syntax': models/syntax.py:2: SyntaxError",
        id="syntax-error",
    ),
    pytest.param(
        torch_recipe(factory="models/convnet.py"),
        "recipes/bad.yaml:3: source.torch.factory",
        "is not of the form package.module:callable",
        id="factory-form",
    ),
    pytest.param(
        torch_recipe(extra="    weights: models/none.pt\n"),
        "recipes/bad.yaml:5: source.torch.weights",
        "file not found: models/none.pt",
        id="no-weights-file",
    ),
    pytest.param(
        torch_recipe(extra="    kwargs: {since: 2024-01-01}\n"),
        "recipes/bad.yaml:5: source.torch.kwargs",
        "kwargs must be plain values",
        id="kwargs-not-plain",
    ),
    pytest.param(
        torch_recipe(profile_input="img"),
        "recipes/bad.yaml:7: profiles[0].inputs.img",
        "the model has no input 'img' (source.torch.inputs: image)",
        id="profile-names-unknown-input",
    ),
    pytest.param(
        torch_recipe(inputs="[{name: image, shape: [4, 3, 32]}]"),
        "recipes/bad.yaml:7: profiles[0].inputs.image.min",
        "rank 4 but source.torch.inputs gives 'image' rank 3",
        id="rank-differs",
    ),
    pytest.param(
        torch_recipe(inputs="[{name: image, shape: [16, 3, 32, 32]}]"),
        "recipes/bad.yaml:4: source.torch.inputs[0].shape",
        "[16, 3, 32, 32] is outside the profiles' range for 'image': [1, 3, 32, 32]..[8, 3, 32, 32]",
        id="shape-outside-profiles",
    ),
    pytest.param(
        torch_recipe(inputs="[{name: image}, {name: mask}]"),
        "recipes/bad.yaml:4: source.torch.inputs[1]",
        "input 'mask' needs a shape",
        id="input-without-shape",
    ),
    pytest.param(
        torch_recipe(extra="    onnx: models/tiny_cnn.onnx\n")
        .replace("  torch:\n", "  onnx: models/tiny_cnn.onnx\n  torch:\n")
        .replace("    onnx: models/tiny_cnn.onnx\n", ""),
        "recipes/bad.yaml:3: source.torch",
        "give one source, not onnx and torch",
        id="onnx-and-torch",
    ),
]


@pytest.mark.parametrize("text, where, message", TORCH_RECIPE_CASES)
def test_bad_torch_recipe_is_refused_before_running_anything(
    tmp_path: Path, text: str, where: str, message: str
) -> None:
    from refusals import assert_refused

    root = write_torch_project(
        tmp_path / "proj", {"bad": text}, {"convnet.py": CONVNET, "syntax.py": "def make():\n    return (\n"}
    )
    assert_refused(root, where, message)


BAD_MODELS = """\
import torch
from torch import nn


def raises():
    raise ValueError("no such variant")


def number():
    return 42


class Eig(nn.Module):
    def forward(self, x):
        return torch.linalg.eigvals(x).real


class Flat(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(3 * 8 * 8, 4)

    def forward(self, x):
        return self.linear(x.flatten(1))
"""

# recipe name -> (recipe, the one-line failure of its export stage)
FAILING_EXPORTS = {
    "raises": (
        torch_recipe("models.bad:raises"),
        "source.torch.factory: models.bad:raises raised ValueError: no such variant",
    ),
    "number": (
        torch_recipe("models.bad:number"),
        "source.torch.factory: models.bad:number returned int, not a torch.nn.Module",
    ),
    "noimport": (
        torch_recipe("models.noimport:make"),
        "source.torch.factory: cannot import 'models.noimport': ModuleNotFoundError: No module named "
        "'not_a_module_anywhere'",
    ),
    "inputs": (
        torch_recipe(shape="shape: [2, 4, 32, 32]"),
        "source.torch.inputs: the model does not accept (image float32 [2, 4, 32, 32]): RuntimeError: Given groups=1, "
        "weight of size [8, 3, 3, 3]",
    ),
    "weights": (
        torch_recipe(extra="    weights: models/other.pt\n"),
        "source.torch.weights: other.pt does not fit the model: RuntimeError: Error(s) in loading state_dict",
    ),
    "op": (
        torch_recipe("models.bad:Eig", shape="shape: [4, 4]"),
        "source.torch.factory: the exporter cannot convert the model to ONNX: DispatchError: No ONNX function found "
        "for <OpOverload(op='aten.linalg_eig'",
    ),
    "axis": (
        torch_recipe("models.bad:Flat", shape="min: [1, 3, 8, 8], opt: [2, 3, 8, 8], max: [4, 3, 8, 16]"),
        "profiles: the model fixes an axis the profiles make dynamic: ValueError: Found the following conflicts",
    ),
}


def test_failing_exports_say_which_recipe_field_in_one_line(tmp_path: Path) -> None:
    root = write_torch_project(
        tmp_path / "proj",
        {name: text for name, (text, _) in FAILING_EXPORTS.items()},
        {
            "convnet.py": CONVNET,
            "bad.py": BAD_MODELS,
            "noimport.py": "import not_a_module_anywhere\n\n\ndef make():\n    pass\n",
        },
    )
    torch.save({"unrelated.weight": torch.zeros(2)}, root / "models" / "other.pt")
    result = trtflow(root, "run", "--json")
    assert result.code == 1, result.err
    reasons = {node["recipe"]: node["reason"] for node in json.loads(result.out)["nodes"] if node["kind"] == "export"}
    for name, (_, expected) in FAILING_EXPORTS.items():
        assert reasons[name].startswith(expected) and "\n" not in reasons[name], (name, reasons[name])


def test_dynamic_axes_come_from_every_profile(tmp_path: Path) -> None:
    from trtflow.recipe import load_project
    from trtflow.run.dag import dag_from_project
    from trtflow.stages.base import RecipeContext
    from trtflow.stages.export.from_torch import export_dims

    recipe = CONV_RECIPE.replace(
        "      image: {min: [1, 3, 32, 32], opt: [4, 3, 32, 32], max: [8, 3, 32, 32]}\n",
        "      image: {min: [1, 3, 32, 32], opt: [4, 3, 32, 32], max: [8, 3, 32, 32]}\n"
        "  - inputs:\n      image: {shape: [16, 3, 64, 32]}\n",
    )
    root = write_torch_project(tmp_path / "proj", {"conv": recipe}, {"convnet.py": CONVNET})
    save_weights(root, seed=1)
    project = load_project(root)
    inputs, dynamic = export_dims(RecipeContext(project.recipes[0], project.root, project.pipeline))
    # the first profile's opt
    assert [i.model_dump() for i in inputs] == [{"name": "image", "dtype": "float32", "shape": [4, 3, 32, 32]}]
    assert dynamic == {"image": {"0": [1, 16], "2": [32, 64]}}  # axis 3 is 32 everywhere: static
    export = dag_from_project(project).nodes["export:conv"]
    assert [role for role, _ in export.sources] == ["factory", "weights"] and export.params.dynamic == dynamic
