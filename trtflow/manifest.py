"""The package manifest: what each engine is, what it was built from, and which GPUs can load it.

A fleet reads only this file to pick an engine for a device, so it records compute capabilities,
backend name and exact version and compatibility settings per engine. It holds no wall-clock time:
the same inputs must give a byte-identical manifest (and package).
"""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict

SCHEMA_VERSION = 1
MANIFEST_FILE = "manifest.json"
SUMS_FILE = "SHA256SUMS"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ProfileShape(_Model):
    min: list[int]
    opt: list[int]
    max: list[int]


class Tensor(_Model):
    """An engine I/O tensor; -1 marks a dynamic dimension, `profiles` gives its range per profile."""

    name: str
    mode: Literal["input", "output"]
    dtype: str
    shape: list[int]
    profiles: list[ProfileShape] = []


class BuilderOptions(_Model):
    workspace_mib: Optional[int]
    optimization_level: int


class Engine(_Model):
    file: str
    sha256: str
    size: int
    precision: str
    target: str
    compute_capabilities: list[str]
    backend: str
    backend_version: str
    hardware_compatibility: str
    version_compatible: bool
    builder: BuilderOptions
    tensors: list[Tensor]
    stage_key: str


class Source(_Model):
    sha256: str
    cleaned_sha256: str
    nodes: int


class Manifest(_Model):
    schema_version: Literal[1] = SCHEMA_VERSION
    recipe: str
    trtflow_version: str
    source: Source
    engines: list[Engine]


def manifest_json_schema() -> dict:
    return Manifest.model_json_schema()
