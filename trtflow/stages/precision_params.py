"""The typed params of a precision stage: what changes its output (the key) and the policy that rides along.

fp32 sets `precision` alone; fp16/bf16 add `autocast`, int8/fp8 `quantize`; both add the accuracy check.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from trtflow.recipe.precision import AutocastOptions, QuantizeOptions
from trtflow.stages.base import StageParams


class Accuracy(BaseModel):
    """How the reduced-precision model is compared with fp32: samples, seed and the limits for this precision."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    samples: int
    seed: int
    tolerance: dict[str, float]
    fallback: str = "none"  # auto: stages.fallback searches for the nodes to keep in high precision
    search: int | None = None  # with fallback auto: the search's version (stages.fallback.SEARCH_VERSION)


class Quantize(QuantizeOptions):
    """The recipe's quantize options plus the calibration method, seed, percentile and random sample count."""

    method: str
    seed: int
    percentile: float | None
    samples: int | None


class TaskCheck(BaseModel):
    """Task accuracy on the recipe's labelled data: the metric and the largest drop from fp32 allowed (None: recorded
    only)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    metric: str
    max_drop: float | None = None


class Params(StageParams):
    """fp32 sets `precision` alone; fp16/bf16 add autocast, int8/fp8 quantize; both add the accuracy check."""

    FINGERPRINT = ("modelopt", "onnx", "onnxruntime", "numpy", "pillow")
    precision: str
    profiles: list[dict[str, dict[str, list[int]]]] | None = None
    values: dict[str, tuple[int, int]] = {}  # the recipe's integer input values (RecipeContext.input_values)
    on_fail: str | None = None
    accuracy: Accuracy | None = None
    task: TaskCheck | None = None  # absent without accuracy.data: keys of recipes without labels stay as they were
    data: dict[str, Any] | None = None  # how calibration files are read (calibration.reading_params)
    autocast: AutocastOptions | None = None
    quantize: Quantize | None = None
    modelopt: str | None = None
    onnx: str | None = None
    onnxruntime: str | None = None
    numpy: str | None = None  # calibration histograms and the accuracy numbers
    pillow: str | None = None  # image calibration sets only
