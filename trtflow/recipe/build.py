"""`build:` in a recipe: the builder settings that change an engine's bytes.

One home for them: the build stage's params inherit these fields (so each is in the build key), the
backend applies them by name (trtflow.backends.trt_common.BUILDER_OPTIONS), and the manifest records them.
Adding an option is a field here plus its line in the backend. `plugins` (BuildSettings) is no builder option: the
libraries are inputs of the build, so their digests enter its key as sources, never their paths (recipe.plugins).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from trtflow.recipe.base import StrictModel


class BuildOptions(StrictModel):
    """Builder settings that change the engine (and so its key)."""

    workspace_mib: int | None = Field(default=None, gt=0)  # trtexec --memPoolSize=workspace:<N>M
    optimization_level: int = Field(default=3, ge=0, le=5)  # --builderOptimizationLevel
    # What the engine keeps for layer inspection: layer names (TensorRT's default when unset), full layer
    # details (engine inspector, profilers), or nothing. It changes the engine's bytes (measured).
    profiling_verbosity: Literal["none", "layer_names_only", "detailed"] | None = None  # --profilingVerbosity
    # Unset (None) below means the backend's own default, and keeps the field out of the build's key.
    tiling_optimization_level: Literal["none", "fast", "moderate", "full"] | None = None  # --tilingOptimizationLevel
    # bytes of L2 cache tiling may assume: --l2LimitForTiling
    l2_limit_for_tiling: int | None = Field(default=None, ge=0)
    max_aux_streams: int | None = Field(default=None, ge=0)  # --maxAuxStreams
    max_num_tactics: int | None = Field(default=None, ge=1)  # --maxTactics
    sparse_weights: bool | None = None  # --sparsity=enable (kSPARSE_WEIGHTS)
    tf32: bool | None = None  # false: trtexec --noTF32 (TensorRT enables TF32 by default)
    direct_io: bool | None = None  # --directIO (kDIRECT_IO)
    strict_nans: bool | None = None  # kSTRICT_NANS
    weight_streaming: bool | None = None  # --weightStreaming (kWEIGHT_STREAMING): the runtime may stream weights


class BuildSettings(BuildOptions):
    """The recipe's `build:` block: the builder options and the plugin libraries the builder loads."""

    # Shared libraries (paths relative to the project root, or absolute) loaded into the builder's plugin registry
    # before the ONNX is parsed, like trtexec --staticPlugins/--dynamicPlugins: their custom ops' creators.
    plugins: list[str] = Field(default_factory=list)

    @field_validator("plugins")
    @classmethod
    def _unique(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError("a plugin library is listed twice")
        return value

    def options(self) -> dict:
        """The builder options alone (what the build's params hold and the manifest records as `builder`)."""
        return self.model_dump(exclude={"plugins"})
