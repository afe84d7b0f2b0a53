"""Channels of a content-addressed remote: publish a version, promote it to a share of the fleet, roll it back.

A channel is one small JSON file, `channels/<name>.json`, written last and whole:

    {"schema": 1, "channel": "stable", "history": ["<v new>", "<v previous>", ...], "share_bp": 1000}

`history[0]` is the channel's version and `history[1]` the one before it. `share_bp` (basis points, 1..10000) is the
part of the fleet that takes history[0]: a device takes it when `sha256(device_id + channel + version) mod 10000 <
share_bp`, else it stays on history[1]. The hash includes the version, so each release picks its own canaries, and
the devices of a 10% share are among those of a 50% share of the same version (the threshold only grows).
E.g. promote --share 10% -> share_bp 1000: device "cam-17" takes the new version iff its hash mod 10000 < 1000.

Publishing pushes a version on top (share 100%), promoting another channel's version pushes it with the given
share (or changes the share when it is already on top), a rollback pops the top. Everything read from the remote
is untrusted: a version is 64 lowercase hex digits, a channel an identifier, the share an integer in range.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from trtflow.deploy.remote import PROVENANCE_FILE, NotPublishable, RemoteFolder
from trtflow.errors import BadChannel, BadRollout
from trtflow.hashing import sha256_file
from trtflow.manifest import MANIFEST_FILE, SUMS_FILE, Manifest
from trtflow.util.jsondata import loads_bounded

DIGEST = re.compile(r"[0-9a-f]{64}")
CHANNEL_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,63}")
MAX_CHANNEL_BYTES = 16 << 10  # 20 digests and a few fields are about 1.5 KB
MAX_HISTORY = 20
FULL_SHARE = 10000


@dataclass(frozen=True)
class Channel:
    """A channel's versions, newest first, and the share (basis points) of devices that take the newest."""

    name: str
    history: tuple[str, ...] = ()
    share_bp: int = FULL_SHARE

    @property
    def version(self) -> str | None:
        """The version the channel serves now (None before the first promote)."""
        return self.history[0] if self.history else None

    @property
    def previous(self) -> str | None:
        """The version served before the current one: what a rollback returns to."""
        return self.history[1] if len(self.history) > 1 else None

    def to_json(self) -> bytes:
        """The channel file's canonical bytes."""
        return (
            json.dumps(
                {"schema": 1, "channel": self.name, "history": list(self.history), "share_bp": self.share_bp}, indent=1
            ).encode()
            + b"\n"
        )


def channel_file(name: str) -> str:
    """`channels/<name>.json` for a valid channel name (BadRollout otherwise: it comes from the command line)."""
    if not CHANNEL_NAME.fullmatch(name):
        raise BadRollout(f"channel {name!r} is not a name: a letter, then letters, digits, _ or -, at most 64")
    return f"channels/{name}.json"


def version_file(version: str, name: str = MANIFEST_FILE) -> str:
    """`versions/<v>/<name>` for a version digest checked to be 64 hex digits."""
    if not isinstance(version, str) or not DIGEST.fullmatch(version):
        raise BadChannel(f"version {str(version)[:80]!r} is not a sha256 digest; refusing it")
    return f"versions/{version}/{name}"


def engine_file(sha256: str) -> str:
    """`engines/<sha256>.engine` for an engine digest checked to be 64 hex digits (a manifest may say anything)."""
    if not DIGEST.fullmatch(sha256):
        raise BadChannel(f"engine sha256 {sha256[:80]!r} is not a sha256 digest; refusing it")
    return f"engines/{sha256}.engine"


def parse_channel(data: bytes, where: str, name: str) -> Channel:
    """A channel file's bytes, checked: bounded JSON, the expected name, digests, a share in 1..10000."""
    try:
        value = loads_bounded(data, MAX_CHANNEL_BYTES)
    except ValueError as exc:
        raise BadChannel(f"{where}: not a channel file: {exc}") from exc
    if not isinstance(value, dict) or value.get("channel") != name:
        raise BadChannel(f"{where}: not the channel file of {name!r}; publish to the channel again")
    history, share = value.get("history"), value.get("share_bp")
    if (
        not isinstance(history, list)
        or not history
        or len(history) > MAX_HISTORY
        or not all(isinstance(v, str) and DIGEST.fullmatch(v) for v in history)
    ):
        raise BadChannel(f"{where}: history must list 1 to {MAX_HISTORY} sha256 digests; refusing the channel")
    if not isinstance(share, int) or isinstance(share, bool) or not 1 <= share <= FULL_SHARE:
        raise BadChannel(
            f"{where}: share_bp {str(share)[:40]} is not an integer from 1 to {FULL_SHARE}; refusing the channel"
        )
    return Channel(name, tuple(history), share)


def parse_share(text: str) -> int:
    """'10%', '10' or '0.5%' -> basis points (1000, 1000, 50); BadRollout unless 0.01% to 100%."""
    match = re.fullmatch(r"(\d{1,3})(?:\.(\d{1,2}))?%?", text.strip())
    points = int(match.group(1)) * 100 + int((match.group(2) or "0").ljust(2, "0")) if match else 0
    if not 1 <= points <= FULL_SHARE:
        raise BadRollout(f"--share {text!r}: give a percentage from 0.01% to 100% (two decimals at most), e.g. 10%")
    return points


def takes_newest(device_id: str, channel: str, version: str, share_bp: int) -> bool:
    """Whether the device is in the share that takes `version` (see the module docstring)."""
    bucket = int(hashlib.sha256(f"{device_id}{channel}{version}".encode()).hexdigest(), 16) % FULL_SHARE
    return bucket < share_bp


def pick_version(channel: Channel, device_id: str) -> str:
    """The version this device runs: the newest, or the previous one when it is outside the share."""
    assert channel.version is not None
    if channel.share_bp >= FULL_SHARE or channel.previous is None:
        return channel.version
    return (
        channel.version
        if takes_newest(device_id, channel.name, channel.version, channel.share_bp)
        else channel.previous
    )


def read_channel(remote: RemoteFolder, name: str) -> Channel | None:
    """The channel at the remote, None when it has none."""
    relative = channel_file(name)
    try:
        data = remote.read(relative, MAX_CHANNEL_BYTES)
    except FileNotFoundError:
        return None
    return parse_channel(data or b"", remote.where(relative), name)


def write_channel(remote: RemoteFolder, channel: Channel) -> None:
    """Write the channel file to the remote (the only writer of channels/<name>.json)."""
    remote.put_atomic(channel.to_json(), channel_file(channel.name))


def publish_version(
    package: Path, url: str, provenance: Path | None, channel: str = "stable", options: dict | None = None
) -> dict:
    """Upload a package folder as a version: engines missing at the remote, the version folder, then the channel."""
    manifest_bytes, manifest = _package_manifest(package)
    remote = RemoteFolder(url, options)
    version = hashlib.sha256(manifest_bytes).hexdigest()
    channel_file(channel)
    sent, skipped = [], []
    for engine in manifest.engines:
        path = _engine_path(package, engine.file)
        if path.stat().st_size != engine.size or sha256_file(path) != engine.sha256:
            raise NotPublishable(
                f"{path}: does not match the sha256 and size {MANIFEST_FILE} records; rebuild the package with "
                "`trtflow run`"
            )
        target = engine_file(engine.sha256)
        if remote.size(target) == engine.size:  # named by its digest: the same name holds the same bytes
            skipped.append(engine.file)
            continue
        remote.put(path, target)
        sent.append(engine.file)
    small = [
        (p, name)
        for p, name in ((package / SUMS_FILE, SUMS_FILE), (provenance, PROVENANCE_FILE))
        if p is not None and p.is_file()
    ]
    for path, name in small:
        remote.put_atomic(path.read_bytes(), version_file(version, name))
    remote.put_atomic(manifest_bytes, version_file(version))
    remote.refuse_links(channel_file(channel))  # read before it is replaced: never through a link
    before = read_channel(remote, channel) or Channel(channel)
    history = (version,) + tuple(v for v in before.history if v != version)
    write_channel(remote, Channel(channel, history[:MAX_HISTORY]))
    return {
        "package": str(package),
        "url": remote.shown,
        "recipe": manifest.recipe,
        "version": version,
        "channel": channel,
        "previous": before.version if before.version != version else before.previous,
        "engines_sent": sent,
        "engines_unchanged": skipped,
        "files_sent": len(sent) + len(small) + 2,
        "bytes_sent": sum(e.size for e in manifest.engines if e.file in sent)
        + sum(p.stat().st_size for p, _ in small)
        + len(manifest_bytes),
    }


def _package_manifest(package: Path) -> tuple[bytes, Manifest]:
    """The package folder's manifest bytes and model; NotPublishable for anything else."""
    manifest_path = package / MANIFEST_FILE
    if not package.is_dir() or not manifest_path.is_file():
        hint = (
            " (publish the package folder, not its archive: provision fetches single engines)"
            if package.name.endswith(".tar.gz")
            else ""
        )
        raise NotPublishable(f"{package}: not a package folder with a {MANIFEST_FILE}{hint}")
    data = manifest_path.read_bytes()
    try:
        return data, Manifest.model_validate_json(data)
    except ValueError as exc:
        raise NotPublishable(
            f"{manifest_path}: not a trtflow manifest ({type(exc).__name__}); rebuild it with `trtflow run`"
        ) from exc


def _engine_path(package: Path, file: str) -> Path:
    """The engine's path inside the package folder; refused when the manifest points elsewhere."""
    parts = PurePosixPath(file).parts
    path = package.joinpath(*parts)
    if (
        file.startswith("/")
        or ".." in parts
        or not path.is_file()
        or not path.resolve().is_relative_to(package.resolve())
    ):
        raise NotPublishable(
            f"{package}: manifest names engine file {file!r}, which is missing or outside the package; rebuild it "
            "with `trtflow run`"
        )
    return path


def promote(
    url: str,
    channel: str,
    share: str,
    source: str | None = None,
    version: str | None = None,
    options: dict | None = None,
) -> dict:
    """Put `version` (default: the newest of channel `source`, default canary) on top of `channel` for a share of it."""
    remote = RemoteFolder(url, options)
    points = parse_share(share)
    if version is None:
        origin = read_channel(remote, source or "canary")
        if origin is None:
            raise BadRollout(
                f"{remote.where(channel_file(source or 'canary'))}: no such channel to promote from; publish to it "
                "first"
            )
        version = origin.version
    elif not DIGEST.fullmatch(version):
        raise BadRollout(f"--version {version!r} is not a sha256 digest (64 hex digits, as `publish --json` prints it)")
    assert version is not None
    if remote.size(version_file(version)) is None:
        raise BadRollout(f"{remote.where(version_file(version))}: no such version at the remote; publish it first")
    before = read_channel(remote, channel) or Channel(channel)
    history = (
        before.history if before.version == version else (version,) + tuple(v for v in before.history if v != version)
    )
    after = Channel(channel, history[:MAX_HISTORY], points)
    write_channel(remote, after)
    return {
        "url": remote.shown,
        "channel": channel,
        "version": after.version,
        "previous": after.previous,
        "share_bp": points,
    }


def rollback(url: str, channel: str, options: dict | None = None) -> dict:
    """Pop the channel's newest version: every device of it goes back to the previous one, at 100%."""
    remote = RemoteFolder(url, options)
    before = read_channel(remote, channel)
    if before is None or before.previous is None:
        raise BadRollout(f"{remote.where(channel_file(channel))}: no previous version to roll back to")
    after = Channel(channel, before.history[1:])
    if remote.size(version_file(after.history[0])) is None:
        raise BadRollout(
            f"{remote.where(version_file(after.history[0]))}: the previous version is gone from the remote (remote gc "
            "deleted it); nothing rolled back: promote a version the remote holds"
        )
    write_channel(remote, after)
    return {
        "url": remote.shown,
        "channel": channel,
        "version": after.version,
        "rolled_back": before.version,
        "previous": after.previous,
    }
