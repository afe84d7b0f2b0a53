"""The GPUs of this machine, as compute capabilities (`sm_86`), from nvidia-smi.

Remembered for the process: planning asks for it on every run (a verify result depends on whether
an engine could be executed here), so the common no-GPU case costs one PATH lookup.
"""

from __future__ import annotations

import functools
import shutil
import subprocess

from trtflow.util.cc import ComputeCapability


@functools.cache
def local_compute_capabilities() -> tuple[ComputeCapability, ...]:
    """query_compute_capabilities(), asked once per process (planning needs it for every verify node)."""
    return query_compute_capabilities()


def query_compute_capabilities() -> tuple[ComputeCapability, ...]:
    """Sorted distinct compute capabilities of the local GPUs; empty when there is none (or no driver)."""
    if shutil.which("nvidia-smi") is None:
        return ()
    try:
        result = subprocess.run(
            ["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return ()
    if result.returncode != 0:
        return ()
    return tuple(sorted({ComputeCapability.parse(line) for line in result.stdout.splitlines() if line.strip()}))


def no_gpu_reason() -> str:
    """Why nothing can run on a GPU here, in words for a record or an error."""
    if shutil.which("nvidia-smi") is None:
        return "no GPU: nvidia-smi not found"
    return "no GPU: nvidia-smi lists none or fails"
