"""What `trtflow inspect` reads: a package folder or .tar.gz, a manifest.json, or an engine file."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import ValidationError

from trtflow.archive import read_member
from trtflow.errors import TrtflowError
from trtflow.hashing import sha256_file
from trtflow.manifest import MANIFEST_FILE, Manifest


class InspectError(TrtflowError):
    exit_code = 3


def inspect_path(path: Path) -> dict:
    """{"kind": "package"|"manifest"|"engine", ...}: everything known about the file without a GPU."""
    if not path.exists():
        raise InspectError(f"{path}: no such file or folder")
    if path.is_dir():
        return {"kind": "package", "path": str(path), "manifest": _manifest(path / MANIFEST_FILE, (path / MANIFEST_FILE).read_bytes() if (path / MANIFEST_FILE).is_file() else None)}
    if path.name.endswith((".tar.gz", ".tgz")):
        return {"kind": "package", "path": str(path), "manifest": _manifest(path, read_member(path, "/" + MANIFEST_FILE))}
    if path.name.endswith(".json"):
        return {"kind": "manifest", "path": str(path), "manifest": _manifest(path, path.read_bytes())}
    return inspect_engine(path)


def _manifest(path: Path, data: bytes | None) -> dict:
    if data is None:
        raise InspectError(f"{path}: not a package (no {MANIFEST_FILE})")
    try:
        return json.loads(Manifest.model_validate_json(data).model_dump_json())
    except ValidationError as exc:
        first = exc.errors()[0]
        raise InspectError(f"{path}: not a trtflow manifest: {'.'.join(map(str, first['loc']))}: {first['msg']}") from None


def inspect_engine(path: Path) -> dict:
    """sha256 and size; and the manifest entry describing it when it sits inside a package folder."""
    digest = sha256_file(path)
    result = {"kind": "engine", "path": str(path), "sha256": digest, "size": path.stat().st_size, "manifest_entry": None}
    for folder in path.resolve().parents:
        if (folder / MANIFEST_FILE).is_file():
            manifest = _manifest(folder / MANIFEST_FILE, (folder / MANIFEST_FILE).read_bytes())
            entry = next((e for e in manifest["engines"] if e["sha256"] == digest), None)
            result["manifest_entry"] = entry
            result["recipe"] = manifest["recipe"]
            break
    return result
