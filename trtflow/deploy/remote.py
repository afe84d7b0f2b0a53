"""Packages behind an fsspec URL: `trtflow publish` writes one, `trtflow provision URL` reads one engine of it.

Layout at the URL (the package folder's own):

    manifest.json               written last, so a reader never sees a manifest before its engines
    SHA256SUMS
    engines/<target>/<recipe>-<precision>.engine
    provenance.intoto.jsonl     the package's signed provenance, when it has one

A provision reads `manifest.json`, then streams only the chosen engine (and the provenance with
--require-signature); `Transfer` counts every byte read, for the record. Publishing skips an engine the remote's
SHA256SUMS already lists with the same digest and whose size matches: republishing a package with one new engine
sends that engine and the small files.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO, Iterator, Optional

from trtflow.errors import EnvironmentProblem, TrtflowError
from trtflow.hashing import sha256_file
from trtflow.manifest import MANIFEST_FILE, SUMS_FILE, Manifest
from trtflow.util.fsurl import filesystem, one_line, protocols, redacted

CHUNK = 1 << 20
PROVENANCE_FILE = "provenance.intoto.jsonl"


class RemoteUnreachable(EnvironmentProblem):
    """The package URL could not be read or written (network, credentials, permissions)."""


class NotPublishable(TrtflowError):
    """`trtflow publish` was given something that is not an intact package folder."""

    exit_code = 3


@dataclass
class Transfer:
    """Bytes read from the remote, per file: what a provision cost the network."""

    files: dict[str, int] = field(default_factory=dict)

    def add(self, name: str, size: int) -> None:
        self.files[name] = self.files.get(name, 0) + size

    @property
    def total(self) -> int:
        return sum(self.files.values())


class RemoteFolder:
    """A package folder behind a URL: read a file whole (small) or as a stream, each byte counted."""

    def __init__(self, url: str, options: Optional[dict] = None):
        self.url = url.rstrip("/")
        self.shown = redacted(self.url)
        self.transfer = Transfer()
        self._fs, self._base = filesystem(self.url, dict(options or {}), "a package URL")

    def where(self, relative: str) -> str:
        """The file's URL as messages show it."""
        return f"{self.shown}/{relative}"

    def read(self, relative: str, limit: int) -> Optional[bytes]:
        """The file's bytes (None if it does not exist); more than `limit` bytes is refused."""
        with self.open(relative) as source:
            data = source.read(limit + 1)
        if len(data) > limit:
            raise RemoteUnreachable(f"{self.where(relative)}: larger than {limit} bytes; not a trtflow package file")
        return data

    @contextlib.contextmanager
    def open(self, relative: str) -> Iterator[BinaryIO]:
        """A counted read stream of the file; FileNotFoundError if it is not there, RemoteUnreachable for the rest."""
        try:
            handle = self._fs.open(f"{self._base}/{relative}", "rb", block_size=CHUNK, cache_type="none")
        except FileNotFoundError:
            raise
        except Exception as exc:
            raise RemoteUnreachable(f"{self.where(relative)}: cannot read: {one_line(exc)}") from None
        try:
            yield _Counted(handle, relative, self)
        finally:
            handle.close()

    # writing ----------------------------------------------------------------------------
    def listed_sums(self) -> dict[str, str]:
        """The remote's SHA256SUMS as {path: sha256} ({} if it has none or it cannot be parsed)."""
        try:
            text = self.read(SUMS_FILE, 16 << 20) or b""
        except (FileNotFoundError, RemoteUnreachable):
            return {}
        sums = {}
        for line in text.decode("utf-8", "replace").splitlines():
            digest, _, name = line.partition("  ")
            if len(digest) == 64 and name:
                sums[name] = digest
        return sums

    def size(self, relative: str) -> Optional[int]:
        """The remote file's size, None when it is not there."""
        try:
            return int(self._fs.info(f"{self._base}/{relative}")["size"])
        except FileNotFoundError:
            return None
        except Exception as exc:
            raise RemoteUnreachable(f"{self.where(relative)}: cannot read: {one_line(exc)}") from None

    def put(self, source: Path | bytes, relative: str) -> int:
        """Write one file at the URL (a single PUT on object stores); its size."""
        target = f"{self._base}/{relative}"
        self._refuse_links(relative)
        try:
            parent = target.rsplit("/", 1)[0]
            if "file" in protocols(self._fs):
                self._fs.makedirs(parent, exist_ok=True)
            if isinstance(source, bytes):
                self._fs.pipe_file(target, source)
                return len(source)
            self._fs.put_file(str(source), target)
            return source.stat().st_size
        except Exception as exc:
            raise RemoteUnreachable(f"{self.where(relative)}: cannot write: {one_line(exc)}") from None


    def _refuse_links(self, relative: str) -> None:
        """In a local folder, a symlink on the way to a file to write (`engines` -> elsewhere, a link named like an
        engine) is refused: publishing never writes through one."""
        if "file" not in protocols(self._fs):
            return
        path = Path(self._base)
        for part in PurePosixPath(relative).parts:
            path = path / part
            if path.is_symlink():
                raise NotPublishable(f"{self.where(relative)}: {path} is a symlink; refusing to write through it (remove it)")


class _Counted:
    """A read stream that adds what it reads to its folder's Transfer."""

    def __init__(self, handle: Any, name: str, folder: RemoteFolder):
        self._handle, self._name, self._folder = handle, name, folder

    def read(self, size: int = -1) -> bytes:
        try:
            data = self._handle.read(size)
        except Exception as exc:
            raise RemoteUnreachable(f"{self._folder.where(self._name)}: reading failed: {one_line(exc)}") from None
        self._folder.transfer.add(self._name, len(data))
        return data


def publish(package: Path, url: str, provenance: Optional[Path], options: Optional[dict] = None) -> dict:
    """Upload a package folder to `url`: engines (checked against the manifest) first, manifest.json last."""
    manifest_path = package / MANIFEST_FILE
    if not package.is_dir() or not manifest_path.is_file():
        hint = " (publish the package folder, not its archive: provision fetches single engines)" if package.name.endswith(".tar.gz") else ""
        raise NotPublishable(f"{package}: not a package folder with a {MANIFEST_FILE}{hint}")
    manifest_bytes = manifest_path.read_bytes()
    try:
        manifest = Manifest.model_validate_json(manifest_bytes)
    except ValueError as exc:
        raise NotPublishable(f"{manifest_path}: not a trtflow manifest ({type(exc).__name__}); rebuild it with `trtflow run`") from None
    remote = RemoteFolder(url, options)
    listed = remote.listed_sums()
    sent, skipped = [], []
    for engine in manifest.engines:
        path = _engine_file(package, engine.file)
        if path.stat().st_size != engine.size or sha256_file(path) != engine.sha256:
            raise NotPublishable(f"{path}: does not match the sha256 and size {MANIFEST_FILE} records; rebuild the package with `trtflow run`")
        if listed.get(engine.file) == engine.sha256 and remote.size(engine.file) == engine.size:
            skipped.append(engine.file)
            continue
        remote.put(path, engine.file)
        sent.append(engine.file)
    small = [(p, name) for p, name in ((package / SUMS_FILE, SUMS_FILE), (provenance, PROVENANCE_FILE)) if p is not None and p.is_file()]
    for path, name in small:
        remote.put(path, name)
    remote.put(manifest_bytes, MANIFEST_FILE)
    return {"package": str(package), "url": remote.shown, "recipe": manifest.recipe, "engines_sent": sent, "engines_unchanged": skipped,
            "files_sent": len(sent) + len(small) + 1,
            "bytes_sent": sum(e.size for e in manifest.engines if e.file in sent) + sum(p.stat().st_size for p, _ in small) + len(manifest_bytes)}


def _engine_file(package: Path, file: str) -> Path:
    """The engine's path inside the package folder; refused when the manifest points elsewhere."""
    parts = PurePosixPath(file).parts
    path = package.joinpath(*parts)
    if file.startswith("/") or ".." in parts or not path.is_file() or not path.resolve().is_relative_to(package.resolve()):
        raise NotPublishable(f"{package}: manifest names engine file {file!r}, which is missing or outside the package; rebuild it with `trtflow run`")
    return path
