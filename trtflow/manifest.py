"""The package manifest: what each engine is, what it was built from, and which GPUs can load it.

A fleet reads only this file to pick an engine for a device, so it records compute capabilities,
backend name and exact version and compatibility settings per engine. It holds no wall-clock time:
the same inputs must give a byte-identical manifest (and package).
"""

from __future__ import annotations

from typing import Annotated, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer

from trtflow.recipe.build import BuildOptions as BuilderOptions  # the recipe's `build:` block, recorded as built

# 2: verification holds cleanup_equality and precision_accuracy; 3: int8/fp8 calibration, typed accuracy;
SCHEMA_VERSION: Final = 4
# 4: complete/missing (a package holds the engines that built; the others are listed with why), precision_composition,
# canonical_sha256 and reproducible per engine; missing engines name their target's compute capabilities
MANIFEST_FILE = "manifest.json"
SUMS_FILE = "SHA256SUMS"


# Names that become file names (a target's plan file, an engine's folder) and numbers that become shapes are bounded
# by the schema, so an edited manifest is refused in one line before any of it is used.
TargetName = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")]
ComputeCapabilityName = Annotated[str, Field(pattern=r"^sm_[0-9]{2,3}$")]
Dimension = Annotated[int, Field(ge=-1, le=(1 << 63) - 1)]  # -1: dynamic; beyond int64 no runtime has a shape
# a file name on a device, never a path
PluginName = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,99}$")]
Sha256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ProfileShape(_Model):
    """A tensor's min, opt and max shape in one optimization profile."""

    min: list[Dimension]
    opt: list[Dimension]
    max: list[Dimension]


class Tensor(_Model):
    """An engine I/O tensor; -1 marks a dynamic dimension, `profiles` gives its range per profile."""

    name: str
    mode: Literal["input", "output"]
    dtype: str
    shape: list[Dimension]
    profiles: list[ProfileShape] = []


class OutputError(_Model):
    """One output against its reference within rtol/atol: the largest errors, or the problem that prevented
    comparing."""

    name: str
    max_abs_error: float | None
    max_rel_error: float | None
    passed: bool
    problem: str | None = None


class OnnxComparison(_Model):
    """Two ONNX models run on ONNX Runtime (CPU) over the same seeded inputs (cleanup: cleaned vs source)."""

    runtime: str
    samples: int
    rtol: float
    atol: float
    outputs: list[OutputError]
    passed: bool


class Tolerance(_Model):
    """The accuracy limits a reduced-precision model was held to; a null limit was not checked."""

    min_cosine: float | None = None
    min_top1: float | None = None
    max_abs_error: float | None = None
    max_mean_rel_error: float | None = None
    min_share: float | None = None  # of weights and of MACs in the precision (composition)
    min_set_agreement: float | None = None  # outputs of data-dependent size (NMS), compared as sets


class OutputAccuracy(_Model):
    """One output of the reduced-precision model vs fp32; None where a metric does not apply (top-1 of a non-2-D
    output)."""

    name: str
    max_abs_error: float | None
    mean_rel_error: float | None  # sum |a - e| / sum |e|
    cosine_similarity: float | None  # the lowest over the samples
    top1_agreement: float | None  # share of rows whose argmax agrees, for [rows, classes] outputs
    non_finite: int = 0
    reference_abs_max: float | None = None  # the fp32 output's largest |value| (range diagnosis)
    compared_as: Literal["set"] | None = None  # "set": an output of data-dependent size (NMS), not elementwise
    set_agreement: float | None = None  # |A & B| / |A | B| of a set output's elements
    problems: list[str] = []
    passed: bool


class TaskAccuracy(_Model):
    """The recipe's task metric on its labelled rows (accuracy.data/labels): fp32's score, this model's, the drop."""

    metric: Literal["top1", "top5", "mse"]
    fp32: float  # the fp32 model's own score on the same rows: the baseline
    value: float
    drop: float  # how much worse than fp32 (fp32 - value for top-k, value - fp32 for mse)
    rows: int
    max_drop: float | None = None  # the recipe's accuracy.<precision>.max_drop; None: recorded, not checked
    passed: bool


class PrecisionAccuracy(_Model):
    """The reduced-precision ONNX against the fp32 model on ONNX Runtime (CPU), over held-out or random samples."""

    runtime: str
    reference: str
    data: str  # which samples: held out from the calibration set, the calibration samples, or seeded random inputs
    held_out: bool
    samples: int
    tolerance: Tolerance
    outputs: list[OutputAccuracy]
    problems: list[str] = []  # beyond the outputs: a composition below min_share, a task drop past max_drop
    passed: bool
    # only with labelled data (left out of the JSON otherwise: manifests stay as they were)
    task: TaskAccuracy | None = None

    @model_serializer(mode="wrap")
    def _without_absent_task(self, handler: SerializerFunctionWrapHandler) -> dict:
        data = handler(self)
        if data.get("task") is None:
            data.pop("task", None)
        return data


class Calibration(_Model):
    """How an int8/fp8 model's activation ranges were found (ModelOpt PTQ on ONNX Runtime, CPU)."""

    method: Literal["entropy", "max", "percentile"]
    percentile: float | None = None
    source: Literal["arrays", "images", "random"]
    random: bool  # true: seeded random inputs, declared with calibration: {random: true}
    seed: int
    samples: int  # files (batches), or random batches
    rows: int  # along the batch axis
    data_digest: str  # sha256 of the exact arrays fed, after selection and preprocessing


class EngineRun(_Model):
    """The engine itself executed and compared; `status` is `not run (<reason>)` where it could not be."""

    status: str
    gpu: str | None = None
    samples: int | None = None
    outputs: list[OutputError] = []
    passed: bool | None = None


class KeptNode(_Model):
    """A node a reduced-precision model kept in higher precision, and the reason the tool gave."""

    name: str
    op: str
    weights: int  # elements
    macs: int
    reason: str


class Composition(_Model):
    """What the reduced-precision ONNX is made of: how much of an "fp16" or "int8" model still computes in fp32."""

    nodes_by_dtype: dict[str, int]  # by the element type of each node's first output; Q/DQ nodes as "q/dq"
    initializer_bytes_by_dtype: dict[str, int]
    qdq_covered_ops: dict[str, int]  # ops fed by a DequantizeLinear (int8/fp8), by op type
    precision: str | None = None
    weight_share: float | None = None  # of weight elements in nodes that run in `precision`
    mac_share: float | None = None  # of multiply-accumulates in such nodes
    kept_nodes: int | None = None  # nodes with weights or MACs kept in higher precision
    kept: list[KeptNode] = []  # the top ones, by weights then MACs


class Verification(_Model):
    """The proofs behind an engine: each transformation checked where it happened, then the engine itself."""

    cleanup_equality: OnnxComparison
    precision_accuracy: PrecisionAccuracy | None = None  # None for fp32 (the cleaned model itself)
    precision_composition: Composition | None = None  # None for fp32
    # accuracy.<precision>.fallback: auto ran: the nodes kept high with their sensitivity, accuracy before and after
    precision_fallback: dict[str, object] | None = None
    engine_checks: dict[str, object]
    engine_run: EngineRun


class NetworkLayer(_Model):
    """One layer of the network TensorRT compiled (before its fusions): name, layer type, its output's element type."""

    name: str
    type: str
    dtype: str


class NetworkFacts(_Model):
    """What the builder's network said of itself at build time (no GPU needed): every layer, counted by type and by
    output type; `device_memory` says why the engine's own figures (fused layers, memory) are not known."""

    layers: list[NetworkLayer]
    by_type: dict[str, int]
    by_output_dtype: dict[str, int]
    device_memory: str


class Plugin(_Model):
    """A plugin library an engine needs where it runs: its file name, sha256 and size, and whether the package carries
    it (as `plugins/<sha256>-<name>`, listed in SHA256SUMS); `provision --plugin-dir` finds the others by sha256."""

    name: PluginName
    sha256: Sha256
    size: int = Field(ge=0)
    carried: bool

    @property
    def file(self) -> str:
        """Where a carried library is in the package (derived, never read from the manifest: a name is no path)."""
        return f"plugins/{self.sha256}-{self.name}"


class Engine(_Model):
    """One engine file of the package: digest, precision, target GPUs, exact backend, build settings, tensors,
    proofs."""

    file: str
    sha256: str
    size: int = Field(ge=0)
    precision: str
    calibration: Calibration | None = None  # int8/fp8 only
    target: TargetName
    compute_capabilities: list[ComputeCapabilityName]
    backend: str
    backend_version: str
    hardware_compatibility: str
    version_compatible: bool
    builder: BuilderOptions
    tensors: list[Tensor]
    verification: Verification | None = None  # always filled by trtflow run; absent only in hand-made manifests
    stage_key: str
    # The engine's digest with the backend's generated numbering abstracted (backends.engine_identity), and what a
    # rebuild from the same inputs is held to: the same canonical digest (`equivalent`; the bytes may differ in that
    # numbering), or the same bytes (`bytes`: an engine with no canonical form).
    canonical_sha256: str | None = None
    network: NetworkFacts | None = None  # absent in packages made before trtflow 0.2.0
    reproducible: Literal["bytes", "equivalent"] | None = None
    plugins: list[Plugin] = []  # absent when the engine needs none (manifest_bytes leaves it out)

    def as_json(self) -> dict:
        """The entry as manifest.json holds it: plain JSON values, no `plugins` key when it needs none."""
        return self.model_dump(mode="json", exclude=None if self.plugins else {"plugins"})


class Source(_Model):
    """The source model's sha256, and the sha256 and node count of the cleaned model the engines are built from."""

    sha256: str
    cleaned_sha256: str
    nodes: int


class MissingEngine(_Model):
    """An engine the recipe asks for that is not in the package: which, the stage that failed, and why."""

    precision: str
    target: str
    stage: str
    reason: str
    compute_capabilities: list[str] = []  # the target's: `provision` names these failures to a GPU they were for


class Manifest(_Model):
    """manifest.json: the recipe, the trtflow version that built it, its source model and every engine in the
    package."""

    schema_version: Literal[1, 2, 3, 4] = SCHEMA_VERSION
    recipe: TargetName  # a recipe's name, bounded like a target's: it names files and folders on a device
    trtflow_version: str
    source: Source
    engines: list[Engine]
    complete: bool = True  # false: some engines of the recipe failed; `missing` says which and why
    missing: list[MissingEngine] = []


def manifest_bytes(manifest: Manifest) -> bytes:
    """manifest.json's bytes. An engine that needs no plugin has no `plugins` key, so a package without plugins keeps
    the bytes it had before plugins existed (and an older trtflow, whose schema forbids the key, refuses one with
    them)."""
    plain = {index: {"plugins"} for index, engine in enumerate(manifest.engines) if not engine.plugins}
    return (manifest.model_dump_json(indent=2, exclude={"engines": plain} if plain else None) + "\n").encode()


def sums_bytes(digests: dict[str, str]) -> bytes:
    """SHA256SUMS of a package: `<sha256>  <file>` per file, sorted by name (what `sha256sum -c` reads)."""
    return "".join(f"{digests[name]}  {name}\n" for name in sorted(digests)).encode()


def read_sums(text: str) -> dict[str, str]:
    """The files a SHA256SUMS lists, by name (the reverse of `sums_bytes`)."""
    return {name: digest for digest, _, name in (line.partition("  ") for line in text.splitlines())}


def manifest_json_schema() -> dict:
    """The JSON Schema of manifest.json (`trtflow schema manifest`)."""
    return Manifest.model_json_schema()
