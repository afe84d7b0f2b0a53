"""Find a Python module's file, and what it defines, without importing it: planning never runs the user's code.

A torch source names its model as `package.module:callable`. Its module file is an input of the export
stage (editing it re-exports), so planning must find it cheaply: the project folder is searched first,
then the Python path, the order the export stage imports in.
"""

from __future__ import annotations

import ast
import importlib.machinery
import sys
from pathlib import Path


class ModuleNotFound(LookupError):
    """The module is on neither the project folder nor the Python path (the message says where it looked)."""


def module_file(module: str, root: Path) -> Path:
    """The source (or extension) file of `module`, e.g. models.net -> <root>/models/net.py.

    Each parent package is located by PathFinder, which reads directories but executes nothing.
    """
    parts = module.split(".")
    search: list[str] | None = [str(root), *sys.path]
    spec = None
    for index in range(len(parts)):
        spec = importlib.machinery.PathFinder.find_spec(".".join(parts[: index + 1]), search)
        if spec is None:
            raise ModuleNotFound(f"cannot find module {module!r} (looked in the project folder, then the Python path)")
        search = list(spec.submodule_search_locations or []) or None
        if search is None and index < len(parts) - 1:
            raise ModuleNotFound(
                f"cannot find module {module!r}: {'.'.join(parts[: index + 1])} is {spec.origin}, not a package"
            )
    if spec is None or not spec.has_location or not spec.origin:
        raise ModuleNotFound(f"module {module!r} is a namespace package: it holds no code to call")
    return Path(spec.origin).resolve()


def import_root(module: str, file: Path) -> Path:
    """The sys.path entry `module` was found under: <root> for <root>/models/net.py and models.net."""
    depth = len(module.split(".")) - (0 if file.stem == "__init__" else 1)
    return file.parents[depth]


def top_level_names(file: Path) -> set[str] | None:
    """Names a module binds at top level (defs, classes, assignments, imports), or None when it cannot be told.

    None for extension modules, star imports and module-level `__getattr__`, which bind names invisibly.
    Raises SyntaxError for a source file that does not parse.
    """
    if file.suffix != ".py":
        return None
    tree = ast.parse(file.read_bytes(), filename=str(file))
    names: set[str] = set()
    for node in tree.body:
        names.update(_bound_names(node))
    return None if "*" in names or "__getattr__" in names else names


def _bound_names(node: ast.stmt) -> set[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {(alias.asname or alias.name).split(".")[0] for alias in node.names}
    if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return {n.id for target in targets for n in ast.walk(target) if isinstance(n, ast.Name)}
    if isinstance(node, (ast.If, ast.Try, ast.With)):  # conditional definitions still bind the name
        inner = [*node.body, *getattr(node, "orelse", []), *getattr(node, "finalbody", [])]
        inner += [stmt for handler in getattr(node, "handlers", []) for stmt in handler.body]
        return {name for stmt in inner for name in _bound_names(stmt)}
    return set()
