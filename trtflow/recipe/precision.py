"""What a recipe says about reduced precision: the calibration data, AutoCast and PTQ options, accuracy limits.

fp16/bf16 are made by ModelOpt AutoCast, int8/fp8 by ModelOpt post-training quantization calibrated on
the declared data; every reduced-precision model is then compared with fp32 against these limits.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from trtflow.recipe.base import Dim, FieldError, StrictModel
from trtflow.util.cc import ComputeCapability

SUPPORTED_PRECISIONS = ("fp32", "fp16", "bf16", "int8", "fp8")
AUTOCAST_PRECISIONS, QUANTIZED_PRECISIONS = ("fp16", "bf16"), ("int8", "fp8")
# The oldest GPU each reduced precision runs on (TensorRT-RTX support matrix: Turing sm_75 has no bf16, fp8 needs
# Ada sm_89 or newer; TensorRT agrees). fp16 and int8 Q/DQ build for every capability TensorRT-RTX targets.
PRECISION_MIN_COMPUTE_CAPABILITY = {"bf16": ComputeCapability("sm_80"), "fp8": ComputeCapability("sm_89")}


Size = Annotated[list[Dim], Field(min_length=2, max_length=2)]


class ImageSet(StrictModel):
    """An image folder (or glob) and how a file becomes one sample: Pillow decode, resize, crop, normalize, lay out."""

    path: str
    input: str | None = None  # the model input the images feed (default: the only one)
    resize: Dim | Size | None = None  # an int: the shorter side, keeping the aspect ratio; [h, w]: exactly
    crop: Dim | Size | None = None  # center crop, after resize
    mean: list[float] | None = None  # per channel, on values scaled to [0, 1]
    std: list[float] | None = None
    layout: Literal["NCHW", "NHWC"] = "NCHW"
    dtype: Literal["float32", "float16", "uint8"] = "float32"  # uint8: raw pixels, no scaling
    color: Literal["RGB", "BGR", "L"] = "RGB"
    batch: int = Field(default=1, ge=1, le=4096)  # images per calibration batch

    @field_validator("resize", "crop", mode="before")
    @classmethod
    def _size(cls, value: Any) -> Any:
        """One message for both spellings (pydantic would report each branch of the union)."""

        def dim(v: Any) -> bool:
            """True for a positive int that is not a bool and fits in int32."""
            return isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 2**31 - 1

        if value is None or dim(value) or (isinstance(value, list) and len(value) == 2 and all(dim(v) for v in value)):
            return value
        raise ValueError(f"{value!r} is neither a positive integer (the shorter side) nor [height, width]")

    @model_validator(mode="after")
    def _normalization(self) -> ImageSet:
        channels = 1 if self.color == "L" else 3
        for name in ("mean", "std"):
            values = getattr(self, name)
            if values is not None and self.dtype == "uint8":
                raise FieldError(name, f"{name} does not apply to dtype uint8 (raw pixels)")
            if values is not None and len(values) != channels:
                raise FieldError(name, f"{name} needs {channels} value(s), one per {self.color} channel")
        if self.std is not None and any(v <= 0 for v in self.std):
            raise FieldError("std", "std values must be > 0")
        return self


class Calibration(StrictModel):
    """The samples int8/fp8 are calibrated on: files (`data`), an image folder (`images`), or `random: true`."""

    data: str | None = None  # a glob of .npz (one array per input name) or .npy (the only input) files
    images: ImageSet | None = None
    random: bool = False  # seeded random inputs within the profiles: explicit, and recorded in the manifest
    samples: int | None = Field(default=None, ge=1)  # files (batches) to calibrate on; default: all not held out
    seed: int = 0  # decides which files are held out and selected (and the random inputs)
    method: Literal["entropy", "max", "percentile"] | None = None  # default: entropy for int8, max for fp8
    percentile: float | None = Field(default=None, gt=50, le=100)  # of |x|, with method percentile (default 99.999)

    @model_validator(mode="after")
    def _one_source(self) -> Calibration:
        given = [name for name in ("data", "images") if getattr(self, name) is not None] + (
            ["random"] if self.random else []
        )
        if len(given) != 1:
            raise FieldError(
                "data",
                "give exactly one of data: <glob>, images: {path: ...} or random: true"
                + (f" (got {', '.join(given)})" if given else ""),
            )
        if self.percentile is not None and self.method != "percentile":
            raise FieldError("percentile", "percentile applies to method: percentile only")
        return self

    def method_for(self, precision: str) -> str:
        """ModelOpt converts max-calibrated int8 scales to fp8, so fp8 defaults to max."""
        return self.method or ("max" if precision == "fp8" else "entropy")

    def percentile_value(self) -> float | None:
        """ONNX Runtime's default percentile (99.999) unless given; None for other methods."""
        return (self.percentile or 99.999) if self.method == "percentile" else None


class AutocastOptions(StrictModel):
    """fp16/bf16 by ModelOpt AutoCast."""

    keep_io_types: bool = True  # inputs and outputs stay fp32, so callers feed the engine as before
    keep_op_types: list[str] = Field(default_factory=list)  # op types kept in fp32, e.g. [Resize, Softmax]
    keep_nodes: list[str] = Field(default_factory=list)  # node name regexes kept in fp32
    # a node reading or writing a larger magnitude (float tensors, over the calibration or random samples) stays
    # fp32; null: AutoCast's 512
    data_max: float | None = Field(default=None, gt=0)
    init_max: float | None = Field(default=None, gt=0)  # a node with a larger weight stays fp32; null: fp16 max
    include_op_types: list[str] = Field(default_factory=list)  # op types made fp16/bf16 whatever the ranges say
    include_nodes: list[str] = Field(default_factory=list)  # node name regexes made fp16/bf16 whatever the ranges say


class QuantizeOptions(StrictModel):
    """int8/fp8 by ModelOpt post-training quantization (Q/DQ nodes)."""

    exclude_op_types: list[str] = Field(default_factory=list)
    exclude_nodes: list[str] = Field(default_factory=list)  # node name regexes
    high_precision: Literal["fp16", "bf16", "fp32"] = "fp16"  # what unquantized layers run in (ModelOpt's default)


TaskMetric = Literal["top1", "top5", "mse"]
# top-k: share of rows whose label is among the k largest outputs; mse: mean squared error
TASK_METRICS = (
    "top1",
    "top5",
    "mse",
)


class Tolerance(StrictModel):
    """Limits on a reduced-precision model vs fp32 on ONNX Runtime; a null limit is not checked."""

    min_cosine: float | None = Field(default=None, ge=-1, le=1)
    min_top1: float | None = Field(default=None, ge=0, le=1)  # outputs of shape [rows, classes]
    max_abs_error: float | None = Field(default=None, ge=0)
    max_mean_rel_error: float | None = Field(default=None, ge=0)
    min_share: float | None = Field(default=None, ge=0, le=1)  # of weights and of MACs that run in this precision
    # outputs that are sets of data-dependent size (NonMaxSuppression's selected boxes): the share of elements both
    # models selected, |A & B| / |A | B|
    min_set_agreement: float | None = Field(default=None, ge=0, le=1)
    max_drop: dict[TaskMetric, Annotated[float, Field(ge=0)]] | None = None  # task metric vs fp32 on accuracy.data
    # auto: when the model misses these limits, keep the fewest compute nodes in high precision until they hold (fp16
    # for int8/fp8, fp32 for fp16/bf16; never below min_share, 0.5 unless set), found by their measured sensitivity
    fallback: Literal["none", "auto"] = "none"

    @field_validator("max_drop")
    @classmethod
    def _one_metric(cls, value: dict | None) -> dict | None:
        if value is not None and len(value) != 1:
            raise ValueError("name one metric, the one accuracy.metric measures, e.g. {top1: 0.01}")
        return value


# Measured on the example and test models (README: Precision and calibration); fp16 keeps 10 mantissa bits, bf16 7,
# int8/fp8 8 bits with calibrated ranges, so each default is looser than the one before.
DEFAULT_TOLERANCES = {
    "fp16": Tolerance(min_cosine=0.9999, min_top1=0.99, min_set_agreement=0.98),
    "bf16": Tolerance(min_cosine=0.999, min_top1=0.98, min_set_agreement=0.95),
    "int8": Tolerance(min_cosine=0.99, min_top1=0.9, min_set_agreement=0.9),
    "fp8": Tolerance(min_cosine=0.99, min_top1=0.9, min_set_agreement=0.9),
}


class AccuracyOptions(StrictModel):
    """How each reduced precision is compared with fp32, and the limits per precision (defaults: DEFAULT_TOLERANCES)."""

    samples: int = Field(default=16, ge=1, le=10_000)  # held-out files (at most half the set), or random feeds
    seed: int = 1  # of the random feeds when no files are declared
    data: str | None = None  # labelled rows: a glob of .npz (one array per input) or .npy (the only input) files
    # a .npy of one label per row of `data`, in sorted file order: class ids, or float targets
    labels: str | None = None
    metric: TaskMetric | None = None  # what the labels measure (default top1; mse for float targets)
    fp16: Tolerance = Field(default_factory=Tolerance)
    bf16: Tolerance = Field(default_factory=Tolerance)
    int8: Tolerance = Field(default_factory=Tolerance)
    fp8: Tolerance = Field(default_factory=Tolerance)

    @model_validator(mode="after")
    def _labelled(self) -> AccuracyOptions:
        if (self.data is None) != (self.labels is None):
            raise FieldError(
                "labels" if self.labels is None else "data",
                "task accuracy needs both data: <glob> and labels: <file.npy>",
            )
        if self.metric is not None and self.data is None:
            raise FieldError("metric", "metric measures labelled data: add data: <glob> and labels: <file.npy>")
        for precision in ("fp16", "bf16", "int8", "fp8"):
            limit = getattr(self, precision).max_drop
            if limit is not None and self.data is None:
                raise FieldError(precision, "max_drop needs labelled data: add accuracy.data and accuracy.labels")
            if limit is not None and self.metric is not None and self.metric not in limit:
                raise FieldError(precision, f"max_drop names {next(iter(limit))} but accuracy.metric is {self.metric}")
        return self

    def tolerance(self, precision: str) -> dict[str, float]:
        """The default limits, with the ones the recipe names replacing them; a limit set to null is not checked and
        not listed (max_drop: `max_drop`, fallback: `fallback`)."""
        given = getattr(self, precision)
        policy = {"max_drop", "fallback"}
        merged = {
            **DEFAULT_TOLERANCES[precision].model_dump(exclude=policy),
            **given.model_dump(include=given.model_fields_set - policy),
        }
        return {name: limit for name, limit in merged.items() if limit is not None}

    def fallback(self, precision: str) -> str:
        """`auto` when the recipe asks for the sensitivity-guided fallback of `precision`, else `none`."""
        limits: Tolerance = getattr(self, precision)
        return limits.fallback

    def max_drop(self, precision: str) -> tuple[str, float] | None:
        """(metric, largest allowed drop from fp32) the recipe sets for `precision`, or None."""
        limit = getattr(self, precision).max_drop
        return None if not limit else next(iter(limit.items()))
