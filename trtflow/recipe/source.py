"""The `source:` and `cleanup:` blocks of a recipe: an ONNX file, a PyTorch, TensorFlow or Keras model, and cleanup.

    source: {onnx: models/resnet.onnx}
    source: {torch: {factory: "models.net:make", kwargs: {width: 64}, weights: models/net.pt,
                     inputs: [{name: image}], opset: 18}}
    source: {tensorflow: {saved_model: models/net, signature: serving_default, tag: serve, opset: 17}}
    source: {keras: models/net.keras}
    cleanup: {fold_constants: true, fold_size_limit_mib: 16, simplify: true}

A torch input's shape defaults to the first profile's opt shape; an axis whose sizes differ between the
profiles is exported dynamic (stages.export.export_dims). Cross-checks with the profiles and the files on disk are
recipe.load's (they need the whole recipe and the project folder).
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal, get_args

from pydantic import Field, field_validator, model_validator

from trtflow.recipe.base import Dim, FieldError, StrictModel
from trtflow.recipe.hftasks import TASKS

TorchDtype = Literal["float32", "float16", "float64", "int64", "int32", "int8", "uint8", "bool"]
TORCH_DTYPES = get_args(TorchDtype)
# Weights a graph computes from small seeds (ConstantOfShape, Tile, Range...) stay computed above this size: folding
# them made engines 55-260x larger. The folds worth having (shapes, zero biases, LSTM gate weights) made at most 64 KiB
# in the test zoo; 16 MiB still folds the gate weights of a 1024-wide LSTM. The engine computes what is left itself.
FOLD_SIZE_LIMIT_MIB = 16.0
FACTORY_PATTERN = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


class TorchInput(StrictModel):
    """One positional argument of the model's forward, in order."""

    name: str = Field(min_length=1)
    shape: list[Dim] | None = None  # the example tensor's shape; default: the first profile's opt shape
    dtype: TorchDtype = "float32"


class TorchSource(StrictModel):
    """A PyTorch model: `factory(**kwargs)` returns a torch.nn.Module, which the export stage turns into ONNX."""

    factory: str  # "package.module:callable", imported from the project folder first
    kwargs: dict[str, Any] = Field(default_factory=dict)
    weights: str | None = None  # a state_dict saved with torch.save, loaded with weights_only=True
    inputs: list[TorchInput] = Field(min_length=1)
    outputs: list[str] | None = Field(default=None, min_length=1)  # names for the ONNX outputs, in order
    opset: int = Field(default=18, ge=7)  # torch's exporter implements opset 18; older ones are converted down
    optimize: bool = False  # also run the exporter's own graph optimizer (cleanup does the proven one)
    files: list[str] = Field(default_factory=list)  # other project files the factory reads: editing one re-exports

    @field_validator("factory")
    @classmethod
    def _factory_form(cls, value: str) -> str:
        if not FACTORY_PATTERN.match(value):
            raise ValueError(f"{value!r} is not of the form package.module:callable")
        return value

    @field_validator("kwargs")
    @classmethod
    def _plain_kwargs(cls, value: dict[str, Any]) -> dict[str, Any]:
        try:  # they enter the export's key as JSON: dates, binary or NaN have no canonical form there
            json.dumps(value, allow_nan=False)
        except (TypeError, ValueError):
            raise ValueError(
                "kwargs must be plain values (strings, finite numbers, booleans, null, lists, mappings)"
            ) from None
        return value

    @field_validator("inputs")
    @classmethod
    def _unique_inputs(cls, value: list[TorchInput]) -> list[TorchInput]:
        names = [item.name for item in value]
        if len(set(names)) != len(names):
            raise ValueError("input names must not repeat")
        return value


# tf2onnx 1.17 writes opsets up to 18 ("Opset 19 is not supported yet"); 17 is what TensorRT parsers read best.
TF_OPSET, TF_MAX_OPSET = 17, 18


class TensorFlowSource(StrictModel):
    """A TensorFlow SavedModel directory: one signature of one MetaGraph, converted to ONNX by tf2onnx."""

    saved_model: str = Field(min_length=1)  # the directory holding saved_model.pb and variables/
    signature: str = Field(default="serving_default", min_length=1)
    tag: str = Field(default="serve", min_length=1)
    opset: int = Field(default=TF_OPSET, ge=9, le=TF_MAX_OPSET)


class HuggingFaceSource(StrictModel):
    """A `save_pretrained` folder of transformers or diffusers (config.json and safetensors weights), exported for a
    task: `huggingface: {path: models/bert-base, task: text-classification}`. Nothing is fetched from a hub."""

    path: str = Field(min_length=1)
    task: str  # what each task loads, takes and returns: recipe.hftasks.TASKS
    opset: int = Field(default=18, ge=7)

    @field_validator("task")
    @classmethod
    def _known_task(cls, value: str) -> str:
        if value not in TASKS:
            raise ValueError(f"unknown task {value!r} (tasks: {', '.join(TASKS)})")
        return value


class Source(StrictModel):
    """Exactly one of an ONNX file, a PyTorch model, a Hugging Face folder, a TensorFlow SavedModel, or a Keras file."""

    onnx: str | None = None
    torch: TorchSource | None = None
    huggingface: HuggingFaceSource | None = None
    tensorflow: TensorFlowSource | None = None
    keras: str | None = Field(default=None, min_length=1)  # a Keras 3 .keras file (or a legacy .h5)

    @model_validator(mode="after")
    def _exactly_one(self) -> Source:
        names = ("onnx", "torch", "huggingface", "tensorflow", "keras")
        given = [name for name in names if getattr(self, name) is not None]
        if not given:
            raise FieldError(
                "onnx",
                "required field is missing: give onnx: <file>, torch: {factory: ..., inputs: [...]}, "
                "huggingface: {path: <folder>, task: ...}, tensorflow: {saved_model: <dir>} or keras: <file>",
            )
        if len(given) > 1:
            raise FieldError(given[1], f"give one source, not {' and '.join(given)}")
        return self

    @property
    def exported(self) -> bool:
        """True when the source is not ONNX: an export stage turns it into ONNX first."""
        return self.onnx is None


class CleanupOptions(StrictModel):
    """Graph cleanup passes (onnxslim); each has an off switch for models where it misbehaves."""

    simplify: bool = True  # false: no onnxslim at all (IR normalization, shape inference and the checker still run)
    fold_constants: bool = True
    # folding never makes a constant larger than this (null: no limit); a bigger one stays computed by its nodes
    fold_size_limit_mib: float | None = Field(default=FOLD_SIZE_LIMIT_MIB, gt=0)
    remove_dead_nodes: bool = True  # Identity, Dropout, no-op Cast/Reshape/Pad/Slice, unused nodes
    fuse_patterns: bool = True  # Conv+BatchNorm, Conv+Add, Gemm, GELU, ...
    eliminate_common_subexpressions: bool = True
    tie_weights: bool = True  # share identical small constants
    infer_shapes: bool = True
    opset: int | None = Field(default=None, ge=7)  # convert the default-domain opset to this version (null: keep)
