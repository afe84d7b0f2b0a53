"""pipeline.yaml and recipes: the pydantic schema (schema, and the option blocks in source, precision,
build), YAML with line numbers (yamlfile), and loading (load) a validated, cross-checked Project (project).

A leaf: it imports nothing above it. `from trtflow.recipe import load_project` works; the names are
resolved on first use, so importing one small schema module (as the manifest does) loads no more.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "load_project": "load",
    "Project": "project",
    "RecipeFile": "project",
    "PIPELINE_FILE": "project",
    "Recipe": "schema",
    "Pipeline": "schema",
    "TargetSpec": "schema",
    "recipe_json_schema": "schema",
}


def __getattr__(name: str) -> Any:
    """Lazy re-exports of the package's public names (PEP 562)."""
    if name not in _EXPORTS:
        raise AttributeError(f"module 'trtflow.recipe' has no attribute {name!r}")
    return getattr(importlib.import_module(f"trtflow.recipe.{_EXPORTS[name]}"), name)
