"""Where a distributed run's stage inputs and outputs travel: objects by sha256, re-hashed by whoever fetches them.

Layout: `<location>/objects/<aa>/<sha256>`, the remote cache's layout, so the remote cache can be the exchange.
`location` is an absolute folder every node sees (or file:///...) or any fsspec URL (s3://bucket/prefix). An
object is written under a temporary name and renamed (or put in one request), so a reader never sees half of
one; bytes that do not hash to their name are refused.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

from trtflow.hashing import CHUNK, sha256_file


class Exchange:
    """Content-addressed objects in a shared folder or behind an fsspec URL."""

    def __init__(self, location: str, options: dict | None = None):
        self.location = location
        self._folder: Path | None = None
        self._fs: Any = None
        if "://" not in location or location.startswith("file://"):
            self._folder = Path(location.removeprefix("file://"))
        else:
            from trtflow.util.fsurl import filesystem

            self._fs, self._base = filesystem(location, dict(options or {}), "the exchange")

    def put(self, path: Path, digest: str | None = None) -> str:
        """Make the file's bytes available as an object (nothing if already there); its digest (hashed if not given)."""
        digest = digest or sha256_file(path)
        relative = f"objects/{digest[:2]}/{digest}"
        if self._folder is not None:
            target = self._folder / relative
            if not target.is_file():
                target.parent.mkdir(parents=True, exist_ok=True)
                temporary = target.with_name(f".{digest}.{uuid.uuid4().hex}.tmp")
                shutil.copyfile(path, temporary)
                os.replace(temporary, target)
            return digest
        remote = f"{self._base}/{relative}"
        if not self._fs.exists(remote):
            self._fs.put_file(str(path), remote)
        return digest

    def get(self, digest: str, target: Path) -> Path:
        """Fetch an object to `target`, hashing while it is written; ValueError if the bytes are not `digest`."""
        relative = f"objects/{digest[:2]}/{digest}"
        temporary = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")
        hasher = hashlib.sha256()
        try:
            with self._open(relative) as source, open(temporary, "wb") as sink:
                for chunk in iter(lambda: source.read(CHUNK), b""):
                    hasher.update(chunk)
                    sink.write(chunk)
            if hasher.hexdigest() != digest:
                raise ValueError(
                    f"object {digest[:16]}... in {self.location} holds other bytes (sha256 "
                    f"{hasher.hexdigest()[:16]}...)"
                )
            os.replace(temporary, target)
        finally:
            temporary.unlink(missing_ok=True)
        return target

    def _open(self, relative: str) -> Any:
        if self._folder is not None:
            return open(self._folder / relative, "rb")
        return self._fs.open(f"{self._base}/{relative}", "rb")
