"""What trtflow can describe without running anything, below the CLI: a package or engine (inspect) and the JSON
Schemas of its files (schema)."""

from __future__ import annotations

from pathlib import Path


def inspect(path: Path) -> dict:
    """A package (folder or .tar.gz), a manifest.json or an engine file, described: {kind, path, manifest | engine}."""
    from trtflow.inspection import inspect_path

    return inspect_path(path)


def json_schema(what: str) -> dict:
    """The JSON Schema of a `manifest`, a `recipe` or `pipeline` (pipeline.yaml), for editors and validators."""
    if what == "manifest":
        from trtflow.manifest import manifest_json_schema

        return manifest_json_schema()
    from trtflow.recipe.schema import Pipeline, recipe_json_schema

    return recipe_json_schema() if what == "recipe" else Pipeline.model_json_schema()
