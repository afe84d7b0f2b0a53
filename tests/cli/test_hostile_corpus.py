"""The hostile-input corpus: YAML, models, calibration files, packages, store records and cache rows, remote
records. Each case is a real project on disk with one hostile edit, run through the real CLI; each names the
exit code and a fragment of the one line it must print. No case may print a traceback, hang, or touch a file
outside the project (a sentinel file beside every project must survive every case).

Exit codes: 0 recovered (a warning says what was set aside), 2 bad option, 3 invalid project, file or package,
4 environment, 5 no engine fits.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import sqlite3
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import PIPELINE, TINY_RECIPE, trtflow, write_project
from decoys import DECOY_BYTES, DECOY_NAME, DECOY_TREE, make_decoy, tree
from onnx import TensorProto

RECIPE = "recipes/tiny.yaml"
MODEL = "models/tiny_cnn.onnx"
SOURCE = "source: {onnx: models/tiny_cnn.onnx}\n"
PROFILES = "profiles:\n  - inputs:\n      input: {min: [1, 3, 32, 32], opt: [4, 3, 32, 32], max: [8, 3, 32, 32]}\n"
INT8_RECIPE = TINY_RECIPE + "calibration: {data: calib/*.npy}\n"
INT8_RECIPE = INT8_RECIPE.replace("precisions: [fp32]", "precisions: [int8]")


@dataclass(frozen=True)
class Case:
    """One hostile edit of a project, the command that meets it, and what that command must answer."""

    base: str  # "fresh": nothing built; "built": a built copy; "int8": a fresh int8 project with 4 good .npy files
    edit: Callable[[Path], None]
    args: tuple[str, ...]
    code: int
    fragment: str


CASES: dict[str, Case] = {}


def case(name: str, base: str, args: tuple[str, ...], code: int, fragment: str) -> Callable:
    def register(edit: Callable[[Path], None]) -> Callable[[Path], None]:
        assert name not in CASES, name
        CASES[name] = Case(base, edit, args, code, fragment)
        return edit

    return register


def write(relative: str, data: bytes | str) -> Callable[[Path], None]:
    """An edit that replaces one file's bytes."""

    def edit(root: Path) -> None:
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.is_symlink() or path.is_file():
            path.unlink()
        path.write_bytes(data.encode() if isinstance(data, str) else data)

    return edit


def add(name: str, base: str, args: tuple[str, ...], code: int, fragment: str, edit: Callable[[Path], None]) -> None:
    case(name, base, args, code, fragment)(edit)


# YAML ------------------------------------------------------------------------------------------------------------

VALIDATE = ("validate",)
for name, text, fragment in [
    ("pipeline-empty", "", "pipeline.yaml:1: targets: required field is missing"),
    ("pipeline-list", "- a\n- b\n", "pipeline.yaml:1: the file must hold a mapping"),
    ("pipeline-scalar", "hello\n", "pipeline.yaml:1: the file must hold a mapping"),
    (
        "pipeline-python-tag",
        "!!python/object/apply:os.system ['touch pwned']\n",
        "pipeline.yaml:1: invalid YAML: tag tag:yaml.org,2002:python/object/apply:os.system is not supported",
    ),
    ("pipeline-custom-tag", "store: !include /etc/passwd\n" + PIPELINE.split("\n", 1)[1], "invalid YAML"),
    ("pipeline-tabs", "targets:\n\trtx: {}\n", "pipeline.yaml:2: invalid YAML"),
    ("pipeline-targets-null", "targets:\n", "targets"),
    ("pipeline-targets-empty", "targets: {}\n", "targets"),
    ("pipeline-unclosed-quote", 'store: "artifacts\n', "invalid YAML"),
    ("pipeline-complex-key", "? [a, b]\n: c\n" + PIPELINE, "pipeline.yaml:1"),
    ("pipeline-null-key", "~: 1\n" + PIPELINE, "pipeline.yaml:1"),
    ("pipeline-int-key", "1: 1\n" + PIPELINE, "pipeline.yaml:1"),
    ("pipeline-store-nul-escape", 'store: "art\\0ifacts"\n' + PIPELINE.split("\n", 2)[2], "store"),
    ("pipeline-recipes-not-list", PIPELINE.replace("recipes:\n  - recipes/*.yaml", "recipes: 5"), "recipes"),
    (
        "pipeline-duplicate-target",
        PIPELINE + "  rtx-ada: {backend: tensorrt-rtx, compute_capabilities: [sm_89]}\n",
        "duplicate key 'rtx-ada'",
    ),
    ("pipeline-trust-not-list", PIPELINE + "cache: {remote: 'file:///tmp/x', trust: keys/ci.pub}\n", "cache.trust"),
    (
        "pipeline-trust-missing-key",
        PIPELINE + "cache: {remote: 'file:///tmp/x', trust: [keys/none.pub]}\n",
        "cache.trust[0]",
    ),
    (
        "pipeline-sas-token-option",
        PIPELINE + "cache: {remote: 'az://c/p', options: {sas_token: x}}\n",
        "credentials do not belong",
    ),
    ("pipeline-bom", "\ufeff" + PIPELINE, ""),
]:
    add(name, "fresh", VALIDATE, 0 if name == "pipeline-bom" else 3, fragment, write("pipeline.yaml", text))

for name, text, fragment in [
    ("recipe-python-tag", "!!python/object/new:os.system [echo]\n", "invalid YAML"),
    ("recipe-name-traversal", "name: ../../evil\n" + TINY_RECIPE, "recipes/tiny.yaml:1: name"),
    ("recipe-name-slash", "name: a/b\n" + TINY_RECIPE, "recipes/tiny.yaml:1: name"),
    ("recipe-name-empty", "name: ''\n" + TINY_RECIPE, "recipes/tiny.yaml:1: name"),
    ("recipe-name-nul", 'name: "a\\0b"\n' + TINY_RECIPE, "recipes/tiny.yaml:1: name"),
    ("recipe-name-rtl-override", 'name: "evil\\u202etxt"\n' + TINY_RECIPE, "recipes/tiny.yaml:1: name"),
    ("recipe-name-dotdot", "name: ..\n" + TINY_RECIPE, "recipes/tiny.yaml:1: name"),
    ("recipe-name-huge", "name: " + "a" * 5000 + "\n" + TINY_RECIPE, "recipes/tiny.yaml:1: name"),
    ("recipe-onnx-absolute-outside", TINY_RECIPE.replace(MODEL, "/etc/passwd"), "recipes/tiny.yaml:2: source.onnx"),
    (
        "recipe-onnx-dotdot-outside",
        TINY_RECIPE.replace(MODEL, "../../../../etc/hostname"),
        "recipes/tiny.yaml:2: source.onnx",
    ),
    ("recipe-onnx-is-a-folder", TINY_RECIPE.replace(MODEL, "models"), "recipes/tiny.yaml:2: source.onnx"),
    (
        "recipe-dim-huge",
        TINY_RECIPE.replace("max: [8,", "max: [100000000000000000000,"),
        "recipes/tiny.yaml:7: profiles[0].inputs.input",
    ),
    (
        "recipe-dim-negative",
        TINY_RECIPE.replace("min: [1,", "min: [-1,"),
        "recipes/tiny.yaml:7: profiles[0].inputs.input",
    ),
    (
        "recipe-dim-float",
        TINY_RECIPE.replace("min: [1,", "min: [1.5,"),
        "recipes/tiny.yaml:7: profiles[0].inputs.input",
    ),
    (
        "recipe-dim-string",
        TINY_RECIPE.replace("min: [1,", "min: [one,"),
        "recipes/tiny.yaml:7: profiles[0].inputs.input",
    ),
    (
        "recipe-dim-bool",
        TINY_RECIPE.replace("min: [1,", "min: [true,"),
        "recipes/tiny.yaml:7: profiles[0].inputs.input",
    ),
    ("recipe-precisions-duplicate", TINY_RECIPE.replace("[fp32]", "[fp32, fp32]"), "recipes/tiny.yaml:3: precisions"),
    ("recipe-precisions-empty", TINY_RECIPE.replace("[fp32]", "[]"), "recipes/tiny.yaml:3: precisions"),
    ("recipe-targets-empty", TINY_RECIPE.replace("[rtx-ampere, rtx-ada]", "[]"), "recipes/tiny.yaml:4: targets"),
    (
        "recipe-workspace-negative",
        TINY_RECIPE + "build: {workspace_mib: -1}\n",
        "recipes/tiny.yaml:8: build.workspace_mib",
    ),
    (
        "recipe-optimization-level-99",
        TINY_RECIPE + "build: {optimization_level: 99}\n",
        "recipes/tiny.yaml:8: build.optimization_level",
    ),
    (
        "recipe-exclude-matches-nothing",
        TINY_RECIPE + "exclude:\n  - {precision: fp16, target: rtx-ada}\n",
        "recipes/tiny.yaml:9: exclude[0]",
    ),
    (
        "recipe-mapping-tag",
        TINY_RECIPE.replace("profiles:\n", "profiles: !!python/object:os.PathLike\n"),
        "recipes/tiny.yaml:5: invalid YAML: tag",
    ),
    ("recipe-anchor-loop", "a: &a [*a]\n" + TINY_RECIPE, "recipes/tiny.yaml:1"),
    (
        "recipe-binary-garbage",
        bytes(range(1, 256)).decode("latin-1"),
        "recipes/tiny.yaml:1: invalid YAML: character 0x01 is not allowed",
    ),
]:
    add(name, "fresh", VALIDATE, 3, fragment, write(RECIPE, text))


@case("pipeline-is-a-folder", "fresh", VALIDATE, 3, "pipeline.yaml")
def _pipeline_folder(root: Path) -> None:
    (root / "pipeline.yaml").unlink()
    (root / "pipeline.yaml").mkdir()


@case("pipeline-is-a-fifo", "fresh", VALIDATE, 3, "pipeline.yaml: not a regular file")
def _pipeline_fifo(root: Path) -> None:
    (root / "pipeline.yaml").unlink()
    os.mkfifo(root / "pipeline.yaml")


@case("pipeline-symlink-loop", "fresh", VALIDATE, 3, "pipeline.yaml")
def _pipeline_loop(root: Path) -> None:
    (root / "pipeline.yaml").unlink()
    (root / "pipeline.yaml").symlink_to("pipeline.yaml")


@case("pipeline-symlink-to-dev-zero", "fresh", VALIDATE, 3, "pipeline.yaml: not a regular file")
def _pipeline_zero(root: Path) -> None:
    (root / "pipeline.yaml").unlink()
    (root / "pipeline.yaml").symlink_to("/dev/zero")


@case("recipe-symlink-to-dev-urandom", "fresh", VALIDATE, 3, "recipes/tiny.yaml: not a regular file")
def _recipe_urandom(root: Path) -> None:
    (root / RECIPE).unlink()
    (root / RECIPE).symlink_to("/dev/urandom")


@case("recipe-unreadable", "fresh", VALIDATE, 3, "recipes/tiny.yaml")
def _recipe_unreadable(root: Path) -> None:
    (root / RECIPE).chmod(0)
    if os.geteuid() == 0:  # root reads anything: make it unreadable another way
        (root / RECIPE).unlink()
        (root / RECIPE).mkdir()


# models ------------------------------------------------------------------------------------------------------------


def _model(edit: Callable[[onnx.ModelProto], None]) -> Callable[[Path], None]:
    """An edit of the project's ONNX model (saved without the checker, as an attacker would)."""

    def apply(root: Path) -> None:
        model = onnx.load(root / MODEL)
        edit(model)
        (root / MODEL).write_bytes(model.SerializeToString())

    return apply


def _external(location: str) -> Callable[[onnx.ModelProto], None]:
    def edit(model: onnx.ModelProto) -> None:
        tensor = model.graph.initializer[0]
        tensor.ClearField("raw_data")
        tensor.ClearField("float_data")
        tensor.data_location = TensorProto.EXTERNAL
        tensor.external_data.add(key="location", value=location)

    return edit


def _huge_initializer(model: onnx.ModelProto) -> None:
    tensor = model.graph.initializer[0]
    del tensor.dims[:]
    tensor.dims.extend([1 << 20, 1 << 20, 1 << 10])  # claims 4 PiB of float32


def _cycle(model: onnx.ModelProto) -> None:
    first = model.graph.node[0]
    first.input[0] = model.graph.node[-1].output[0]


def _unknown_domain(model: onnx.ModelProto) -> None:
    model.graph.node[0].domain = "evil.custom"
    model.opset_import.add(domain="evil.custom", version=1)


def _no_inputs(model: onnx.ModelProto) -> None:
    del model.graph.input[:]


def _opset(version: int) -> Callable[[onnx.ModelProto], None]:
    def edit(model: onnx.ModelProto) -> None:
        model.opset_import[0].version = version

    return edit


def _ir(version: int) -> Callable[[onnx.ModelProto], None]:
    def edit(model: onnx.ModelProto) -> None:
        model.ir_version = version

    return edit


for name, edit, code, fragment in [
    ("model-external-data-traversal", _external("../../../../etc/passwd"), 3, "recipes/tiny.yaml:2: source.onnx"),
    ("model-external-data-absolute", _external("/etc/passwd"), 3, "recipes/tiny.yaml:2: source.onnx"),
    ("model-external-data-missing", _external("weights.bin"), 3, "recipes/tiny.yaml:2: source.onnx"),
    ("model-graph-cycle", _cycle, 3, "recipes/tiny.yaml:2: source.onnx: the graph has a cycle through node"),
    ("model-no-inputs", _no_inputs, 3, "recipes/tiny.yaml"),
    # well-formed protobuf that no runtime can load: its cleanup stage fails (exit 1), saying why in one line
    (
        "model-initializer-claims-petabytes",
        _huge_initializer,
        1,
        "failed   cleanup:tiny: ONNX Runtime cannot load the model:",
    ),
    (
        "model-unknown-op-domain",
        _unknown_domain,
        1,
        "cleanup:tiny: ONNX Runtime cannot load the model: Fatal error: evil.custom:Conv(-1) is not a registered",
    ),
    ("model-opset-999", _opset(999), 1, "cleanup:tiny: ONNX Runtime cannot load the model:"),
    (
        "model-ir-version-999",
        _ir(999),
        1,
        "cleanup:tiny: ONNX Runtime cannot load the model: Unsupported model IR version: 999",
    ),
    ("model-ir-version-0", _ir(0), 0, "7 built"),  # cleanup normalizes the IR version (issue: legacy ONNX)
]:
    add(name, "fresh", ("run",), code, fragment, _model(edit))


def _truncated(root: Path) -> None:
    data = (root / MODEL).read_bytes()
    (root / MODEL).write_bytes(data[: len(data) // 2])


add("model-truncated", "fresh", VALIDATE, 3, "recipes/tiny.yaml:2: source.onnx", _truncated)
add("model-is-json", "fresh", VALIDATE, 3, "recipes/tiny.yaml:2: source.onnx", write(MODEL, '{"graph": {}}'))
add(
    "model-is-zip-bomb-header",
    "fresh",
    VALIDATE,
    3,
    "recipes/tiny.yaml:2: source.onnx",
    write(MODEL, b"PK\x03\x04" + b"\0" * 100),
)


@case("model-is-a-fifo", "fresh", VALIDATE, 3, "recipes/tiny.yaml:2: source.onnx")
def _model_fifo(root: Path) -> None:
    (root / MODEL).unlink()
    os.mkfifo(root / MODEL)


@case("model-symlink-to-dev-zero", "fresh", VALIDATE, 3, "recipes/tiny.yaml:2: source.onnx")
def _model_zero(root: Path) -> None:
    (root / MODEL).unlink()
    (root / MODEL).symlink_to("/dev/zero")


# calibration files -------------------------------------------------------------------------------------------------

CALIB_WHERE = "recipes/tiny.yaml:8: calibration.data"


def _calibration(edit: Callable[[Path], None]) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        edit(root / "calib" / "batch_00.npy")

    return apply


def _npy_object(path: Path) -> None:
    np.save(path, np.array([{"a": 1}], dtype=object), allow_pickle=True)


def _npy_pickle_payload(path: Path) -> None:
    import pickle

    path.write_bytes(pickle.dumps(os.system))


def _npy(array: np.ndarray) -> Callable[[Path], None]:
    return lambda path: np.save(path, array)


def _npy_huge_header(path: Path) -> None:
    header = b"{'descr': '<f4', 'fortran_order': False, 'shape': (" + b"1, " * 30000 + b"), }"
    path.write_bytes(b"\x93NUMPY\x02\x00" + len(header).to_bytes(4, "little") + header)


def _npy_claims_huge(path: Path) -> None:
    header = b"{'descr': '<f4', 'fortran_order': False, 'shape': (1000000, 3, 32, 32), }"
    header += b" " * (118 - len(header)) + b"\n"
    path.write_bytes(b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header + b"\0" * 64)


for name, edit, fragment in [
    ("calibration-object-array", _npy_object, "pickle"),
    ("calibration-pickle-payload", _npy_pickle_payload, "batch_00.npy"),
    ("calibration-nan", _npy(np.full((2, 3, 32, 32), np.nan, dtype=np.float32)), "batch_00.npy"),
    ("calibration-inf", _npy(np.full((2, 3, 32, 32), np.inf, dtype=np.float32)), "batch_00.npy"),
    ("calibration-wrong-rank", _npy(np.zeros((2, 3, 32), dtype=np.float32)), "batch_00.npy"),
    ("calibration-strings", _npy(np.array(["a", "b"])), "batch_00.npy"),
    ("calibration-complex", _npy(np.zeros((2, 3, 32, 32), dtype=np.complex64)), "batch_00.npy"),
    ("calibration-empty-batch", _npy(np.zeros((0, 3, 32, 32), dtype=np.float32)), "batch_00.npy"),
    ("calibration-huge-header", _npy_huge_header, "batch_00.npy"),
    ("calibration-claims-a-million-rows", _npy_claims_huge, "batch_00.npy"),
    ("calibration-garbage", lambda path: path.write_bytes(b"\x93NUMPY garbage"), "batch_00.npy"),
    ("calibration-fifo", lambda path: (path.unlink(), os.mkfifo(path)), "batch_00.npy"),
]:
    add(name, "int8", VALIDATE, 3, fragment, _calibration(edit))


# packages (provision) ----------------------------------------------------------------------------------------------

PACKAGE = "artifacts/packages/tiny"
PROVISION = ("provision", "{root}/" + PACKAGE, "--gpu", "sm_89", "--dest", "{root}/dest")


def _manifest(edit: Callable[[dict], None]) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        path = root / PACKAGE / "manifest.json"
        manifest = json.loads(path.read_text())
        edit(manifest)
        path.write_text(json.dumps(manifest))

    return apply


def _engine_field(field: str, value) -> Callable[[dict], None]:
    def edit(manifest: dict) -> None:
        for engine in manifest["engines"]:
            engine[field] = value

    return edit


def _recipe_field(value: str) -> Callable[[dict], None]:
    def edit(manifest: dict) -> None:
        manifest["recipe"] = value

    return edit


for name, edit, code, fragment in [
    (
        "package-engine-path-traversal",
        _manifest(_engine_field("file", "../../../../etc/passwd")),
        3,
        "escapes the package",
    ),
    ("package-engine-absolute-path", _manifest(_engine_field("file", "/etc/passwd")), 3, "escapes the package"),
    ("package-engine-backslash-path", _manifest(_engine_field("file", "engines\\..\\..\\x")), 3, "escapes the package"),
    ("package-engine-missing", _manifest(_engine_field("file", "engines/none.engine")), 3, "engines/none.engine"),
    ("package-engine-wrong-digest", _manifest(_engine_field("sha256", "0" * 64)), 3, "sha256"),
    ("package-engine-size-negative", _manifest(_engine_field("size", -1)), 3, "not a trtflow manifest: engines.0.size"),
    ("package-recipe-traversal", _manifest(_recipe_field("../../evil")), 3, "not a trtflow manifest: recipe"),
    ("package-precision-traversal", _manifest(_engine_field("precision", "../x")), 3, "not a plain file name"),
    ("package-manifest-not-json", write(PACKAGE + "/manifest.json", "{"), 3, "not a trtflow manifest"),
    ("package-manifest-list", write(PACKAGE + "/manifest.json", "[]"), 3, "not a trtflow manifest"),
    (
        "package-manifest-deep-json",
        write(PACKAGE + "/manifest.json", "[" * 100000 + "]" * 100000),
        3,
        "not a trtflow manifest",
    ),
    (
        "package-manifest-wrong-types",
        _manifest(_engine_field("compute_capabilities", "sm_89")),
        3,
        "not a trtflow manifest",
    ),
    ("package-no-engines", _manifest(lambda m: m.update(engines=[])), 5, "no engine in package tiny fits sm_89"),
]:
    add(name, "built", PROVISION, code, fragment, edit)


# plugin libraries: in recipes (checked when the recipe loads) and in manifests (names are file names, never paths)

PLUGIN = "build: {plugins: [%s]}\n"
for name, given, fragment in [
    (
        "recipe-plugin-missing",
        "libs/none.so",
        "recipes/tiny.yaml:8: build.plugins[0]: plugin library not found: libs/none.so",
    ),
    (
        "recipe-plugin-dotdot-outside",
        "../../../../etc/hostname",
        "recipes/tiny.yaml:8: build.plugins[0]: ../../../../etc/hostname is outside the project",
    ),
    ("recipe-plugin-absolute-folder", "/etc", "recipes/tiny.yaml:8: build.plugins[0]: /etc is not a regular file"),
    (
        "recipe-plugin-absolute-device",
        "/dev/zero",
        "recipes/tiny.yaml:8: build.plugins[0]: /dev/zero is not a regular file",
    ),
    (
        "recipe-plugin-is-the-models-folder",
        "models",
        "recipes/tiny.yaml:8: build.plugins[0]: models is not a regular file",
    ),
]:
    add(name, "fresh", VALIDATE, 3, fragment, write(RECIPE, TINY_RECIPE + PLUGIN % given))
add(
    "recipe-plugins-not-a-list",
    "fresh",
    VALIDATE,
    3,
    "recipes/tiny.yaml:8: build.plugins",
    write(RECIPE, TINY_RECIPE + "build: {plugins: {a: b}}\n"),
)
add(
    "recipe-package-plugins-unknown",
    "fresh",
    VALIDATE,
    3,
    "recipes/tiny.yaml:8: package.plugins",
    write(RECIPE, TINY_RECIPE + "package: {plugins: embed}\n"),
)

PLUGIN_SHA = "ab" * 32


def _plugin(**fields) -> Callable[[dict], None]:
    """Every engine needs one plugin library: a valid entry with `fields` changed."""
    return _engine_field("plugins", [{"name": "libx.so", "sha256": PLUGIN_SHA, "size": 4, "carried": True, **fields}])


def _carried(data: bytes | None = None, link: bool = False) -> Callable[[Path], None]:
    """The plugin entry above, with its carried file holding `data` (or linked to the decoy's file)."""

    def edit(root: Path) -> None:
        _manifest(_plugin())(root)
        path = root / PACKAGE / "plugins" / f"{PLUGIN_SHA}-libx.so"
        path.parent.mkdir()
        path.symlink_to(_decoy(root) / "engine.bin") if link else path.write_bytes(data or b"")

    return edit


for name, edit, code, fragment in [
    (
        "package-plugin-name-traversal",
        _manifest(_plugin(name="../../x.so")),
        3,
        "not a trtflow manifest: engines.0.plugins.0.name",
    ),
    (
        "package-plugin-name-absolute",
        _manifest(_plugin(name="/etc/passwd")),
        3,
        "not a trtflow manifest: engines.0.plugins.0.name",
    ),
    (
        "package-plugin-name-dotdot",
        _manifest(_plugin(name="..")),
        3,
        "not a trtflow manifest: engines.0.plugins.0.name",
    ),
    (
        "package-plugin-sha256-traversal",
        _manifest(_plugin(sha256="../../../x")),
        3,
        "not a trtflow manifest: engines.0.plugins.0.sha256",
    ),
    (
        "package-plugin-size-negative",
        _manifest(_plugin(size=-1)),
        3,
        "not a trtflow manifest: engines.0.plugins.0.size",
    ),
    (
        "package-plugin-extra-field",
        _manifest(_plugin(file="../../x.so")),
        3,
        "not a trtflow manifest: engines.0.plugins.0.file",
    ),
    ("package-plugin-carried-missing", _manifest(_plugin()), 3, "the plugin file is missing"),
    ("package-plugin-carried-tampered", _carried(b"evil"), 3, "does not match the manifest's"),
    ("package-plugin-carried-larger", _carried(b"evil and more"), 3, "larger than the 4 bytes the manifest records"),
    ("package-plugin-carried-is-a-link", _carried(link=True), 3, "the plugin file is missing or outside the package"),
    ("package-plugin-not-on-the-device", _manifest(_plugin(carried=False)), 5, "no engine in package tiny fits sm_89"),
]:
    add(name, "built", PROVISION, code, fragment, edit)


def _tar_with(member: tarfile.TarInfo, data: bytes = b"") -> Callable[[Path], None]:
    """A package archive holding one crafted member beside a real manifest."""

    def apply(root: Path) -> None:
        archive = root / (PACKAGE + ".tar.gz")
        manifest = (root / PACKAGE / "manifest.json").read_bytes()
        with tarfile.open(archive, "w:gz") as tar:
            info = tarfile.TarInfo("tiny/manifest.json")
            info.size = len(manifest)
            tar.addfile(info, __import__("io").BytesIO(manifest))
            tar.addfile(member, __import__("io").BytesIO(data) if data else None)

    return apply


def _truncated_archive(folder: Path) -> None:
    """The package folder packed as its archive (`package: {archive: true}` packs it so), then cut short."""
    from trtflow.util.archive import write_reproducible_tar

    archive = folder.with_name(folder.name + ".tar.gz")
    write_reproducible_tar(folder, archive, folder.name)
    archive.write_bytes(archive.read_bytes()[:200])


def _member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "", size: int = 0) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.size = kind, link, size
    return info


ARCHIVE_PROVISION = ("provision", "{root}/" + PACKAGE + ".tar.gz", "--gpu", "sm_89", "--dest", "{root}/dest")
for name, edit, code, fragment in [
    ("archive-not-gzip", write(PACKAGE + ".tar.gz", b"plain text"), 3, "not a readable package archive"),
    (
        "archive-truncated",
        lambda root: _truncated_archive(root / PACKAGE),
        3,
        "not a readable package archive",
    ),
    (
        "archive-symlink-engine",
        _tar_with(_member("tiny/engines/rtx-ada/tiny-fp32.engine", tarfile.SYMTYPE, "/etc/passwd")),
        3,
        "tiny-fp32.engine",
    ),
    (
        "archive-hardlink-engine",
        _tar_with(_member("tiny/engines/rtx-ada/tiny-fp32.engine", tarfile.LNKTYPE, "/etc/passwd")),
        3,
        "tiny-fp32.engine",
    ),
    (
        "archive-device-engine",
        _tar_with(_member("tiny/engines/rtx-ada/tiny-fp32.engine", tarfile.CHRTYPE)),
        3,
        "tiny-fp32.engine",
    ),
    ("archive-engine-missing", _tar_with(_member("tiny/other", size=3), b"abc"), 3, "tiny-fp32.engine"),
]:
    add(name, "built", ARCHIVE_PROVISION, code, fragment, edit)


# the store: records, cache rows, objects ---------------------------------------------------------------------------

STORE = "artifacts/store"


def _records(edit: Callable[[Path], None], which: str = "package") -> Callable[[Path], None]:
    """Edit the record file of the project's `which` stage."""

    def apply(root: Path) -> None:
        key = json.loads((root / "trtflow.lock").read_text())["nodes"][
            f"{which}:tiny" if which != "build" else "build:tiny/fp32/rtx-ada"
        ]["key"]
        edit(root / STORE / "records" / key[:2] / f"{key}.json")

    return apply


def _replace_with(data: bytes) -> Callable[[Path], None]:
    def edit(path: Path) -> None:
        path.unlink()
        path.write_bytes(data)

    return edit


def _record_outputs(value) -> Callable[[Path], None]:
    def edit(path: Path) -> None:
        record = json.loads(path.read_text())
        record["outputs"] = value
        path.unlink()
        path.write_text(json.dumps(record))

    return edit


def _output_renamed(name: str) -> Callable[[Path], None]:
    """The package record's manifest.json output under another name (`{case}`: the case's folder), its digest (a
    real object) kept: a name the package's files would be placed by."""

    def edit(path: Path) -> None:
        record = json.loads(path.read_text())
        case_folder = path.parents[4].parent  # <case>/proj/artifacts/store/records/<xx>/<key>.json
        record["outputs"][name.format(case=case_folder)] = record["outputs"].pop("manifest.json")
        path.unlink()
        path.write_text(json.dumps(record))

    return edit


def _symlink_to(target: str) -> Callable[[Path], None]:
    def edit(path: Path) -> None:
        path.unlink()
        path.symlink_to(target)

    return edit


def _fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


RUN = ("run", "--json")
SET_ASIDE = "was malformed"
for name, edit, fragment in [
    ("record-garbage", _records(_replace_with(b"\x00\xffgarbage")), SET_ASIDE),
    ("record-empty", _records(_replace_with(b"")), SET_ASIDE),
    ("record-a-list", _records(_replace_with(b"[]")), SET_ASIDE),
    ("record-outputs-path-traversal", _records(_record_outputs({"package": "../../../../etc/passwd"})), SET_ASIDE),
    ("record-outputs-not-a-mapping", _records(_record_outputs("x")), SET_ASIDE),
    ("record-output-name-escapes-the-package", _records(_output_renamed("../../../../../pwned.json")), SET_ASIDE),
    ("record-output-name-absolute", _records(_output_renamed("{case}/pwned-absolute.json")), SET_ASIDE),
    ("record-outputs-missing", _records(_record_outputs(None)), SET_ASIDE),
    ("record-symlink-to-outside", _records(_symlink_to("/etc/hostname")), SET_ASIDE),
    ("record-fifo", _records(_fifo), SET_ASIDE),
    ("record-deep-json", _records(_replace_with(b"[" * 200000 + b"]" * 200000)), SET_ASIDE),
    (
        "record-of-a-build-names-another-key",
        _records(lambda p: p.write_text(p.read_text().replace('"key": "', '"key": "0', 1)), "build"),
        SET_ASIDE,
    ),
]:
    add(name, "built", RUN, 0, fragment, edit)


def _cache(edit: Callable[[Path], None]) -> Callable[[Path], None]:
    return lambda root: edit(root / STORE / "cache.sqlite")


def _cache_rows(*rows: tuple[str, object]) -> Callable[[Path], None]:
    def edit(path: Path) -> None:
        with sqlite3.connect(path) as db:
            for name, value in rows:
                db.execute("INSERT OR REPLACE INTO kv VALUES (?, ?)", (name, value))

    return edit


def _flip_header(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[0:16] = b"x" * 16
    path.write_bytes(bytes(data))


def _cache_folder(path: Path) -> None:
    path.unlink()
    path.mkdir()
    (path / "x").write_text("x")


CACHE_RESET = "started it anew"
for name, edit, fragment in [
    ("cache-not-a-database", _cache(_flip_header), CACHE_RESET),
    ("cache-truncated", _cache(lambda p: p.write_bytes(p.read_bytes()[:100])), CACHE_RESET),
    ("cache-is-a-folder", _cache(_cache_folder), "cache"),
    ("cache-symlink-to-outside", _cache(_symlink_to("/etc/hostname")), CACHE_RESET),
    ("cache-pickled-rows", _cache(_cache_rows(("node:package:tiny", __import__("pickle").dumps(os.system)))), ""),
    (
        "cache-stat-row-for-a-system-file",
        _cache(_cache_rows(("stat:/etc/passwd", '{"sig": [1, 2, 3], "sha256": "0"}'))),
        "",
    ),
    ("cache-object-signature-lies", _cache(_cache_rows(*[(f"obj:{'0' * 64}", '"1:2:3"')])), ""),
    (
        "cache-package-listing-names-outside",
        _cache(_cache_rows(("package:" + "0" * 64, '{"../../etc/passwd": "0"}'))),
        "",
    ),
]:
    add(name, "built", RUN, 0, fragment, edit)


@case("object-symlink-to-outside", "built", ("cache", "verify"), 1, "corrupt")
def _object_symlink(root: Path) -> None:
    objects = sorted((root / STORE / "objects").glob("*/*"))
    objects[0].chmod(0o644)
    objects[0].unlink()
    objects[0].symlink_to("/etc/hostname")


@case("records-folder-is-a-file", "built", RUN, 0, "")
def _records_file(root: Path) -> None:
    shutil.rmtree(root / STORE / "records")
    (root / STORE / "records").write_text("x")


@case("legacy-index-row-names-a-file-outside", "built", RUN, 0, "imported 0 stage record(s)")
def _legacy_index(root: Path) -> None:
    (root / STORE / "index").mkdir()
    with sqlite3.connect(root / STORE / "index" / "cache.db") as db:
        db.execute("CREATE TABLE Cache (key BLOB, raw INTEGER, mode INTEGER, filename TEXT, value BLOB)")
        db.execute(
            "INSERT INTO Cache VALUES ('stage:' || ?, 1, 1, ?, NULL)", ("1" * 64, str(root.parent / SENTINEL_NAME))
        )


@case("lock-garbage", "built", ("run", "--frozen"), 3, "trtflow.lock")
def _lock_garbage(root: Path) -> None:
    (root / "trtflow.lock").write_bytes(b"\x00garbage")


@case("lock-deep-json", "built", ("run", "--frozen"), 3, "trtflow.lock")
def _lock_deep(root: Path) -> None:
    (root / "trtflow.lock").write_text("[" * 100000 + "]" * 100000)


# the lock is untrusted input (issue 42): a lock from a pull request may say anything, and `trtflow toolchain` feeds
# `pip install -r`. Each edit below rehashes the entry's key, so only the value check can refuse it.


def _locked(kind: str, field: str, value: object, rehash: bool = True) -> Callable[[Path], None]:
    """Set fingerprint `field` of every `kind` entry of the lock to `value` (and its key to the components' hash)."""

    def edit(root: Path) -> None:
        from trtflow.hashing import stage_key

        data = json.loads((root / "trtflow.lock").read_text())
        for node, entry in data["nodes"].items():
            if node.startswith(kind + ":") and "key" in entry:
                entry["fingerprint"][field] = value
                if rehash:
                    components = {k: entry[k] for k in ("kind", "version", "params", "fingerprint", "inputs")}
                    entry["key"] = stage_key(components)
        (root / "trtflow.lock").write_text(json.dumps(data))

    return edit


TOOLCHAIN, DOCTOR, FROZEN = ("toolchain",), ("doctor",), ("run", "--frozen")
for name, value in [
    ("editable-install", "1.21.0\n-e /some/folder"),
    ("index-url", "1.21.0\n--index-url https://evil.example/simple"),
    ("another-requirements-file", "1.21.0\n-r /etc/passwd"),
    ("hash-option", "1.21.0 --hash=sha256:" + "0" * 64),
    ("environment-marker", '1.21.0; python_version < "1"'),
    ("terminal-escape", "1.21.0\x1b[2J\x1b]0;pwned\x07"),
]:
    for args in (TOOLCHAIN, DOCTOR, FROZEN):
        add(
            f"lock-version-{name}-{args[-1].strip('-')}",
            "built",
            args,
            3,
            "is not a",
            _locked("cleanup", "onnx", value),
        )
add(
    "lock-backend-with-a-command",
    "built",
    TOOLCHAIN,
    3,
    "is not a plain name",
    _locked("build", "backend", "tensorrt-rtx; touch pwned"),
)
add(
    "lock-backend-unknown",
    "built",
    TOOLCHAIN,
    3,
    "is not a backend of this trtflow",
    _locked("build", "backend", "tensorrt-rtz"),
)
add(
    "lock-version-not-pep440",
    "built",
    TOOLCHAIN,
    3,
    "is not a version (PEP 440)",
    _locked("cleanup", "onnx", "latest-and-greatest"),
)
add(
    "lock-entry-not-hashing-to-its-key",
    "built",
    FROZEN,
    3,
    "its key is not the hash of its components",
    _locked("build", "backend_version", "1.7.1.117", rehash=False),
)
add(
    "lock-output-digest-a-path",
    "built",
    FROZEN,
    3,
    "is not a sha256 digest",
    lambda root: (root / "trtflow.lock").write_text(
        (root / "trtflow.lock").read_text().replace('"engine": "', '"engine": "../../', 1)
    ),
)


# remote records ----------------------------------------------------------------------------------------------------

REMOTE = "remote"


def _remote_record(edit: Callable[[Path], None], node: str = "package:tiny") -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        key = json.loads((root / "trtflow.lock").read_text())["nodes"][node]["key"]
        edit(root / REMOTE / "records" / f"{key}.json")
        shutil.rmtree(root / STORE)  # a fresh machine: everything comes from the remote
        shutil.rmtree(root / "artifacts" / "packages")

    return apply


def _envelope(edit: Callable[[dict], None]) -> Callable[[Path], None]:
    def apply(path: Path) -> None:
        envelope = json.loads(path.read_text())
        edit(envelope)
        path.write_text(json.dumps(envelope))

    return apply


def _payload(edit: Callable[[dict], None]) -> Callable[[dict], None]:
    def apply(envelope: dict) -> None:
        record = json.loads(base64.b64decode(envelope["payload"]))
        edit(record)
        envelope["payload"] = base64.b64encode(json.dumps(record).encode()).decode()

    return apply


def _remote_object(root: Path) -> None:
    """Flip a byte of the package's manifest object on the remote."""
    digest = json.loads((root / "trtflow.lock").read_text())["nodes"]["package:tiny"]["outputs"]["manifest.json"]
    path = root / REMOTE / "objects" / digest[:2] / digest
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))
    shutil.rmtree(root / STORE)
    shutil.rmtree(root / "artifacts" / "packages")


REJECTED = "remote cache: rejected the record of package:tiny"
for name, edit, fragment in [
    ("remote-record-garbage", _remote_record(_replace_with(b"\x00garbage")), "it is not JSON"),
    (
        "remote-record-wrong-payload-type",
        _remote_record(_envelope(lambda e: e.update(payloadType="text/plain"))),
        "envelope",
    ),
    ("remote-record-payload-not-base64", _remote_record(_envelope(lambda e: e.update(payload="%%%"))), "base64"),
    (
        "remote-record-names-another-key",
        _remote_record(_envelope(_payload(lambda r: r.update(key="0" * 64)))),
        "it names another key",
    ),
    (
        "remote-record-outputs-traversal",
        _remote_record(_envelope(_payload(lambda r: r.update(outputs={"package": "../../etc/passwd"})))),
        "its outputs are not sha256 digests",
    ),
    (
        "remote-record-components-edited",
        _remote_record(_envelope(_payload(lambda r: r["components"].update(kind="evil")))),
        "do not hash to its key",
    ),
    (
        "remote-record-names-a-missing-object",
        _remote_record(_envelope(_payload(lambda r: r.update(outputs={"package": "0" * 64})))),
        "does not hold",
    ),
    ("remote-record-is-a-folder", _remote_record(lambda p: (p.unlink(), p.mkdir())), "package:tiny"),
    ("remote-object-bytes-differ", _remote_object, "does not match its sha256"),
]:
    add(name, "remote", RUN, 0, fragment, edit)


# the other commands that read the store meet the same damage: no traceback, the same recovery
for command, code in [(("plan",), 0), (("cache", "verify"), 1), (("cache", "gc"), 0), (("cache", "ls"), 0)]:
    name = "-".join(command)
    add(f"record-garbage-under-{name}", "built", command, code, SET_ASIDE, _records(_replace_with(b"\x00\xffgarbage")))
    uses_cache = command in (("plan",), ("cache", "gc"))  # ls and verify never read the cache: nothing to start anew
    add(
        f"cache-not-a-database-under-{name}",
        "built",
        command,
        0,
        CACHE_RESET if uses_cache else "",
        _cache(_flip_header),
    )


# issue 23: links, FIFOs and crafted JSON where a writer of the store, the remote, a package or a destination puts them.
# Every case runs beside a decoy folder (DECOY, outside the project) that must come out unchanged and unread.


def _decoy(root: Path) -> Path:
    return root.parent / DECOY_NAME


def _store_link(sub: str) -> Callable[[Path], None]:
    """Replace the store's `sub` (a folder path such as tmp or objects/ab) by a symlink to the decoy folder."""

    def edit(root: Path) -> None:
        path = root / STORE / sub
        if path.is_dir():
            shutil.rmtree(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.symlink_to(_decoy(root), target_is_directory=True)

    return edit


def _first_object_folder(root: Path) -> str:
    return "objects/" + sorted(p.name for p in (root / STORE / "objects").iterdir())[0]


def _object_folder_link(root: Path) -> None:
    _store_link(_first_object_folder(root))(root)


def _engine_record_names_decoy(kind: str) -> Callable[[Path], None]:
    """objects/<aa>/<S> made a symlink (or FIFO) to an outside file whose sha256 is S, and the fp32 rtx-ada engine's
    record
    naming S: the bytes must never be read, let alone shipped."""

    def edit(root: Path) -> None:
        import hashlib

        digest = hashlib.sha256(DECOY_BYTES).hexdigest()
        path = root / STORE / "objects" / digest[:2] / digest
        path.parent.mkdir(parents=True, exist_ok=True)
        if kind == "link":
            path.symlink_to(_decoy(root) / "engine.bin")
        else:
            os.mkfifo(path)
        key = json.loads((root / "trtflow.lock").read_text())["nodes"]["build:tiny/fp32/rtx-ada"]["key"]
        record_path = root / STORE / "records" / key[:2] / f"{key}.json"
        record = json.loads(record_path.read_text())
        record["outputs"] = {name: digest for name in record["outputs"]}
        record_path.unlink()
        record_path.write_text(json.dumps(record))
        shutil.rmtree(root / "artifacts" / "packages")
        (root / "trtflow.lock").unlink()
        shutil.rmtree(root / ".trtflow", ignore_errors=True)

    return edit


NOT_FOLLOWED = "never followed it"
GC = ("cache", "gc", "--yes")
for name, edit, args, code, fragment in [
    ("store-corrupt-symlink-to-outside-under-gc", _store_link("corrupt"), GC, 0, NOT_FOLLOWED),
    ("store-tmp-symlink-to-outside-under-gc", _store_link("tmp"), GC, 0, NOT_FOLLOWED),
    ("store-exchange-symlink-to-outside-under-gc", _store_link("exchange"), GC, 0, NOT_FOLLOWED),
    ("store-locks-symlink-to-outside-under-gc", _store_link("locks"), GC, 0, ""),
    ("store-object-folder-symlink-under-verify", _object_folder_link, ("cache", "verify"), 1, NOT_FOLLOWED),
    ("store-object-folder-symlink-under-gc", _object_folder_link, GC, 0, NOT_FOLLOWED),
    ("store-records-symlink-to-outside-under-run", _store_link("records"), RUN, 0, NOT_FOLLOWED),
    ("store-locks-symlink-to-outside-under-run", _store_link("locks"), ("run", "--force"), 0, NOT_FOLLOWED),
    ("object-symlink-to-outside-file-with-its-digest", _engine_record_names_decoy("link"), RUN, 0, NOT_FOLLOWED),
    (
        "object-symlink-to-outside-file-under-verify",
        _engine_record_names_decoy("link"),
        ("cache", "verify"),
        1,
        NOT_FOLLOWED,
    ),
    ("object-fifo-under-run", _engine_record_names_decoy("fifo"), RUN, 0, NOT_FOLLOWED),
    ("object-fifo-under-verify", _engine_record_names_decoy("fifo"), ("cache", "verify"), 1, NOT_FOLLOWED),
]:
    add(name, "built", args, code, fragment, edit)


def _trusting(edit: Callable[[Path], None]) -> Callable[[Path], None]:
    """The remote project with `cache.trust` set to a fresh key, then `edit`."""

    def apply(root: Path) -> None:
        from trtflow.signing import generate_key_pair

        (root / "keys").mkdir()
        generate_key_pair(root / "keys" / "ci")
        text = (
            (root / "pipeline.yaml").read_text().replace("cache: {remote: ", "cache: {trust: [keys/ci.pub], remote: ")
        )
        (root / "pipeline.yaml").write_text(text)
        edit(root)

    return apply


DEEP = b"[" * 200000 + b"]" * 200000
for name, edit, fragment in [
    (
        "remote-record-keyid-a-list",
        _trusting(_remote_record(_envelope(lambda e: e.update(signatures=[{"keyid": ["a"], "sig": ""}])))),
        "signed by no trusted key",
    ),
    (
        "remote-record-keyid-an-object",
        _trusting(_remote_record(_envelope(lambda e: e.update(signatures=[{"keyid": {"a": 1}}])))),
        "signed by no trusted key",
    ),
    ("remote-record-deep-json", _remote_record(_replace_with(DEEP)), "nested deeper than 64 levels"),
    ("remote-record-deep-json-trusted", _trusting(_remote_record(_replace_with(DEEP))), "nested deeper than 64 levels"),
]:
    add(name, "remote", RUN, 0, fragment, edit)


PROVENANCE = "artifacts/packages/tiny.intoto.jsonl"
SIGNED_PROVISION = PROVISION + ("--require-signature", "--trust", "{root}/keys/ci.pub")


def _with_key(edit: Callable[[Path], None]) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        from trtflow.signing import generate_key_pair

        (root / "keys").mkdir()
        generate_key_pair(root / "keys" / "ci")
        edit(root)

    return apply


def _provenance_envelope(signatures: list) -> Callable[[Path], None]:
    envelope = {
        "payloadType": "application/vnd.in-toto+json",
        "payload": base64.b64encode(b"{}").decode(),
        "signatures": signatures,
    }
    return write(PROVENANCE, json.dumps(envelope) + "\n")


for name, edit, fragment in [
    ("provenance-deep-json", _with_key(write(PROVENANCE, DEEP + b"\n")), "nested deeper than 64 levels"),
    (
        "provenance-keyid-an-object",
        _with_key(_provenance_envelope([{"keyid": {"a": 1}, "sig": ""}])),
        "signed by no trusted key",
    ),
    (
        "provenance-keyid-a-list",
        _with_key(_provenance_envelope([{"keyid": ["a"], "sig": ""}])),
        "signed by no trusted key",
    ),
]:
    add(name, "built", SIGNED_PROVISION, 3, fragment, edit)


def _dims(value: int) -> Callable[[dict], None]:
    def edit(manifest: dict) -> None:
        for engine in manifest["engines"]:
            engine["backend"] = "tensorrt"  # Triton refuses TensorRT-RTX engines before it reads their shapes
            engine["tensors"][0]["shape"][0] = value

    return edit


TRITON = ("export", "triton", "{root}/" + PACKAGE, "--repo", "{root}/triton")
ORT = ("export", "ort-context", "{root}/" + PACKAGE, "--dest", "{root}/ort")
NOT_MANIFEST = "not a trtflow manifest"
for name, edit, args, fragment in [
    ("export-triton-dimension-beyond-int64", _manifest(_dims(10**30)), TRITON, NOT_MANIFEST),
    ("export-ort-context-dimension-beyond-int64", _manifest(_dims(10**30)), ORT, NOT_MANIFEST),
    (
        "export-triton-compute-capability-sm_9x",
        _manifest(_engine_field("compute_capabilities", ["sm_9x"])),
        TRITON,
        NOT_MANIFEST,
    ),
    (
        "export-ort-context-compute-capability-sm_9x",
        _manifest(_engine_field("compute_capabilities", ["sm_9x"])),
        ORT,
        NOT_MANIFEST,
    ),
    (
        "export-triton-target-traversal",
        _manifest(_engine_field("target", "../../../../../decoy/evil")),
        TRITON,
        NOT_MANIFEST,
    ),
    (
        "export-ort-context-target-traversal",
        _manifest(_engine_field("target", "../../../../../decoy/evil")),
        ORT,
        NOT_MANIFEST,
    ),
    (
        "provision-target-traversal",
        _manifest(_engine_field("target", "../../../../../decoy/evil")),
        PROVISION,
        NOT_MANIFEST,
    ),
]:
    add(name, "built", args, 3, fragment, edit)


def _destination_link(relative: str) -> Callable[[Path], None]:
    """A symlink to the decoy (folder, or its file) where an export, publish or provision writes."""

    def edit(root: Path) -> None:
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        target = (
            _decoy(root) / "engine.bin"
            if relative.endswith((".engine", ".json", ".plan", ".onnx", ".pbtxt"))
            else _decoy(root)
        )
        path.symlink_to(target)

    return edit


def _version_folder_link(root: Path) -> None:
    sha = json.loads((root / PACKAGE / "manifest.json").read_text())["engines"][1]["sha256"]
    _destination_link(f"dest/tiny/{sha}")(root)


PUBLISH = ("publish", "{root}/" + PACKAGE, "file://{root}/published")
LINKED = "is a symlink; refusing to write through it"


def _published_engine_link(root: Path) -> None:
    """(Issue 29: engines are published as engines/<sha256>.engine; the link sits where the first one goes.)"""
    sha = json.loads((root / PACKAGE / "manifest.json").read_text())["engines"][0]["sha256"]
    _destination_link(f"published/engines/{sha}.engine")(root)


for name, edit, args, code, fragment in [
    ("publish-engine-name-is-a-symlink", _published_engine_link, PUBLISH, 3, LINKED),
    ("publish-engines-folder-is-a-symlink", _destination_link("published/engines"), PUBLISH, 3, LINKED),
    ("publish-channel-is-a-symlink", _destination_link("published/channels/stable.json"), PUBLISH, 3, LINKED),
    ("publish-versions-folder-is-a-symlink", _destination_link("published/versions"), PUBLISH, 3, LINKED),
    ("export-ort-context-output-is-a-symlink", _destination_link("ort/tiny-rtx-ada-fp32_ctx.onnx"), ORT, 3, LINKED),
    ("export-ort-context-engine-is-a-symlink", _destination_link("ort/tiny-rtx-ada-fp32.engine"), ORT, 3, LINKED),
    (
        "provision-recipe-folder-is-a-symlink",
        _destination_link("dest/tiny"),
        PROVISION,
        3,
        "refusing to install through it",
    ),
    ("provision-version-folder-is-a-symlink", _version_folder_link, PROVISION, 0, "installed"),
]:
    add(name, "built", args, code, fragment, edit)


# channels, versions and device reports of a published remote (issue 29)
# ------------------------------------------------

REMOTE_PROVISION = ("provision", "file://{root}/published", "--gpu", "sm_89", "--dest", "{root}/dest")
AGENT = (
    "agent",
    "file://{root}/published",
    "--once",
    "--gpu",
    "sm_89",
    "--dest",
    "{root}/dest",
    "--device-id",
    "cam-1",
)


def _published(edit: Callable[[Path], None]) -> Callable[[Path], None]:
    """Publish the built package to {root}/published (channel stable), then `edit(published folder)`."""

    def apply(root: Path) -> None:
        from trtflow.deploy.channels import publish_version

        publish_version(root / PACKAGE, (root / "published").as_uri(), None)
        edit(root / "published")

    return apply


def _channel(**fields) -> Callable[[Path], None]:
    def edit(published: Path) -> None:
        path = published / "channels" / "stable.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))

    return edit


def _version_with_engine_sha(value: str) -> Callable[[Path], None]:
    """A new, self-consistent version (its digest matches its bytes) whose engines' sha256 is `value`; the channel
    names it."""

    def edit(published: Path) -> None:
        (old,) = [p for p in (published / "versions").iterdir()]
        manifest = json.loads((old / "manifest.json").read_text())
        for engine in manifest["engines"]:
            engine["sha256"] = value
        data = json.dumps(manifest).encode()
        version = hashlib.sha256(data).hexdigest()
        (published / "versions" / version).mkdir()
        (published / "versions" / version / "manifest.json").write_bytes(data)
        _channel(history=[version])(published)

    return edit


def _replaced(relative: str, data: bytes) -> Callable[[Path], None]:
    def edit(published: Path) -> None:
        (published / relative).parent.mkdir(parents=True, exist_ok=True)
        (published / relative).write_bytes(data)

    return edit


def _dest_file(relative: str, data: bytes | None) -> Callable[[Path], None]:
    """A file (or, data None, a link to the decoy's file) planted in the destination before the command."""

    def edit(root: Path) -> None:
        path = root / "dest" / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.symlink_to(_decoy(root) / "engine.bin") if data is None else path.write_bytes(data)

    return edit


def _both(*edits: Callable[[Path], None]) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        for edit in edits:
            edit(root)

    return apply


for name, edit, args, code, fragment in [
    ("channel-history-traversal", _published(_channel(history=["../.."])), REMOTE_PROVISION, 3, "sha256 digests"),
    (
        "channel-history-a-path-to-the-decoy",
        _published(_channel(history=["../../../decoy"])),
        REMOTE_PROVISION,
        3,
        "sha256 digests",
    ),
    ("channel-huge-share", _published(_channel(share_bp=10**30)), REMOTE_PROVISION, 3, "share_bp"),
    ("channel-share-a-string", _published(_channel(share_bp="100%")), REMOTE_PROVISION, 3, "share_bp"),
    (
        "channel-deep-json",
        _published(_replaced("channels/stable.json", b"[" * 5000 + b"]" * 5000)),
        REMOTE_PROVISION,
        3,
        "nested deeper",
    ),
    (
        "channel-huge",
        _published(_replaced("channels/stable.json", b" " * (1 << 20))),
        REMOTE_PROVISION,
        4,
        "larger than",
    ),
    (
        "version-engine-sha-is-a-path",
        _published(_version_with_engine_sha("../../../../decoy/engine.bin")),
        REMOTE_PROVISION,
        3,
        "is not a sha256 digest",
    ),
    (
        "version-manifest-edited-in-place",
        _published(lambda p: [m.write_bytes(m.read_bytes() + b" ") for m in (p / "versions").glob("*/manifest.json")]),
        REMOTE_PROVISION,
        3,
        "its sha256 is not the version",
    ),
    (
        "agent-status-json-bomb",
        _both(_published(lambda p: None), _dest_file("status.json", b"[" * 30000 + b"]" * 30000)),
        AGENT,
        0,
        "installed",
    ),
    (
        "agent-status-json-is-a-symlink",
        _both(_published(lambda p: None), _dest_file("status.json", None)),
        AGENT,
        0,
        "installed",
    ),
    (
        "agent-lock-is-a-symlink",
        _both(_published(lambda p: None), _dest_file(".agent.lock", None)),
        AGENT,
        3,
        "not a regular file",
    ),
    (
        "fleet-report-bomb",
        _published(_replaced("devices/cam-1.json", b"[" * 30000 + b"]" * 30000)),
        ("fleet", "status", "file://{root}/published"),
        0,
        "report set aside: cam-1.json: it is nested deeper",
    ),
]:
    add(name, "built", args, code, fragment, edit)


# issue 42: what a remote holds is untrusted; a FIFO never hangs a reader, a leftover temporary file never stops gc


def _fifo(relative: str) -> Callable[[Path], None]:
    """Replace one file of the published remote by a FIFO nobody writes to (an open of it for reading blocks)."""

    def edit(published: Path) -> None:
        for path in published.glob(relative) if "*" in relative else [published / relative]:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.unlink(missing_ok=True)
            os.mkfifo(path)

    return edit


GC = ("remote", "gc", "file://{root}/published", "--keep", "2", "--grace", "0", "--yes")
STATUS = ("fleet", "status", "file://{root}/published")
for name, edit, args, code, fragment in [
    ("channel-is-a-fifo", _published(_fifo("channels/stable.json")), REMOTE_PROVISION, 3, "not a regular file"),
    ("channel-is-a-fifo-under-agent", _published(_fifo("channels/stable.json")), AGENT, 3, "not a regular file"),
    ("version-manifest-is-a-fifo", _published(_fifo("versions/*/manifest.json")), REMOTE_PROVISION, 3, "not a regular"),
    ("engine-is-a-fifo", _published(_fifo("engines/*.engine")), REMOTE_PROVISION, 3, "not a regular file"),
    ("fleet-report-is-a-fifo", _published(_fifo("devices/cam-1.json")), STATUS, 0, "cam-1.json: "),
    (
        "remote-gc-with-a-leftover-channel-temp",
        _published(_replaced("channels/.stable.json.0123abcd.tmp", b"{half a chan")),
        GC,
        0,
        "channels/.stable.json.0123abcd.tmp",
    ),
    (
        "remote-gc-with-a-leftover-report-temp",
        _published(_replaced("devices/.cam-1.json.0123abcd.tmp", b"{")),
        GC,
        0,
        "devices/.cam-1.json.0123abcd.tmp",
    ),
    (
        "fleet-report-temp-is-not-a-report",
        _published(_replaced("devices/.cam-1.json.0123abcd.tmp", b"{")),
        STATUS,
        0,
        "channel",
    ),
]:
    add(name, "built", args, code, fragment, edit)

add(
    "export-ort-context-recipe-name-of-300-characters",
    "built",
    ORT,
    3,
    NOT_MANIFEST,
    _manifest(lambda m: m.update(recipe="r" * 300)),
)
add(
    "recipe-profile-of-absurd-volume",
    "fresh",
    VALIDATE,
    3,
    "more than 2147483647",
    write(
        RECIPE,
        TINY_RECIPE.replace("max: [8, 3, 32, 32]", "max: [2147483647, 3, 32, 32]"),
    ),
)


def _triton_link(relative: str) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        _manifest(lambda m: [e.update(backend="tensorrt") for e in m["engines"]])(root)
        _destination_link(relative)(root)

    return apply


for name, relative in [
    ("export-triton-model-folder-is-a-symlink", "triton/tiny"),
    ("export-triton-version-folder-is-a-symlink", "triton/tiny/1"),
    ("export-triton-config-is-a-symlink", "triton/tiny/config.pbtxt"),
]:
    add(name, "built", TRITON, 3, LINKED, _triton_link(relative))

add(
    "pipeline-endpoint-url-with-credentials",
    "fresh",
    VALIDATE,
    3,
    "options.endpoint_url: credentials do not belong",
    write(
        "pipeline.yaml",
        PIPELINE + "cache: {remote: 's3://b/p', options: {endpoint_url: 'https://user:pw@minio:9000'}}\n",
    ),
)


# the runner --------------------------------------------------------------------------------------------------------

SENTINEL_NAME = "sentinel.txt"


@pytest.fixture(scope="module")
def bases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One project per base, built once; each case works on a copy."""
    folder = tmp_path_factory.mktemp("bases")
    built = write_project(folder / "built")
    assert trtflow(built, "run").code == 0
    remote = write_project(
        folder / "remote", pipeline=PIPELINE + f"cache: {{remote: '{(folder / 'remote' / REMOTE).as_uri()}'}}\n"
    )
    assert trtflow(remote, "run").code == 0
    int8 = write_project(folder / "int8", {"tiny": INT8_RECIPE})
    (int8 / "calib").mkdir()
    for index in range(4):
        np.save(
            int8 / "calib" / f"batch_{index:02d}.npy",
            np.random.default_rng(index).random((2, 3, 32, 32), dtype=np.float32),
        )
    return {"built": built, "remote": remote, "int8": int8}


def project_for(base: str, bases: dict[str, Path], tmp_path: Path) -> Path:
    root = tmp_path / "case" / "proj"
    if base == "fresh":
        write_project(root)
    else:
        shutil.copytree(bases[base], root, symlinks=True)
        if base == "remote":  # the remote's URL names the base's folder: point it at the copy
            text = (root / "pipeline.yaml").read_text()
            (root / "pipeline.yaml").write_text(text.replace(bases[base].as_uri(), root.as_uri()))
    return root


def test_the_corpus_is_large_enough() -> None:
    kinds = {name.split("-")[0] for name in CASES}
    assert len(CASES) >= 80 and kinds >= {
        "pipeline",
        "recipe",
        "model",
        "calibration",
        "package",
        "archive",
        "record",
        "cache",
        "remote",
    }


@pytest.mark.parametrize("name", sorted(CASES))
def test_hostile_input(name: str, bases: dict[str, Path], tmp_path: Path) -> None:
    spec = CASES[name]
    root = project_for(spec.base, bases, tmp_path)
    sentinel = tmp_path / "case" / SENTINEL_NAME
    sentinel.write_text("must survive")
    decoy = make_decoy(tmp_path / "case" / DECOY_NAME)
    spec.edit(root)
    result = trtflow(root, *(arg.format(root=root) for arg in spec.args))
    shown = f"{name}: exit {result.code}\nstdout: {result.out[-2000:]}\nstderr: {result.err[-2000:]}"
    assert "Traceback" not in result.out + result.err, shown
    assert result.code == spec.code, shown
    if spec.code in (2, 3, 4, 5):  # refused: one line says why (no engine fits: then one line per engine)
        lines = [line for line in result.err.splitlines() if line.startswith("error: ")]
        assert (len(lines) == 1 or spec.code == 5) and spec.fragment in lines[0], shown
    else:
        assert spec.fragment in result.out + result.err, shown
    assert sentinel.read_text() == "must survive", shown
    assert not list(tmp_path.glob("case/pwned*")) and not (root / "pwned").exists()
    assert tree(decoy) == DECOY_TREE, shown  # nothing outside changed, moved or was added
    shipped = [
        p
        for p in (root / "artifacts").rglob("*")
        if p.is_file() and not p.is_symlink() and DECOY_BYTES in p.read_bytes()
    ]
    # no outside bytes were packaged
    assert not [p for p in shipped if "store" not in p.relative_to(root).parts[:2]], shown
