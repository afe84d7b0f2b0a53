"""Plugin libraries as declared inputs (`build: {plugins: [...]}`), with real shared libraries compiled here.

TensorRT-RTX 1.7.1 loads a plugin library only if it exports the V3 interface (`setLoggerFinder`, `getCreators`)
and returns at least one creator. No TensorRT headers are installed, so the library below declares the few
classes it needs itself, ABI-compatible with NvInferRuntime.h: one IPluginCreatorV3One that registers a name and
creates nothing. TensorRT-RTX registers it on this CPU machine and the build succeeds (the engine of a network
that uses none of its ops is byte-identical to one built without it: measured).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import TINY_RECIPE, trtflow, write_project

pytest.importorskip("tensorrt_rtx")

CREATOR = r"""
#include <cstdint>
namespace nvinfer1 {
struct InterfaceInfo { const char* kind; int32_t major; int32_t minor; };
struct PluginFieldCollection { int32_t nbFields; const void* fields; };
class IVersionedInterface {
public:
    virtual int32_t getAPILanguage() const noexcept { return 0; }
    virtual InterfaceInfo getInterfaceInfo() const noexcept = 0;
    virtual ~IVersionedInterface() noexcept = default;
};
class IPluginCreatorInterface : public IVersionedInterface {};
}
class Creator : public nvinfer1::IPluginCreatorInterface {
public:
    nvinfer1::InterfaceInfo getInterfaceInfo() const noexcept override { return {"PLUGIN CREATOR_V3ONE", 1, 0}; }
    virtual void* createPlugin(const char*, const nvinfer1::PluginFieldCollection*, int32_t) noexcept {
        return nullptr;
    }
    virtual const nvinfer1::PluginFieldCollection* getFieldNames() noexcept { return &fields; }
    virtual const char* getPluginName() const noexcept { return PLUGIN_NAME; }
    virtual const char* getPluginVersion() const noexcept { return "1"; }
    virtual const char* getPluginNamespace() const noexcept { return ""; }
    nvinfer1::PluginFieldCollection fields{0, nullptr};
};
static Creator creator;
static nvinfer1::IPluginCreatorInterface* creators[] = {&creator};
extern "C" void setLoggerFinder(void*) {}
extern "C" nvinfer1::IPluginCreatorInterface* const* getCreators(int32_t& count) { count = 1; return creators; }
"""
NOT_A_PLUGIN = "int answer(void) { return 42; }\n"  # a shared library without the plugin interface
RTX_ADA = TINY_RECIPE.replace("[rtx-ampere, rtx-ada]", "[rtx-ada]")
WITH_PLUGIN = RTX_ADA + "build: {plugins: [libs/libnoop.so]}\n"


def _compile(compiler: str, source: str, suffix: str, out: Path, *defines: str) -> Path:
    found = shutil.which(compiler)
    if found is None:
        pytest.skip(f"no {compiler} compiler: plugin libraries are compiled at test time")
    src = out.with_suffix(suffix)
    src.write_text(source)
    subprocess.run([found, "-shared", "-fPIC", *defines, "-o", str(out), str(src)], check=True, capture_output=True)
    return out


@pytest.fixture(scope="module")
def libs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """`a` and `b`: two plugin libraries TensorRT accepts (different bytes); `bad`: a library without the interface."""
    folder = tmp_path_factory.mktemp("libs")
    return {
        "a": _compile("c++", CREATOR, ".cpp", folder / "a.so", '-DPLUGIN_NAME="TrtflowNoopA"'),
        "b": _compile("c++", CREATOR, ".cpp", folder / "b.so", '-DPLUGIN_NAME="TrtflowNoopB"'),
        "bad": _compile("cc", NOT_A_PLUGIN, ".c", folder / "bad.so"),
    }


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, libs: dict[str, Path]) -> Path:
    """Two recipes, one declaring libs/libnoop.so (carried by its package), built once per module."""
    root = write_project(
        tmp_path_factory.mktemp("plugins") / "proj",
        {"tiny": WITH_PLUGIN + "package: {plugins: carry}\n", "other": RTX_ADA},
    )
    (root / "libs").mkdir()
    shutil.copy(libs["a"], root / "libs" / "libnoop.so")
    result = trtflow(root, "run")
    assert result.code == 0, result.err
    return root


@pytest.fixture
def project(built: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(built, tmp_path / "proj", symlinks=True))


def _ran(result) -> set[str]:
    """The stages a run built (its progress goes to stderr)."""
    return {line.split()[1] for line in (result.out + result.err).splitlines() if line.startswith("built ")}


def _manifest(root: Path, recipe: str) -> dict:
    return json.loads((root / "artifacts" / "packages" / recipe / "manifest.json").read_text())


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_changed_plugin_rebuilds_exactly_the_engines_that_declare_it(project: Path, libs: dict[str, Path]) -> None:
    shutil.copy(libs["b"], project / "libs" / "libnoop.so")
    explained = trtflow(project, "plan", "--explain").out
    assert f"input plugin:libnoop.so changed ({_sha256(libs['a'])[:12]} -> {_sha256(libs['b'])[:12]})" in explained
    result = trtflow(project, "run")
    assert result.code == 0, result.err
    assert _ran(result) == {"build:tiny/fp32/rtx-ada", "verify:tiny/fp32/rtx-ada", "package:tiny"}
    assert _manifest(project, "tiny")["engines"][0]["plugins"][0]["sha256"] == _sha256(libs["b"])


def test_the_path_is_not_in_the_key_moving_the_library_rebuilds_nothing(project: Path) -> None:
    (project / "vendor").mkdir()
    (project / "libs" / "libnoop.so").rename(project / "vendor" / "libnoop.so")
    recipe = project / "recipes" / "tiny.yaml"
    recipe.write_text(recipe.read_text().replace("libs/libnoop.so", "vendor/libnoop.so"))
    result = trtflow(project, "run")
    assert result.code == 0 and _ran(result) == set(), result.err


def test_the_manifest_lists_each_plugin_and_a_carried_one_is_packed(built: Path, libs: dict[str, Path]) -> None:
    sha = _sha256(libs["a"])
    entry = _manifest(built, "tiny")["engines"][0]
    assert entry["plugins"] == [
        {"name": "libnoop.so", "sha256": sha, "size": libs["a"].stat().st_size, "carried": True}
    ]
    package = built / "artifacts" / "packages" / "tiny"
    assert _sha256(package / "plugins" / f"{sha}-libnoop.so") == sha
    assert f"{sha}  plugins/{sha}-libnoop.so" in (package / "SHA256SUMS").read_text()
    project_file = built / "libs" / "libnoop.so"  # packed as a copy: the project's file is never a store object
    assert project_file.stat().st_nlink == 1 and os.access(project_file, os.W_OK)
    assert "plugins" not in _manifest(built, "other")["engines"][0]  # no plugin: the manifest as before plugins existed


def test_provision_installs_a_carried_plugin_beside_the_engine(
    built: Path, tmp_path: Path, libs: dict[str, Path]
) -> None:
    sha = _sha256(libs["a"])
    result = trtflow(
        built,
        "provision",
        str(built / "artifacts/packages/tiny"),
        "--gpu",
        "sm_89",
        "--dest",
        str(tmp_path / "dest"),
        "--json",
    )
    assert result.code == 0, result.err
    record = json.loads(result.out)
    installed = Path(record["written"]["version"]) / "plugins" / f"{sha}-libnoop.so"
    assert record["written"]["plugins"] == [str(installed)] and _sha256(installed) == sha
    on_disk = json.loads((Path(record["written"]["version"]) / "provision.json").read_text())
    assert on_disk["plugins"] == [
        {
            "name": "libnoop.so",
            "sha256": sha,
            "size": installed.stat().st_size,
            "source": "package",
            "file": f"plugins/{sha}-libnoop.so",
        }
    ]


def test_provision_refuses_an_engine_whose_plugin_the_device_lacks(
    project: Path, tmp_path: Path, libs: dict[str, Path]
) -> None:
    recipe = project / "recipes" / "tiny.yaml"
    recipe.write_text(recipe.read_text().replace("package: {plugins: carry}\n", ""))
    assert _ran(trtflow(project, "run")) == {"package:tiny"}  # carrying or not: only the package changes
    assert not (project / "artifacts/packages/tiny/plugins").exists()
    args = ["provision", str(project / "artifacts/packages/tiny"), "--gpu", "sm_89", "--dest", str(tmp_path / "dest")]
    devices = tmp_path / "device-plugins"
    devices.mkdir()
    shutil.copy(libs["b"], devices / "libnoop.so")  # the same name, other bytes: not this engine's plugin
    refused = trtflow(project, *args, "--plugin-dir", str(devices))
    assert refused.code == 5
    assert f"needs plugin libnoop.so sha256 {_sha256(libs['a'])}: not in --plugin-dir and not carried" in refused.err
    assert "--plugin-dir" in refused.err.splitlines()[-1]
    shutil.copy(libs["a"], devices / "libnoop.so.1")
    chosen = trtflow(project, *args, "--plugin-dir", str(devices), "--json")
    assert chosen.code == 0, chosen.err
    assert json.loads(chosen.out)["plugins"][0] | {"path": "?"} == {
        "name": "libnoop.so",
        "sha256": _sha256(libs["a"]),
        "size": libs["a"].stat().st_size,
        "source": "plugin-dir",
        "path": "?",
    }
    assert json.loads(chosen.out)["plugins"][0]["path"] == str((devices / "libnoop.so.1").resolve())


def test_the_choice_falls_to_an_engine_whose_plugins_the_device_has(built: Path) -> None:
    from trtflow.deploy.provision import choose, device_from_options
    from trtflow.manifest import Manifest

    manifest = Manifest.model_validate(_manifest(built, "tiny"))
    needing = manifest.engines[0].model_copy(
        update={"precision": "fp16", "plugins": [manifest.engines[0].plugins[0].model_copy(update={"carried": False})]}
    )
    plain = manifest.engines[0].model_copy(update={"plugins": []})
    mixed = manifest.model_copy(update={"engines": [needing, plain]})
    chosen, others = choose(mixed, device_from_options("sm_89", mixed))
    assert chosen.engine.precision == "fp32"  # fp16 is preferred, but its plugin is nowhere
    assert others[0][1].startswith("needs plugin libnoop.so sha256 ") and others[0][1].endswith(
        "no --plugin-dir given and not carried"
    )


def test_a_library_tensorrt_refuses_fails_the_build_in_one_line_and_is_recorded(
    tmp_path: Path, libs: dict[str, Path]
) -> None:
    root = write_project(tmp_path / "proj", {"tiny": RTX_ADA + "build: {plugins: [libbad.so]}\n"})
    shutil.copy(libs["bad"], root / "libbad.so")
    first = trtflow(root, "run")
    reason = "plugin library libbad.so: TensorRT refused it: SymbolAddress for getCreators could not be loaded"
    assert first.code == 1 and reason in first.out + first.err, first.out + first.err
    again = trtflow(root, "run")
    assert again.code == 1 and reason in again.out + again.err and "failed (cached)" in again.out + again.err


@pytest.mark.parametrize(
    "given, message",
    [
        ("libs/none.so", "recipes/tiny.yaml:8: build.plugins[0]: plugin library not found: libs/none.so"),
        ("libs", "recipes/tiny.yaml:8: build.plugins[0]: libs is not a regular file"),
        (
            "../outside.so",
            "recipes/tiny.yaml:8: build.plugins[0]: ../outside.so is outside the project; write an absolute path",
        ),
        (
            "libs/a.so, vendor/a.so",
            "recipes/tiny.yaml:8: build.plugins[1]: another plugin library of this recipe is also named a.so",
        ),
        ("libs/a.so, libs/a.so", "recipes/tiny.yaml:8: build.plugins: a plugin library is listed twice"),
    ],
)
def test_plugins_are_checked_when_the_recipe_loads(tmp_path: Path, given: str, message: str) -> None:
    root = write_project(tmp_path / "proj", {"tiny": TINY_RECIPE + f"build: {{plugins: [{given}]}}\n"})
    for folder in ("libs", "vendor"):
        (root / folder).mkdir()
        (root / folder / "a.so").write_bytes(b"\x7fELF")
    (tmp_path / "outside.so").write_bytes(b"\x7fELF")
    result = trtflow(root, "validate")
    assert result.code == 3 and len(result.err.splitlines()) == 1 and result.err.startswith(f"error: {message}"), (
        result.err
    )


def test_an_absolute_path_outside_the_project_is_the_users_choice(tmp_path: Path, libs: dict[str, Path]) -> None:
    root = write_project(tmp_path / "proj", {"tiny": RTX_ADA + f"build: {{plugins: ['{libs['a']}']}}\n"})
    result = trtflow(root, "plan")
    assert result.code == 0, result.err
