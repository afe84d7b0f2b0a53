"""Installed versions of the tools that shape an artifact, read from package metadata (no import)."""

from __future__ import annotations

import functools
import importlib.metadata

from trtflow.util.reads import note_version


def tool_version(distribution: str) -> str | None:
    """Installed version of a package, read from its metadata (no import; remembered for the process)."""
    version = _remembered_version(distribution)
    note_version(distribution, version)
    return version


@functools.cache
def _remembered_version(distribution: str) -> str | None:
    return installed_version(distribution)


def installed_version(distribution: str) -> str | None:
    """Installed version of a package as its metadata says now (None if it is not installed)."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def ort_version() -> str | None:
    """Whichever ONNX Runtime distribution is installed (the CPU one or the GPU one, never both)."""
    return tool_version("onnxruntime") or tool_version("onnxruntime-gpu")
