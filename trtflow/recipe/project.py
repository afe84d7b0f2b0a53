"""A loaded project: pipeline.yaml and its recipes, each recipe with the file and document it came from, so every
later check can still name the file, the line and the field."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtflow.errors import InternalError, ProjectError
from trtflow.recipe.pymodule import ModuleNotFound, module_file
from trtflow.recipe.refusals import Refusal, exclude_entries, refusal_report
from trtflow.recipe.schema import Pipeline, Recipe
from trtflow.recipe.yamlfile import YamlDocument

if TYPE_CHECKING:
    from trtflow.signing import TrustedKeys

PIPELINE_FILE = "pipeline.yaml"


@dataclass(frozen=True)
class RecipeFile:
    """A validated recipe with where it came from, so later checks can still point at a line."""

    recipe: Recipe
    path: Path
    display: str
    document: YamlDocument
    refusals: tuple[Refusal, ...] = ()  # pairs the recipe asks for that cannot be built (see recipe.refusals)

    def where(self, *loc: Any) -> str:
        """`recipes/x.yaml:7: source.onnx` for error messages."""
        return f"{self.display}:{self.document.line_of(loc)}: {format_loc(loc)}"

    def pairs(self, pipeline: Pipeline) -> list[tuple[str, str]]:
        """The (precision, target) pairs this recipe builds: every combination less what `exclude:` drops."""
        return [
            (p, t)
            for p in self.recipe.precisions
            for t in self.target_names(pipeline)
            if not self.recipe.excluded(p, t)
        ]

    def target_names(self, pipeline: Pipeline) -> list[str]:
        """The targets this recipe builds for: its own `targets:`, else every target in pipeline.yaml."""
        return list(self.recipe.targets) if self.recipe.targets else list(pipeline.targets)

    def source_path(self, root: Path) -> Path:
        """The ONNX source file (a torch source has none: its model comes from the export stage)."""
        onnx = self.recipe.source.onnx
        if onnx is None:
            raise InternalError(f"{self.where('source')}: not an ONNX source, it has no source file")
        try:
            return (root / onnx).resolve()
        except (RuntimeError, OSError) as exc:  # a symlink loop
            raise ProjectError(
                f"{self.where('source', 'onnx')}: cannot follow {self.recipe.source.onnx}: {exc}"
            ) from exc

    def factory_file(self, root: Path) -> Path:
        """The torch factory's module file, found without importing it; ProjectError if there is none."""
        torch = self.recipe.source.torch
        if torch is None:
            raise InternalError(f"{self.where('source')}: not a torch source, it has no factory")
        module = torch.factory.split(":")[0]
        try:
            return module_file(module, root)
        except ModuleNotFound as exc:
            raise ProjectError(f"{self.where('source', 'torch', 'factory')}: {exc}") from exc


@dataclass(frozen=True)
class Project:
    """pipeline.yaml plus its recipes, validated and cross-checked."""

    root: Path
    pipeline: Pipeline
    recipes: tuple[RecipeFile, ...]

    @property
    def store_dir(self) -> Path:
        """The store folder pipeline.yaml names, under the project root."""
        return self.root / self.pipeline.store

    @property
    def packages_dir(self) -> Path:
        """The folder packages are written to (pipeline.yaml's `packages:`), under the project root."""
        return self.root / self.pipeline.packages

    def trusted_keys(self) -> TrustedKeys | None:
        """The public keys `cache.trust` names, loaded (ProjectError naming the entry); None when it names none."""
        trust = self.pipeline.cache.trust
        if not trust:
            return None
        from trtflow.signing import trusted_keys

        return trusted_keys(
            (self.root / path, f"{PIPELINE_FILE}: cache.trust[{index}]") for index, path in enumerate(trust)
        )

    def refusal_blocks(self, refusals: list[Refusal]) -> dict[str, list[str]]:
        """Per recipe file with refusals: the `exclude:` entries that keep its own and drop the refused pairs."""
        blocks = {}
        for item in self.recipes:
            mine = [r for r in refusals if r.recipe == item.display]
            if mine:
                existing = [(rule.precision, rule.target) for rule in item.recipe.exclude]
                blocks[item.display] = exclude_entries(mine, existing, item.target_names(self.pipeline))
        return blocks

    def refuse(self, refusals: list[Refusal]) -> None:
        """Raise one ProjectError listing every refusal and the `exclude:` block of each recipe (nothing if none)."""
        order = {item.display: index for index, item in enumerate(self.recipes)}
        if refusals:
            # stable: each recipe's in file order
            refusals = sorted(refusals, key=lambda r: order.get(r.recipe, len(order)))
            raise ProjectError(refusal_report(refusals, self.refusal_blocks(refusals)))

    def recipe(self, name: str) -> RecipeFile:
        """The recipe named `name`; ProjectError listing the known names if there is none."""
        for item in self.recipes:
            if item.recipe.name == name:
                return item
        known = ", ".join(r.recipe.name for r in self.recipes) or "none"
        raise ProjectError(f"no recipe named {name!r} (recipes: {known})")


def format_loc(loc: tuple) -> str:
    """('profiles', 0, 'inputs', 'x') -> 'profiles[0].inputs.x'."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out
