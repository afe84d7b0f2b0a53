"""The toolchain a lock was made with: the exact tool versions its stage keys name, as pip requirements.

A release build reproduces only with the tools that made its lock: trtflow.lock holds each stage's fingerprint
(backend and version, ONNX, ONNX Runtime, onnxslim, ModelOpt, numpy, torch...), so the lock *is* the toolchain's
pin. `trtflow toolchain` prints it as a requirements file, `trtflow doctor` holds the installed tools to it, and
`run --frozen` names each tool that differs and the command that installs the locked ones:

    $ trtflow toolchain
    nvidia-modelopt==0.47.0
    onnx==1.21.0
    ...
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from trtflow.backends.base import BACKENDS
from trtflow.errors import ProjectError
from trtflow.store.lockfile import LOCK_FILE, LockEntry, read_lock
from trtflow.util.versions import installed_version

# Fingerprint field -> the distributions that provide it, the first the one to install (the others, alternatives
# installed instead: ONNX Runtime's GPU build, the `tensorflow` package). Backends are named by the `backend` field.
TOOL_DISTRIBUTIONS: dict[str, tuple[str, ...]] = {
    "onnx": ("onnx",),
    "onnxruntime": ("onnxruntime", "onnxruntime-gpu"),
    "onnxslim": ("onnxslim",),
    "numpy": ("numpy",),
    "modelopt": ("nvidia-modelopt",),
    "pillow": ("pillow",),
    "torch": ("torch",),
    "onnxscript": ("onnxscript",),
    "tensorflow": ("tensorflow-cpu", "tensorflow"),
    "keras": ("keras",),
    "tf2onnx": ("tf2onnx",),
}
PLAIN_VERSION = re.compile(r"[A-Za-z0-9.+!_-]{1,64}")
INSTALL_HINT = "trtflow toolchain > toolchain.txt && pip install -r toolchain.txt"


@dataclass(frozen=True)
class Tool:
    """One tool the lock names: its distribution (and alternatives), the locked version, the stages that name it."""

    distributions: tuple[str, ...]
    version: str
    named_by: tuple[str, ...]

    @property
    def name(self) -> str:
        """The distribution to install."""
        return self.distributions[0]

    def installed(self) -> str | None:
        """The installed version of the first distribution found, or None."""
        return next(filter(None, (installed_version(d) for d in self.distributions)), None)


def locked_tools(lock: dict[str, LockEntry]) -> list[Tool]:
    """Every tool the lock's fingerprints name, with its one version (ProjectError when stages disagree)."""
    found: dict[tuple[str, ...], dict[str, list[str]]] = {}
    for node_id, entry in sorted(lock.items()):
        for distributions, version in _entry_tools(node_id, entry):
            found.setdefault(distributions, {}).setdefault(version, []).append(node_id)
    tools = []
    for distributions, versions in sorted(found.items()):
        if len(versions) > 1:
            shown = "; ".join(f"{v} ({nodes[0]})" for v, nodes in sorted(versions.items()))
            raise ProjectError(
                f"{LOCK_FILE}: stages name several versions of {distributions[0]}: {shown}; run `trtflow run` to relock"
            )
        [(version, nodes)] = versions.items()
        tools.append(Tool(distributions, version, tuple(nodes)))
    return tools


def _entry_tools(node_id: str, entry: LockEntry) -> list[tuple[tuple[str, ...], str]]:
    """(distributions, version) of each tool one lock entry's fingerprint names; ProjectError for a version that is
    not a plain PEP 440 version or a backend this trtflow does not know (`pip install -r` must read nothing else)."""
    fingerprint = entry.components.get("fingerprint") or {}
    tools = [
        (TOOL_DISTRIBUTIONS[field], _version(node_id, field, version))
        for field, version in fingerprint.items()
        if field in TOOL_DISTRIBUTIONS and version is not None
    ]
    backend, version = fingerprint.get("backend"), fingerprint.get("backend_version")
    if backend is not None:
        if backend not in BACKENDS:
            raise ProjectError(
                f"{LOCK_FILE}: {node_id}: fingerprint.backend {str(backend)[:80]!r} is not a backend of this trtflow "
                f"({', '.join(sorted(BACKENDS))}); restore the lock from version control"
            )
        tools.append(((BACKENDS[backend].distribution,), _version(node_id, "backend_version", version)))
    return tools


def _version(node_id: str, field: str, value: object) -> str:
    """`value` if it is a plain PEP 440 version (digits, letters, `.+!-_` only: no space, marker, option or line)."""
    from packaging.version import InvalidVersion, Version

    try:
        if isinstance(value, str) and PLAIN_VERSION.fullmatch(value):
            Version(value)
            return value
    except InvalidVersion:
        pass
    raise ProjectError(
        f"{LOCK_FILE}: {node_id}: fingerprint.{field} {str(value)[:80]!r} is not a version (PEP 440); restore the lock "
        "from version control"
    )


def read_tools(root: Path) -> list[Tool]:
    """The tools of the project's trtflow.lock (ProjectError when there is none)."""
    lock = read_lock(root / LOCK_FILE)
    if lock is None:
        raise ProjectError(f"{LOCK_FILE}: not found in {root}: run `trtflow run` once and commit it")
    return locked_tools(lock)


def requirements(tools: list[Tool]) -> str:
    """A pip requirements file pinning each tool to its locked version (`pip install -r` installs exactly those)."""
    lines = [f"# the tools {LOCK_FILE}'s stage keys name, at the versions it was made with: pip install -r <this file>"]
    # without a local label: torch 2.13.0+cpu is pinned as ==2.13.0, which the CPU build and PyPI's build both meet
    return "\n".join(lines + [f"{tool.name}=={tool.version.split('+')[0]}" for tool in tools]) + "\n"


def differences(tools: list[Tool]) -> list[str]:
    """`onnxslim: trtflow.lock has 0.1.98, 0.1.97 is installed` for each tool that differs, one line each."""
    lines = []
    for tool in tools:
        installed = tool.installed()
        if installed != tool.version:
            now = f"{installed} is installed" if installed else "it is not installed"
            lines.append(f"{tool.name}: {LOCK_FILE} has {tool.version}, {now}")
    return lines


def check_installed(lock: dict[str, LockEntry]) -> None:
    """Refuse (one error listing every tool) a toolchain that differs from the lock's, with the command that fixes
    it."""
    lines = differences(locked_tools(lock))
    if lines:
        raise ProjectError(
            f"{LOCK_FILE}: the installed tools differ from the ones it was made with (--frozen):\n"
            + "\n".join(f"  {line}" for line in lines)
            + f"\ninstall the locked ones: {INSTALL_HINT}"
        )
