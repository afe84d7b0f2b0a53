"""What `trtflow inspect` reads: a package folder or .tar.gz, a manifest.json, or an engine file."""

from __future__ import annotations

import json
from pathlib import Path

from trtflow.deploy.provision import BadPackage, load_package
from trtflow.hashing import sha256_file
from trtflow.manifest import MANIFEST_FILE, manifest_bytes


def inspect_path(path: Path) -> dict:
    """{"kind": "package"|"manifest"|"engine", ...}: everything known about the file without a GPU."""
    if path.is_file() and not path.name.endswith((".tar.gz", ".tgz", ".json")):
        return inspect_engine(path)
    manifest = json.loads(manifest_bytes(load_package(path).manifest))
    return {"kind": "manifest" if path.name.endswith(".json") else "package", "path": str(path), "manifest": manifest}


# The first four bytes of a serialized engine (seen in engines built here and by TensorRT 10).
ENGINE_MAGIC = {b"vtrt": "TensorRT-RTX engine", b"ftrt": "TensorRT engine"}


def engine_format(path: Path) -> str:
    """What the header says the file is, without loading TensorRT or needing a GPU."""
    with open(path, "rb") as handle:
        return ENGINE_MAGIC.get(handle.read(4), "not a TensorRT engine (unknown header)")


def inspect_engine(path: Path) -> dict:
    """Header format, sha256 and size; and the manifest entry describing it when it sits inside a package."""
    digest = sha256_file(path)
    result = {
        "kind": "engine",
        "path": str(path),
        "format": engine_format(path),
        "sha256": digest,
        "size": path.stat().st_size,
        "manifest_entry": None,
    }
    for folder in path.resolve().parents:
        if (folder / MANIFEST_FILE).is_file():
            try:
                manifest = load_package(folder / MANIFEST_FILE).manifest
            except BadPackage:
                break
            entry = next((e for e in manifest.engines if e.sha256 == digest), None)
            result["manifest_entry"] = entry.as_json() if entry else None
            result["recipe"] = manifest.recipe
            break
    return result
