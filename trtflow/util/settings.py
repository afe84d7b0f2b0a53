"""The one place trtflow reads its process environment: what a hermetic worker may inherit, and nothing else.

Everything else comes from pipeline.yaml, recipes and the command line. A hermetic build worker gets a fixed,
minimal environment so its engine depends on the inputs, not on the shell it was started from; only the
variables a backend needs to find the GPU and its libraries are passed through (their names are recorded).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

# Fixed for every worker that makes an output (pool, isolated and hermetic alike): string hashing, and so set and
# dict-of-set order, and the locale do not follow the shell the run was started from.
PINNED = {"PYTHONHASHSEED": "0", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
# Fixed for every hermetic worker: PATH for helper tools, plus the pinned variables.
HERMETIC_BASE = {"PATH": "/usr/local/bin:/usr/bin:/bin", **PINNED}
# For the model tools' workers only (export, cleanup, precision; a build's environment stays minimal): glibc's malloc
# asks for transparent huge pages for what it maps (THP in `madvise` mode, Debian's and Ubuntu's default; nothing
# changes where THP is `always` or `never`, or the C library is not glibc). A tool that copies a 440 MB model through
# fresh memory again and again then takes a fault per 2 MiB, not per 4 KiB: BERT-base's int8 stage 59-64 s -> 53 s
# (6.0 M page faults -> 0.1 M), the same bytes and peak (docs/memory.md). A tunable the user set is kept. A cleanup,
# export or precision stage of small inputs gives them up again in its own worker (Stage.huge_pages_above).
HUGE_PAGE_MALLOC = ("glibc.malloc.hugetlb", "1")
# Passed through when set: where the GPU driver's and CUDA's libraries are, which GPUs a process may use.
PASSED_THROUGH = ("LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "CUDA_HOME")


@dataclass(frozen=True)
class Settings:
    """The environment variables trtflow uses, read once."""

    passed_through: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Read the process environment (or `environ`)."""
        source = os.environ if environ is None else environ
        return cls(passed_through={name: source[name] for name in PASSED_THROUGH if name in source})

    def hermetic_env(self) -> dict[str, str]:
        """The whole environment of a hermetic worker."""
        return {**HERMETIC_BASE, **self.passed_through}

    @staticmethod
    def pinned_env() -> dict[str, str]:
        """The environment of an isolated worker (it runs user code, which may need the user's variables): this
        process's, with tool_overlay's variables."""
        return {**os.environ, **tool_overlay(os.environ)}


def tool_overlay(environ: Mapping[str, str]) -> dict[str, str]:
    """What a model tool's worker sets over `environ`: the pinned variables and glibc's huge-page malloc."""
    name, value = HUGE_PAGE_MALLOC
    tunables = environ.get("GLIBC_TUNABLES", "")
    if name not in tunables:
        tunables = f"{tunables}:{name}={value}" if tunables else f"{name}={value}"
    return {**PINNED, "GLIBC_TUNABLES": tunables}


@contextlib.contextmanager
def pinned_environ() -> Iterator[None]:
    """While worker processes are spawned (multiprocessing takes no environment of its own): this process's environment
    with tool_overlay's variables, restored afterwards. Python reads PYTHONHASHSEED once, at start-up, so this
    process's own hashing is unchanged; only children started inside see it."""
    overlay = tool_overlay(os.environ)
    saved = {name: os.environ.get(name) for name in overlay}
    os.environ.update(overlay)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
