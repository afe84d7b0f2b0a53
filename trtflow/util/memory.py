"""Memory a run may use and memory a stage is expected to need, so `-j N` never starts what the machine cannot hold.

Precision stages dominate: int8 of VGG-19 (a 548 MB model) peaks at 6.7 GB, about 12 bytes per byte of model, while
a build of the same model takes a few hundred MB. A stage's expectation is what it peaked at the last time it ran
(remembered in the store), else what its kind declares for the size of its model:

    >>> expected_peak((600 * MIB, 12.0), model_bytes=548 << 20, learned=None) / 2**30
    7.0078125
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

GIB, MIB = 1 << 30, 1 << 20
SHARE_OF_AVAILABLE = 0.9  # of the memory available when a run starts, what its stages may take together
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """`8G`, `512M`, `1.5GiB`, `1000000` -> bytes (ValueError naming the text when it is not a size)."""
    found = _SIZE.match(text)
    if not found:
        raise ValueError(f"{text!r} is not a size: write it like 8G, 512M or 1.5GiB")
    return int(float(found.group(1)) * 1024 ** "bkmgt".index((found.group(2) or "b").lower()))


def expected_peak(declared: tuple[int, float], model_bytes: int, learned: int | None) -> int:
    """What a stage is expected to peak at: its last measured peak, else what its kind declares (base bytes, bytes per
    model byte: stages.base.Stage.memory) for its model's size."""
    if learned:
        return learned
    base, per_byte = declared
    return int(base + per_byte * model_bytes)


def available_bytes() -> int | None:
    """Memory this process may still use: the smaller of MemAvailable and the cgroup's limit less its usage."""
    found = [value for value in (_meminfo_available(), _cgroup_room()) if value is not None]
    return min(found) if found else None


def _field(path: str, name: str) -> int | None:
    """The number after `name` on its line of a kernel key-value file (/proc/meminfo, memory.events...), or None."""
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(name):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def _meminfo_available() -> int | None:
    kib = _field("/proc/meminfo", "MemAvailable:")
    return kib * 1024 if kib is not None else None


def _cgroup_room() -> int | None:
    """memory.max - memory.current of this process's cgroup (v2), None when unlimited or unknown."""
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit == "max":
            return None
        return int(limit) - int(Path("/sys/fs/cgroup/memory.current").read_text())
    except (OSError, ValueError):
        return None


def oom_kills() -> int | None:
    """How many processes the kernel's OOM killer has killed in this cgroup (v2), None where it cannot be read."""
    return _field("/sys/fs/cgroup/memory.events", "oom_kill ")


def reset_peak() -> None:
    """Start this process's peak RSS afresh (Linux: 5 > /proc/self/clear_refs), so a pool worker's next stage is
    measured alone, not with the largest stage the worker ran before."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


# A stage whose process grew less than this keeps what it allocated: a collection costs 0.05-0.15 s once ONNX, ONNX
# Runtime (and ModelOpt, torch) are imported, more than a small stage itself takes.
RELEASE_ABOVE = 256 << 20


def rss() -> int | None:
    """This process's resident set size in bytes now (Linux), None elsewhere."""
    kib = _field("/proc/self/status", "VmRSS:")
    return None if kib is None else kib * 1024


@contextlib.contextmanager
def released_after(enabled: bool = True) -> Iterator[None]:
    """Around a block that runs a model tool: afterwards, `release_memory` from the RSS the block started at."""
    started = rss() if enabled else None
    yield
    release_memory(started)


def release_memory(since: int | None) -> None:
    """Free what model tools left behind and hand it back to the system, once the process has grown by RELEASE_ABOVE
    since `since` (its RSS at the stage's start): onnxslim's and ModelOpt's graphs are reference cycles (nodes and
    tensors point at each other) that the cyclic collector, counting objects rather than bytes, leaves for long (a
    cleanup of a 548 MB VGG-19 left 3.7 GB live after it returned: 0.7 GB after this), and glibc keeps freed heap
    (malloc_trim). A pool worker calls it after every stage, so the next starts from little."""
    now = rss()
    if since is None or now is None or now - since < RELEASE_ABOVE:
        return
    import gc

    gc.collect()
    malloc_trim = _glibc("malloc_trim")
    if malloc_trim is not None:  # else not glibc: what was freed stays with the process until it ends
        malloc_trim(0)


# glibc's malloc options (mallopt): M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3
KEEP_FREED = {_M_MMAP_THRESHOLD: 32 * MIB, _M_TRIM_THRESHOLD: 4 * GIB, _M_TOP_PAD: 256 * MIB}


def keep_freed_memory() -> bool:
    """Let this process (and the children it forks) reuse the memory it frees instead of handing it back and
    faulting it in again: arrays below 32 MiB come from the heap, not a fresh mapping each, and freed heap stays until
    `release_memory` trims it. A model tool's fresh child spent a second of its int8 stage (ResNet-18) in the kernel,
    zeroing pages it had just given back; the values computed are the same. glibc only: elsewhere nothing changes
    (False)."""
    mallopt = _glibc("mallopt")
    return mallopt is not None and all(mallopt(option, value) == 1 for option, value in KEEP_FREED.items())


_PR_SET_THP_DISABLE = 41  # prctl's option: this process and its children get no transparent huge pages


def without_huge_pages() -> bool:
    """Stop this process, and the children it forks, from backing its memory with transparent huge pages, whatever
    malloc asks (prctl PR_SET_THP_DISABLE; the glibc tunable of util.settings.tool_overlay notwithstanding). Linux
    only: elsewhere, or where the kernel refuses, nothing changes (False)."""
    import ctypes

    prctl = _glibc("prctl")
    flags = [ctypes.c_ulong(value) for value in (1, 0, 0, 0)]  # prctl reads them as unsigned longs: no stray bits
    return prctl is not None and prctl(_PR_SET_THP_DISABLE, *flags) == 0


def _glibc(function: str) -> Any:
    """glibc's `function` through ctypes, or None where the C library is not glibc."""
    try:
        import ctypes

        return getattr(ctypes.CDLL("libc.so.6"), function)
    except (OSError, AttributeError):
        return None


def peak_rss() -> int | None:
    """This process's peak resident set size in bytes since its start or the last reset_peak (VmHWM)."""
    kib = _field("/proc/self/status", "VmHWM:")
    if kib is not None:
        return kib * 1024
    try:
        import resource
    except ImportError:
        return None
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def shown(count: int | None) -> str:
    """`17.7 GB`, `512 MB`: a byte count as the user reads it (decimal units, like `free -h` and the README)."""
    if count is None:
        return "unknown"
    return f"{count / 1e9:.1f} GB" if count >= 1e9 else f"{count / 1e6:.0f} MB"
