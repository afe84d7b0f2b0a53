"""`build:` in a recipe: the builder settings that change an engine's bytes.

One home for them: the build stage's params inherit these fields (so each is in the build key), the
backend applies them by name (trtflow.backends.trt_common.BUILDER_OPTIONS), and the manifest records them.
Adding an option is a field here plus its line in the backend.
"""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field

from trtflow.recipe.base import StrictModel


class BuildOptions(StrictModel):
    """Builder settings that change the engine (and so its key)."""

    workspace_mib: Optional[int] = Field(default=None, gt=0)
    optimization_level: int = Field(default=3, ge=0, le=5)
    # What the engine keeps for layer inspection: layer names (TensorRT's default when unset), full layer
    # details (engine inspector, profilers), or nothing. It changes the engine's bytes (measured).
    profiling_verbosity: Optional[Literal["none", "layer_names_only", "detailed"]] = None


