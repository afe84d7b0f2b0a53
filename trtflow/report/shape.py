"""The shape of a run record, checked before a report is drawn from it: `report --from FILE` reads any file.

run.json is written by `trtflow run`, but the report command draws whatever it is given; a record of another shape
(`jobs` a string, a node without a status) is refused in one line naming the first field that is wrong. Only what the
renderers draw is checked (a record of an older trtflow, its manifests of an older schema, still draws).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from trtflow.report import FORMAT

MAX_JOBS = 4096  # a slot is a row of the timeline: bounded, so a record cannot ask for a billion rows
Seconds = Annotated[float, Field(ge=0)]
Count = Annotated[int, Field(ge=0)]


class _Shape(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow", allow_inf_nan=False)


class NodeEntry(_Shape):
    """One stage of the run, as record._node_entry writes it."""

    id: str
    kind: str
    recipe: str
    deps: list[str] = []
    target: str | None = None
    status: Literal["built", "cached", "failed", "skipped"]
    failure_cached: bool
    reason: str
    changes: list[str] = []
    seconds: Seconds | None
    recorded_seconds: Seconds | None
    start: Seconds | None = None
    end: Seconds | None = None
    slot: Annotated[int, Field(ge=0, lt=MAX_JOBS)] | None = None
    peak_rss: Count | None = None

    @model_validator(mode="after")
    def _timed_whole(self) -> NodeEntry:
        if (self.start is None) != (self.end is None) or (self.start is not None and self.end < self.start):  # type: ignore[operator]
            raise ValueError("start and end: both or neither, end not before start")
        return self


class Refused(_Shape):
    """An engine provision would not choose for a GPU, and why."""

    file: str
    why: str


class Choice(_Shape):
    """What provision chooses from one package for one GPU, or the error it gives."""

    chosen: str | None = None
    precision: str | None = None
    target: str | None = None
    reason: str | None = None
    error: str | None = None
    refused: list[Refused] = []
    failed: list[str] = []

    @model_validator(mode="after")
    def _chosen_or_error(self) -> Choice:
        if self.error is None and (self.chosen is None or self.reason is None):
            raise ValueError("a choice names the engine chosen and why, or the error")
        return self


class GpuChoices(_Shape):
    """One compute capability of the fleet and each recipe's choice for it."""

    compute_capability: str
    targets: list[str] = []
    recipes: dict[str, Choice]


class EngineEntry(_Shape):
    """An engine of a package, as the engines table shows it."""

    file: str
    precision: str
    target: str
    compute_capabilities: list[str]
    size: Count
    backend: str
    backend_version: str
    hardware_compatibility: str
    version_compatible: bool


class MissingEntry(_Shape):
    """An engine a package lacks, and the stage that failed."""

    precision: str
    target: str
    stage: str
    reason: str


class Package(_Shape):
    """A package manifest, as far as the report draws it."""

    engines: list[EngineEntry] = []
    missing: list[MissingEntry] = []


class OutputAccuracy(_Shape):
    """One output's accuracy against fp32."""

    name: str
    passed: bool
    cosine_similarity: float | None = None
    max_abs_error: float | None = None
    top1_agreement: float | None = None


class Accuracy(_Shape):
    """A precision's accuracy: per output, and the limits it was held to."""

    outputs: list[OutputAccuracy]
    tolerance: dict[str, float | None]


class Composition(_Shape):
    """What a reduced-precision model is made of, by type."""

    nodes_by_dtype: dict[str, Count] = {}
    initializer_bytes_by_dtype: dict[str, Count] = {}


class AccuracyRow(_Shape):
    """A reduced precision's accuracy against fp32, or the failure of its precision stage."""

    recipe: str
    precision: str
    passed: bool
    accuracy: Accuracy | None = None
    composition: Composition | None = None
    failure: str | None = None

    @model_validator(mode="after")
    def _accuracy_or_failure(self) -> AccuracyRow:
        if (self.accuracy is None) == (self.failure is None):
            raise ValueError("a row holds the accuracy measured or the failure, one of them")
        return self


class RunRecord(_Shape):
    """A whole run record."""

    format: Literal[FORMAT]  # type: ignore[valid-type]
    trtflow_version: str
    project: str
    finished_at: str | None = None
    seconds: Seconds
    jobs: Annotated[int, Field(ge=1, le=MAX_JOBS)]
    nodes: list[NodeEntry]
    packages: dict[str, Package] = {}
    targets: dict[str, list[str]] = {}
    fleet: list[GpuChoices] = []
    accuracy: list[AccuracyRow] = []


def first_problem(record: object) -> str | None:
    """None for a record of the right shape, else `nodes.3.status: Input should be ...` for the first wrong field."""
    try:
        RunRecord.model_validate(record)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"]) or "the record"
        return f"{where}: {error['msg']}"[:200]
    return None
