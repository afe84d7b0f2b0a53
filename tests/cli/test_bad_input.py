"""Bad input is refused up front: exit 3, one `error: <file>:<line>: <field>: <message>` line, no traceback,
nothing written to the store. Every case is a real project on disk, differing from a valid one by one edit.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import PIPELINE, trtflow, write_project
from refusals import assert_refused, assert_wrote_nothing, files, recipe

VALID = recipe()
NO_PROFILES = VALID.split("profiles:")[0]  # lines 1-6 only


def make_project(root: Path, recipes: dict[str, str] | None = None, pipeline: str = PIPELINE) -> Path:
    root = write_project(root, recipes=recipes if recipes is not None else {"tiny": VALID}, pipeline=pipeline)
    assert not (root / "artifacts").exists()
    return root


# (id, recipe text, "file:line: field", message fragment); the recipe is recipes/tiny.yaml
# opened on line 3, seen on 4
RECIPE_CASES = [
    pytest.param(recipe(precisions="[fp32"), "recipes/tiny.yaml:4", "expected ',' or ']'", id="unclosed-bracket"),
    pytest.param(
        recipe(extra="name: a: b\n"),
        "recipes/tiny.yaml:13",
        "invalid YAML: mapping values are not allowed",
        id="bad-mapping",
    ),
    pytest.param(
        "- source: models/tiny_cnn.onnx\n",
        "recipes/tiny.yaml:1",
        "the file must hold a mapping of keys",
        id="not-a-mapping",
    ),
    pytest.param(
        recipe(extra="precisions: [fp32]\n"), "recipes/tiny.yaml:13", "duplicate key 'precisions'", id="duplicate-key"
    ),
    pytest.param(
        recipe(extra="outputs: [engine]\n"),
        "recipes/tiny.yaml:13: outputs",
        "unknown key 'outputs'",
        id="unknown-top-level-key",
    ),
    pytest.param(
        recipe(build="workspce_mib: 5"),
        "recipes/tiny.yaml:6: build.workspce_mib",
        "unknown key 'workspce_mib'; did you mean 'workspace_mib'?",
        id="unknown-nested-key",
    ),
    pytest.param(
        VALID.replace("source:\n  onnx: models/tiny_cnn.onnx\n", "source: {}\n"),
        "recipes/tiny.yaml:1: source.onnx",
        "required field is missing",
        id="missing-field",
    ),
    pytest.param(
        recipe(onnx="models/absent.onnx"),
        "recipes/tiny.yaml:2: source.onnx",
        "model file not found: models/absent.onnx",
        id="missing-model-file",
    ),
    pytest.param(
        recipe(min="[5, 3, 32, 32]"),
        "recipes/tiny.yaml:10: profiles[0].inputs.input.min",
        "min must be <= opt in every dimension",
        id="min-gt-opt",
    ),
    pytest.param(
        recipe(opt="[9, 3, 32, 32]"),
        "recipes/tiny.yaml:12: profiles[0].inputs.input.max",
        "opt must be <= max in every dimension",
        id="opt-gt-max",
    ),
    pytest.param(
        recipe(min="[0, 3, 32, 32]"),
        "recipes/tiny.yaml:10: profiles[0].inputs.input.min[0]",
        "greater than or equal to 1",
        id="zero-dim",
    ),
    pytest.param(
        recipe(opt="[4, 3, 32]"),
        "recipes/tiny.yaml:12: profiles[0].inputs.input.max",
        "min, opt and max must have the same rank",
        id="rank-differs-in-triple",
    ),
    pytest.param(
        recipe(targets="[rtx-hopper]"),
        "recipes/tiny.yaml:4: targets[0]",
        "unknown target 'rtx-hopper' (pipeline.yaml defines: rtx-ampere, rtx-ada)",
        id="unknown-target",
    ),
    pytest.param(
        recipe(targets="[rtx-ampere, h100]"),
        "recipes/tiny.yaml:4: targets[1]",
        "unknown target 'h100'",
        id="unknown-second-target",
    ),
    pytest.param(
        recipe(precisions="[fp61]"),
        "recipes/tiny.yaml:3: precisions[0]",
        "unknown precision 'fp61' (supported: fp32, fp16, bf16, int8, fp8)",
        id="precision-fp61",
    ),
    pytest.param(
        recipe(precisions="[fp32, int3]"),
        "recipes/tiny.yaml:3: precisions[1]",
        "unknown precision 'int3'",
        id="precision-int3",
    ),
    # checked against the ONNX model (trtflow/modelcheck.py)
    pytest.param(
        recipe(input="image"),
        "recipes/tiny.yaml:9: profiles[0].inputs.image",
        "the model has no input 'image' (its inputs: input)",
        id="input-not-in-model",
    ),
    pytest.param(
        NO_PROFILES,
        "recipes/tiny.yaml:1: profiles",
        "input 'input' has dynamic shape [?,3,32,32]",
        id="dynamic-model-no-profiles",
    ),
    pytest.param(
        recipe(min="[1, 3, 32]", opt="[4, 3, 32]", max="[8, 3, 32]"),
        "recipes/tiny.yaml:10: profiles[0].inputs.input.min",
        "rank 3 but the model's input has rank 4",
        id="rank-differs-from-model",
    ),
    pytest.param(
        recipe(min="[1, 3, 16, 32]", opt="[4, 3, 16, 32]", max="[8, 3, 16, 32]"),
        "recipes/tiny.yaml:10: profiles[0].inputs.input.min",
        "dimension 2 is fixed to 32 in the model, not 16",
        id="static-dim-contradicts-model",
    ),
]


@pytest.mark.parametrize("text, where, message", RECIPE_CASES)
def test_bad_recipe(tmp_path: Path, text: str, where: str, message: str) -> None:
    assert_refused(make_project(tmp_path / "proj", {"tiny": text}), where, message)


# Tags that would build Python objects, or fail to build, are refused at their line, never tracebacks.
@pytest.mark.parametrize(
    "extra",
    [
        pytest.param("code: !!python/name:os.system\n", id="unknown-tag"),
        pytest.param("count: !!int many\n", id="bad-int-tag"),
        pytest.param("? [a, b]\n: 1\n", id="unhashable-key"),
        pytest.param("<<: [1, 2]\n", id="merge-key-of-no-mapping"),
    ],
)
def test_yaml_that_parses_but_cannot_be_built(tmp_path: Path, extra: str) -> None:
    # merge keys of mappings work (test_hostile_files)
    message = "merges a mapping" if extra.startswith("<<") else "invalid YAML"
    assert_refused(make_project(tmp_path / "proj", {"tiny": recipe(extra=extra)}), "recipes/tiny.yaml:13", message)


@pytest.mark.parametrize(
    "data, message",
    [
        pytest.param(
            b"this is not an onnx model\n",
            "cannot parse ONNX model models/tiny_cnn.onnx: DecodeError",
            id="garbage-bytes",
        ),
        pytest.param(b"", "models/tiny_cnn.onnx holds no ONNX graph", id="empty-file"),
    ],
)
def test_unparseable_model(tmp_path: Path, data: bytes, message: str) -> None:
    root = make_project(tmp_path / "proj")
    (root / "models" / "tiny_cnn.onnx").write_bytes(data)
    assert_refused(root, "recipes/tiny.yaml:2: source.onnx", message)


def pipeline(
    backend: str = "tensorrt-rtx", ccs: str = "[sm_86]", recipes: str = "[recipes/*.yaml]", extra: str = ""
) -> str:
    return (
        "store: artifacts/store\n"  # 1
        "packages: artifacts/packages\n"  # 2
        f"recipes: {recipes}\n"  # 3
        "targets:\n"  # 4
        "  rtx-ampere:\n"  # 5
        f"    backend: {backend}\n"  # 6
        f"    compute_capabilities: {ccs}\n"  # 7
        "  rtx-ada: {backend: tensorrt-rtx, compute_capabilities: [sm_89]}\n"  # 8
        f"{extra}"  # 9 onwards
    )


PIPELINE_CASES = [
    pytest.param(
        pipeline(backend="tensorrt-llm"),
        "pipeline.yaml:6: targets.rtx-ampere.backend",
        "'tensorrt-rtx' or 'tensorrt'",
        id="unknown-backend",
    ),
    pytest.param(
        pipeline(ccs="[sm_90]"),
        "pipeline.yaml:7: targets.rtx-ampere.compute_capabilities",
        "tensorrt-rtx cannot target sm_90",
        id="unsupported-capability",
    ),
    pytest.param(
        pipeline(ccs="[ampere]"),
        "pipeline.yaml:7: targets.rtx-ampere.compute_capabilities",
        "compute capability 'ampere' is not of the form sm_86 or 8.6",
        id="malformed-capability",
    ),
    pytest.param(
        pipeline(recipes="[recipes/*.yml]"),
        "pipeline.yaml:3: recipes[0]",
        "no file matches 'recipes/*.yml'",
        id="recipes-glob-matches-nothing",
    ),
    pytest.param(
        pipeline(extra="caches: /tmp\n"), "pipeline.yaml:9: caches", "unknown key 'caches'", id="unknown-pipeline-key"
    ),
    pytest.param(
        pipeline(extra="cache: {remote: bucket/prefix}\n"),
        "pipeline.yaml:9: cache.remote",
        "is not a URL such as s3://bucket/prefix",
        id="remote-not-a-url",
    ),
    pytest.param(
        pipeline(extra="cache: {remote: 's3://b/p', options: {secret: x}}\n"),
        "pipeline.yaml:9: cache.options",
        "options.secret: credentials do not belong in pipeline.yaml",
        id="remote-credentials",
    ),
    pytest.param(
        pipeline(extra="  rtx-ada: {backend: tensorrt-rtx, compute_capabilities: [sm_89]}\n"),
        "pipeline.yaml:9",
        "duplicate key 'rtx-ada'",
        id="duplicate-target",
    ),
    pytest.param(
        pipeline(ccs="[sm_86]\n    runs_on: {gpu-class: 'a b'}"),
        "pipeline.yaml:8: targets.rtx-ampere.runs_on",
        "gpu-class: a b is not a Ray node label",
        id="bad-node-label",
    ),
    pytest.param(
        pipeline(extra="executor: {dask: {}}\n"),
        "pipeline.yaml:9: executor.dask",
        "unknown key 'dask'",
        id="unknown-executor",
    ),
]


@pytest.mark.parametrize("text, where, message", PIPELINE_CASES)
def test_bad_pipeline(tmp_path: Path, text: str, where: str, message: str) -> None:
    assert_refused(make_project(tmp_path / "proj", pipeline=text), where, message)


def test_missing_pipeline(tmp_path: Path) -> None:
    root = make_project(tmp_path / "proj")
    (root / "pipeline.yaml").unlink()
    assert_refused(root, "pipeline.yaml", "not found in")


def test_two_recipes_with_the_same_name(tmp_path: Path) -> None:
    same = "name: tiny\n" + VALID
    root = make_project(tmp_path / "proj", {"a": same, "b": same})
    assert_refused(root, "recipes/b.yaml:1: name", "recipe name 'tiny' is also used by recipes/a.yaml")


def test_the_cases_differ_from_a_valid_project(tmp_path: Path) -> None:
    """The helpers' defaults make a valid project, so each case above fails for its one edit alone."""
    root = make_project(tmp_path / "proj", {"tiny": VALID}, pipeline())
    result = trtflow(root, "validate")
    assert (result.code, result.err) == (0, ""), result
    assert result.out.startswith("ok: 1 recipe(s), 2 target(s)"), result.out
    assert not (root / "artifacts").exists()


@pytest.mark.parametrize(
    "args", [("plan",), ("plan", "--explain"), ("plan", "--json"), ("run", "--dry-run")], ids=" ".join
)
def test_planning_writes_nothing(project: Path, args: tuple[str, ...]) -> None:
    before = files(project)
    result = trtflow(project, *args)
    assert result.code == 0, result
    assert "build:tiny/fp32/rtx-ada" in result.out, result.out
    assert_wrote_nothing(project, before)
