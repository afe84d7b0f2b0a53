"""Plugin libraries on a device: does it have each one an engine needs, and what provision installs beside the engine.

An engine's manifest entry lists its plugins by name and sha256. The device has one when a file in `--plugin-dir`
has that sha256 (used from there: recorded in provision.json, not copied), or when the package carries it (installed
beside the engine as `<dest>/<recipe>/<sha256>/plugins/<plugin sha256>-<name>`, its sha256 checked while copied).
An engine whose plugin is neither is refused with the reason, so the choice falls to another engine:

    needs plugin libx.so sha256 4bd0c1...: not in --plugin-dir and not carried
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from trtflow.errors import BadPluginDir
from trtflow.manifest import Engine, Plugin

CHUNK = 1 << 20
Copy = Callable[[BinaryIO], None]


class PluginDir:
    """The regular files directly in --plugin-dir, found by sha256 (a file is hashed only if its size matches)."""

    def __init__(self, path: Path):
        if not path.is_dir():
            raise BadPluginDir(f"--plugin-dir {path}: not a folder")
        try:
            self._files = {entry: entry.stat().st_size for entry in sorted(path.iterdir()) if entry.is_file()}
        except OSError as exc:
            raise BadPluginDir(f"--plugin-dir {path}: cannot read it: {exc.strerror or exc}") from exc
        self.path = path
        self._digests: dict[Path, str] = {}

    def find(self, plugin: Plugin) -> Path | None:
        """The file with the plugin's sha256, or None."""
        for entry, size in self._files.items():
            if size == plugin.size and self._digest(entry) == plugin.sha256:
                return entry
        return None

    def _digest(self, entry: Path) -> str:
        if entry not in self._digests:
            digest = hashlib.sha256()
            with open(entry, "rb") as source:
                for chunk in iter(lambda: source.read(CHUNK), b""):
                    digest.update(chunk)
            self._digests[entry] = digest.hexdigest()
        return self._digests[entry]


def missing_plugin(engine: Engine, plugins: PluginDir | None) -> str | None:
    """Why the device cannot load the engine for want of a plugin, or None when it has (or will get) every one."""
    for plugin in engine.plugins:
        if plugin.carried or (plugins is not None and plugins.find(plugin) is not None):
            continue
        where = "not in --plugin-dir" if plugins is not None else "no --plugin-dir given"
        return f"needs plugin {plugin.name} sha256 {plugin.sha256}: {where} and not carried"
    return None


def plugin_installs(
    engine: Engine, plugins: PluginDir | None, copy: Callable[[Plugin, BinaryIO], None]
) -> tuple[list[dict], dict[str, tuple[int, Copy]]]:
    """(provision.json's `plugins`, the files to install in the version folder: relative path -> (size, copy)).

    A plugin found in --plugin-dir is used from there; a carried one is installed beside the engine."""
    records: list[dict] = []
    files: dict[str, tuple[int, Copy]] = {}
    for plugin in engine.plugins:
        found = plugins.find(plugin) if plugins is not None else None
        entry = {"name": plugin.name, "sha256": plugin.sha256, "size": plugin.size}
        if found is not None:
            records.append({**entry, "source": "plugin-dir", "path": str(found.resolve())})
            continue
        files[plugin.file] = (plugin.size, functools.partial(copy, plugin))
        records.append({**entry, "source": "package", "file": plugin.file})
    return records, files
