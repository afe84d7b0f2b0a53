"""Architecture rules that keep the core usable without the CLI and the no-op run cheap."""

from __future__ import annotations

import functools
import importlib
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "trtflow"
# Leaves import nothing above them: only each other (a package may import itself).
LEAVES = ("errors", "hashing", "manifest", "recipe", "signing", "states", "store", "util")
HEAVY = (
    "onnx",
    "onnxruntime",
    "tensorrt",
    "tensorrt_rtx",
    "torch",
    "rich",
    "numpy",
    "fsspec",
    "s3fs",
    "filelock",
    "cryptography",
)


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")


MODULES = {_module_name(p): p for p in PACKAGE.rglob("*.py")}


@functools.cache
def _architecture():
    """tools/architecture.py: the layers, and the measures the closing checks print."""
    spec = importlib.util.spec_from_file_location("architecture", PACKAGE.parent / "tools" / "architecture.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _trtflow_imports(path: Path) -> set[str]:
    """Every trtflow module a file imports: at module level, inside functions or under TYPE_CHECKING."""
    return set(_architecture().imports(path, MODULES))


def _top(module: str) -> str:
    """trtflow.store.locks -> store; trtflow -> ''."""
    return module.split(".")[1] if "." in module else ""


@pytest.mark.parametrize("module", sorted(MODULES))
def test_nothing_imports_the_cli(module: str) -> None:
    if _top(module) != "cli" and module != "trtflow.__main__":
        assert not {m for m in _trtflow_imports(MODULES[module]) if _top(m) == "cli"}


@pytest.mark.parametrize("module", sorted(m for m in MODULES if _top(m) in LEAVES))
def test_leaves_import_only_other_leaves(module: str) -> None:
    assert {_top(m) for m in _trtflow_imports(MODULES[module])} <= set(LEAVES) | {""}


def test_every_leaf_exists() -> None:
    assert {_top(m) for m in MODULES} >= set(LEAVES)


def test_backends_never_see_recipes() -> None:
    for module, path in MODULES.items():
        if module.startswith("trtflow.backends"):
            assert not {
                m for m in _trtflow_imports(path) if m in ("trtflow.recipe", "trtflow.run.dag", "trtflow.run.runner")
            }


def test_planning_imports_no_heavy_library() -> None:
    """A no-op run must not pay for onnx, TensorRT or torch: plan and the CLI import none of them."""
    code = (
        "import sys, trtflow.cli, trtflow.services.running, trtflow.run.session; "
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


COMMANDS = [
    "validate",
    "plan",
    "run",
    "report",
    "inspect",
    "schema",
    "provision",
    "keygen",
    "cache",
    "cache ls",
    "cache verify",
    "cache gc",
    "publish",
    "promote",
    "rollback",
    "agent",
    "fleet",
    "fleet status",
    "remote",
    "remote gc",
    "toolchain",
    "doctor",
]


@pytest.mark.parametrize("command", [[], *[c.split() for c in COMMANDS]])
def test_every_command_has_help(command: list[str]) -> None:
    result = subprocess.run([sys.executable, "-m", "trtflow", *command, "--help"], capture_output=True, text=True)
    assert result.returncode == 0 and "Usage:" in result.stdout


# What the CLI may import besides the services: the error classes (exit codes), the status words, text helpers,
# and the few formatting and key-file helpers it prints with.
CLI_MAY_IMPORT = {"errors", "states", "util", "services", "cli", ""}
CLI_MAY_IMPORT_MODULES = {"trtflow.store", "trtflow.taskdata", "trtflow.signing"}


@pytest.mark.parametrize("module", sorted(m for m in MODULES if _top(m) == "cli"))
def test_every_cli_command_reaches_the_work_only_through_a_service(module: str) -> None:
    """A command parses, calls one service (trtflow.services) and prints: the run engine, the deploy flows, the
    report and the store's housekeeping are reached only through the services' front doors."""
    imported = _trtflow_imports(MODULES[module])
    assert {m for m in imported if _top(m) not in CLI_MAY_IMPORT} <= CLI_MAY_IMPORT_MODULES


@pytest.mark.parametrize("module", sorted(m for m in MODULES if _top(m) == "services"))
def test_services_print_nothing(module: str) -> None:
    """A service returns a value; printing is the CLI's (click is imported only there)."""
    assert "import click" not in MODULES[module].read_text()


def test_no_import_cycle_counting_lazy_and_type_only_imports() -> None:
    """A lazy or TYPE_CHECKING import hides a dependency, it does not remove it: none may close a cycle."""
    architecture = _architecture()
    assert architecture.cycles(architecture.graph(PACKAGE)) == []


def test_no_module_imports_a_higher_layer() -> None:
    architecture = _architecture()
    edges = architecture.graph(PACKAGE)
    assert architecture.unlayered(edges) == []
    assert architecture.upward(edges) == []


def test_no_module_over_400_lines() -> None:
    assert _architecture().long_modules(PACKAGE) == []


def test_the_architecture_check_finds_a_planted_cycle_and_an_upward_import(tmp_path: Path) -> None:
    package = tmp_path / "trtflow"
    (package / "util").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "util" / "__init__.py").write_text("")
    (package / "util" / "a.py").write_text("def f():\n    from trtflow.util import b\n")
    (package / "util" / "b.py").write_text("from trtflow.util import a\nfrom trtflow.run import session\n")
    (package / "run").mkdir()
    (package / "run" / "__init__.py").write_text("")
    (package / "run" / "session.py").write_text("")
    architecture = _architecture()
    edges = architecture.graph(package)
    assert architecture.cycles(edges) == [["trtflow.util.a", "trtflow.util.b"]]
    assert architecture.upward(edges) == [("trtflow.util.b", "trtflow.run.session")]


@pytest.mark.parametrize("kind", ["export", "cleanup", "precision", "build", "verify", "package"])
def test_every_stage_kind_registers_its_stage(kind: str) -> None:
    from trtflow.stages import stage

    found = stage(kind)
    module = importlib.import_module(f"trtflow.stages.{kind}")
    assert (found.kind, found.version) == (kind, module.VERSION)


def test_the_tests_mirror_the_package() -> None:
    """Each test file sits in the folder of the package it tests (project/: the repository, docs and architecture);
    shared helpers stay at the top of tests/."""
    tests = PACKAGE.parent / "tests"
    folders = {p.parent.name for p in tests.rglob("test_*.py")}
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert folders <= packages | {"project"}
    assert not list(tests.glob("test_*.py"))
