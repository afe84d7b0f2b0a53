"""Finding a torch factory's module without running it (planning must never execute the user's code)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from trtflow.recipe.pymodule import ModuleNotFound, import_root, module_file, top_level_names


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "models" / "vision").mkdir(parents=True)
    (tmp_path / "models" / "net.py").write_text("def make():\n    pass\n")
    # would end the test if run
    (tmp_path / "models" / "vision" / "__init__.py").write_text("raise SystemExit('imported!')\n")
    (tmp_path / "models" / "vision" / "resnet.py").write_text("from .blocks import *\n")
    return tmp_path


def test_a_project_module_is_found_without_importing_its_packages(root: Path) -> None:
    found = module_file("models.vision.resnet", root)
    assert found == (root / "models" / "vision" / "resnet.py").resolve()
    assert "models" not in sys.modules and "models.vision" not in sys.modules
    assert import_root("models.vision.resnet", found) == root.resolve()
    package = module_file("models.vision", root)
    assert package.name == "__init__.py" and import_root("models.vision", package) == root.resolve()


def test_the_project_folder_comes_before_the_python_path(root: Path) -> None:
    (root / "json.py").write_text("def make():\n    pass\n")
    assert module_file("json", root) == (root / "json.py").resolve()
    # an installed package, walked down without importing it
    assert module_file("email.mime.text", root).name == "text.py"


@pytest.mark.parametrize(
    "module, message",
    [
        ("models.nothere", "cannot find module 'models.nothere'"),
        ("models.net.inner", "models.net is"),  # a module, not a package
        ("models", "namespace package"),
    ],
)
def test_what_cannot_hold_a_factory_is_refused(root: Path, module: str, message: str) -> None:
    with pytest.raises(ModuleNotFound, match=message):
        module_file(module, root)


def test_top_level_names_are_read_from_the_source(root: Path) -> None:
    code = root / "code.py"
    code.write_text(
        "import torch.nn as nn\nfrom x import y as z\nA = B = 1\nif True:\n    def make(): pass\nelse:\n    class "
        "Net: pass\n"
    )
    assert top_level_names(code) == {"nn", "z", "A", "B", "make", "Net"}
    assert top_level_names(root / "models" / "vision" / "resnet.py") is None  # a star import binds names it cannot see
    code.write_text("def make(:\n")
    with pytest.raises(SyntaxError):
        top_level_names(code)
