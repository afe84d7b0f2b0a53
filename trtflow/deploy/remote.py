"""Packages behind an fsspec URL: `trtflow publish` writes them, `trtflow provision URL` reads one engine of one.

The layout at the URL is content-addressed (deploy/channels.py writes and reads it):

    engines/<sha256>.engine                      every engine of every version, named by its bytes' digest
    versions/<v>/manifest.json                   v = sha256 of these exact bytes: immutable once written
    versions/<v>/provenance.intoto.jsonl         the version's signed provenance, when it has one
    versions/<v>/SHA256SUMS
    channels/<name>.json                         {"history": [v, previous, ...], "share_bp": ...}: flipped last
    devices/<device-id>.json                     what each device's agent last reported (deploy/fleet.py)

Nothing a published version names is ever rewritten: a republish adds engines and a version, then flips the small
channel pointer, so a reader sees the old version whole or the new one whole. Remotes written by earlier trtflow
releases (`manifest.json` and `engines/<target>/...` at the URL itself) are still read by `provision`.
A provision reads the channel (a conditional GET: nothing new costs one request and no body), the chosen version's
manifest, then streams only the chosen engine; `Transfer` counts every byte read, for the record.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO, Protocol

from trtflow.errors import BadChannel, NotPublishable, RemoteUnreachable
from trtflow.util.fs import NotRegular, open_regular
from trtflow.util.fsurl import filesystem, one_line, protocols, redacted

CHUNK = 1 << 20
TEMP_SUFFIX = ".tmp"  # `.<name>.<hex>.tmp`: a write in progress (or one a crash left); readers skip it, gc sweeps it
PROVENANCE_FILE = "provenance.intoto.jsonl"


@dataclass
class Transfer:
    """Bytes read from the remote, per file: what a provision cost the network."""

    files: dict[str, int] = field(default_factory=dict)
    not_modified: list[str] = field(default_factory=list)  # conditional reads answered "not modified" (no body)

    def add(self, name: str, size: int) -> None:
        """Count one fetched file and its bytes."""
        self.files[name] = self.files.get(name, 0) + size

    @property
    def total(self) -> int:
        """Bytes fetched so far."""
        return sum(self.files.values())


class RemoteFolder:
    """A package folder behind a URL: read a file whole (small) or as a stream, each byte counted."""

    def __init__(self, url: str, options: dict | None = None):
        self.url = url.rstrip("/")
        self.shown = redacted(self.url)
        self.transfer = Transfer()
        self._fs, self._base = filesystem(self.url, dict(options or {}), "a package URL")

    def where(self, relative: str) -> str:
        """The file's URL as messages show it."""
        return f"{self.shown}/{relative}"

    def read(self, relative: str, limit: int) -> bytes | None:
        """The file's bytes (None if it does not exist); more than `limit` bytes is refused."""
        with self.open(relative) as source:
            data = source.read(limit + 1)
        if len(data) > limit:
            raise RemoteUnreachable(f"{self.where(relative)}: larger than {limit} bytes; not a trtflow package file")
        return data

    @contextlib.contextmanager
    def open(self, relative: str) -> Iterator[ReadStream]:
        """A counted read stream of the file; FileNotFoundError if it is not there, RemoteUnreachable for the rest."""
        try:
            handle = (
                _open_regular(f"{self._base}/{relative}")
                if "file" in protocols(self._fs)
                else self._fs.open(f"{self._base}/{relative}", "rb", block_size=CHUNK, cache_type="none")
            )
        except FileNotFoundError:
            raise
        except (RemoteUnreachable, BadChannel):
            raise
        except Exception as exc:
            raise RemoteUnreachable(f"{self.where(relative)}: cannot read: {one_line(exc)}") from exc
        try:
            yield _Counted(handle, relative, self)
        finally:
            handle.close()

    def read_if_changed(self, relative: str, tag: str | None, limit: int) -> tuple[str | None, bytes | None]:
        """(tag, bytes) of a small file, or (tag, None) when its tag is still `tag` (nothing read). A tag is the
        object's ETag (S3: one GET with If-None-Match, answered 304 without a body), else size and mtime (a stat).
        FileNotFoundError if it is not there."""
        if "s3" in protocols(self._fs) or "s3a" in protocols(self._fs):
            return self._s3_read_if_changed(relative, tag, limit)
        try:
            info = self._fs.info(f"{self._base}/{relative}")
        except FileNotFoundError:
            raise
        except Exception as exc:
            raise RemoteUnreachable(f"{self.where(relative)}: cannot read: {one_line(exc)}") from exc
        current = str(
            info.get("ETag")
            or info.get("etag")
            or f"{info.get('size')}:{info.get('mtime') or info.get('LastModified')}"
        )
        if tag is not None and current == tag:
            self.transfer.not_modified.append(relative)
            return current, None
        return current, self.read(relative, limit)

    def _s3_read_if_changed(self, relative: str, tag: str | None, limit: int) -> tuple[str | None, bytes | None]:
        """One GetObject, with IfNoneMatch when a tag is known (s3fs has no conditional read: its botocore client
        does)."""
        from botocore.exceptions import ClientError
        from fsspec.asyn import sync

        bucket, key, _ = self._fs.split_path(f"{self._base}/{relative}")

        async def get() -> tuple[str | None, bytes | None]:
            await self._fs.set_session()
            client = await self._fs.get_s3(bucket)
            try:
                answer = await client.get_object(Bucket=bucket, Key=key, **({"IfNoneMatch": tag} if tag else {}))
            except ClientError as exc:
                code = str(exc.response.get("Error", {}).get("Code"))
                if code == "304":
                    return tag, None
                if code in ("NoSuchKey", "404"):
                    raise FileNotFoundError(self.where(relative)) from exc
                raise
            async with answer["Body"] as body:
                return answer.get("ETag"), await body.read(limit + 1)

        try:
            got_tag, data = sync(self._fs.loop, get)
        except FileNotFoundError:
            raise
        except Exception as exc:
            raise RemoteUnreachable(f"{self.where(relative)}: cannot read: {one_line(exc)}") from exc
        if data is None:
            self.transfer.not_modified.append(relative)
            return got_tag, None
        self.transfer.add(relative, len(data))
        if len(data) > limit:
            raise RemoteUnreachable(f"{self.where(relative)}: larger than {limit} bytes; not a trtflow package file")
        return got_tag, data

    def listing(self, relative: str) -> list[dict]:
        """fsspec's info of every entry of a folder at the URL ([] if there is none)."""
        try:
            return list(self._fs.ls(f"{self._base}/{relative}", detail=True))
        except FileNotFoundError:
            return []
        except Exception as exc:
            raise RemoteUnreachable(f"{self.where(relative)}: cannot list: {one_line(exc)}") from exc

    def name_of(self, info: dict) -> str:
        """The last part of a listed entry's path."""
        return str(info["name"]).rstrip("/").rsplit("/", 1)[-1]

    def remove(self, relative: str) -> None:
        """Delete a file or a folder (recursively) at the URL; nothing if it is gone."""
        self.refuse_links(relative)
        try:
            self._fs.rm(f"{self._base}/{relative}", recursive=True)
        except FileNotFoundError:
            pass
        except Exception as exc:
            raise RemoteUnreachable(f"{self.where(relative)}: cannot delete: {one_line(exc)}") from exc

    # writing ----------------------------------------------------------------------------
    def size(self, relative: str) -> int | None:
        """The remote file's size, None when it is not there."""
        try:
            return int(self._fs.info(f"{self._base}/{relative}")["size"])
        except FileNotFoundError:
            return None
        except Exception as exc:
            raise RemoteUnreachable(f"{self.where(relative)}: cannot read: {one_line(exc)}") from exc

    def put(self, source: Path | bytes, relative: str) -> int:
        """Write one file at the URL (a single PUT on object stores); its size."""
        target = f"{self._base}/{relative}"
        self.refuse_links(relative)
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
            raise RemoteUnreachable(f"{self.where(relative)}: cannot write: {one_line(exc)}") from exc

    def put_atomic(self, data: bytes, relative: str) -> int:
        """Write a small file so a reader sees the old bytes or the new ones: one PUT on an object store, a
        temporary file renamed over it in a folder."""
        if "file" not in protocols(self._fs):
            return self.put(data, relative)
        folder, _, name = relative.rpartition("/")
        temporary = f"{folder + '/' if folder else ''}.{name}.{uuid.uuid4().hex}{TEMP_SUFFIX}"
        try:
            self.put(data, temporary)
            self.refuse_links(relative)
            # rename(2): replaces a link, never follows it
            Path(f"{self._base}/{temporary}").replace(f"{self._base}/{relative}")
        except OSError as exc:
            raise RemoteUnreachable(f"{self.where(relative)}: cannot write: {one_line(exc)}") from exc
        finally:  # a refused or failed write leaves nothing behind (after the rename, there is nothing to remove)
            Path(f"{self._base}/{temporary}").unlink(missing_ok=True)
        return len(data)

    def temporaries(self) -> list[tuple[str, float]]:
        """(relative path, modified time) of every temporary file a writer left in a local remote's channels,
        devices and version folders (on an object store a write is one PUT: there are none)."""
        if "file" not in protocols(self._fs):
            return []
        base = Path(self._base)
        found = [*base.glob(f"channels/.*{TEMP_SUFFIX}"), *base.glob(f"devices/.*{TEMP_SUFFIX}")]
        found += base.glob(f"versions/*/.*{TEMP_SUFFIX}")
        return sorted(
            (p.relative_to(base).as_posix(), p.lstat().st_mtime)
            for p in found
            if is_temporary(p.name) and not p.is_symlink()
        )

    def refuse_links(self, relative: str) -> None:
        """In a local folder, a symlink on the way to a file to write (`engines` -> elsewhere, a link named like an
        engine) is refused: publishing never writes through one."""
        if "file" not in protocols(self._fs):
            return
        path = Path(self._base)
        for part in PurePosixPath(relative).parts:
            path = path / part
            if path.is_symlink():
                raise NotPublishable(
                    f"{self.where(relative)}: {path} is a symlink; refusing to write through it (remove it)"
                )


def is_temporary(name: str) -> bool:
    """Whether a listed name is a write in progress (put_atomic's `.<name>.<hex>.tmp`), not a file to read."""
    return name.startswith(".") and name.endswith(TEMP_SUFFIX)


def _open_regular(path: str) -> BinaryIO:
    """A local remote's file, opened only if it is a regular file (links followed, as a remote's reader always did): a
    FIFO, a socket or a device planted at the remote is refused at once, never waited on."""
    try:
        return open_regular(path, follow_links=True)
    except NotRegular:
        raise BadChannel(f"{path}: not a regular file; a remote holds regular files only (remove it)") from None


class ReadStream(Protocol):
    """A stream of bytes read in chunks: a local file, an archive member, a remote file (counted)."""

    def read(self, size: int = -1, /) -> bytes:
        """Up to `size` bytes (all that is left when negative); b"" at the end."""
        ...


class _Counted:
    """A read stream that adds what it reads to its folder's Transfer."""

    def __init__(self, handle: Any, name: str, folder: RemoteFolder):
        self._handle, self._name, self._folder = handle, name, folder

    def read(self, size: int = -1) -> bytes:
        try:
            data = self._handle.read(size)
        except Exception as exc:
            raise RemoteUnreachable(f"{self._folder.where(self._name)}: reading failed: {one_line(exc)}") from exc
        self._folder.transfer.add(self._name, len(data))
        return data
