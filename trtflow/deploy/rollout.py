"""Provision from a channel of a content-addressed remote: what a device does on every poll.

1. read `channels/<name>.json` conditionally (the ETag remembered from the last poll: nothing new is one request
   answered 304, no body);
2. pick the version for this device (channels.pick_version: the share, by a hash of its id);
3. if this device chose an engine for that version before and it is still installed: make it current, fetching
   nothing (a rollback costs the channel file only);
4. else read `versions/<v>/manifest.json`, check its sha256 is `v`, choose, stream the engine from
   `engines/<sha256>.engine`, run the checks, flip `current`.
What the poll learnt is kept in `<dest>/.poll-<key>.json` (the ETag, the channel, the choices per version): only a
cache, never trusted further than a fresh read would be (a bad one is ignored). A remote without channel files (an
earlier release's flat layout) is provisioned from its `manifest.json`, with a one-line note.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from trtflow.deploy.channels import (
    DIGEST,
    MAX_CHANNEL_BYTES,
    BadChannel,
    channel_file,
    parse_channel,
    pick_version,
    version_file,
)
from trtflow.deploy.install import RECORD, install
from trtflow.deploy.remote import RemoteFolder
from trtflow.errors import required
from trtflow.manifest import MANIFEST_FILE, Engine
from trtflow.util.fs import read_regular, write_nofollow
from trtflow.util.jsondata import loads_bounded

if TYPE_CHECKING:
    from trtflow.signing import TrustedKeys

MAX_MEMO_BYTES = 64 << 10
MAX_CHOICES = 8
Check = Callable[[Engine, Path], dict]


@dataclass(frozen=True)
class Request:
    """One device's poll: where from, which channel, who it is, and how to choose (the provision options)."""

    url: str
    channel: str
    device_id: str
    gpu: str
    dest: Path
    keep: int = 2
    choice: tuple = ()  # runtime_version, backend, precision, prefer, allow_failed: what the choice depends on
    trust: TrustedKeys | None = None  # --require-signature
    options: dict | None = None


def provision_channel(request: Request, make_device: Callable, check: Check | None = None) -> dict:
    """Poll the channel and install what it says this device runs; returns the provision record (+ channel fields)."""
    from trtflow.deploy import provision as prov

    remote = RemoteFolder(request.url, request.options)
    memo_path = request.dest / f".poll-{_memo_key(request)}.json"
    memo = _read_memo(memo_path, request.channel)
    relative = channel_file(request.channel)
    try:
        tag, data = remote.read_if_changed(relative, memo.get("tag") if memo else None, MAX_CHANNEL_BYTES)
    except FileNotFoundError:
        return _flat_layout(request, remote, make_device, check)
    channel = (
        parse_channel(data, remote.where(relative), request.channel)
        if data is not None
        else required(memo, "the memo whose tag matched")["parsed"]
    )
    version = pick_version(channel, request.device_id)
    choice_key = hashlib.sha256(json.dumps([version, request.gpu, *request.choice]).encode()).hexdigest()[:32]
    known = (memo or {}).get("choices", {}).get(choice_key)
    record = (
        _switch_to_known(request, known, check) if known and (request.trust is None or known.get("signed_by")) else None
    )
    if record is None:
        package = load_version(remote, version)
        if request.trust is not None:
            package = prov.require_signature(package, request.trust)
        record = prov.provision(package, make_device(package.manifest), request.dest, request.keep, check)
        known = {
            "recipe": package.manifest.recipe,
            "sha256": record["written"]["sha256"],
            "size": record["chosen"]["manifest_entry"]["size"],
            "engine": record["chosen"]["manifest_entry"],
            "signed_by": package.signed_by,
        }
    choices = {k: v for k, v in list((memo or {}).get("choices", {}).items())[-(MAX_CHOICES - 1) :] if k != choice_key}
    _write_memo(
        memo_path,
        {
            "channel": request.channel,
            "tag": tag,
            "channel_json": json.loads(channel.to_json()),
            "choices": {**choices, choice_key: known},
        },
    )
    transfer = {
        "from": remote.shown,
        "bytes": remote.transfer.total,
        "files": remote.transfer.files,
        "not_modified": remote.transfer.not_modified,
    }
    return {
        **record,
        "channel": request.channel,
        "version": version,
        "channel_version": channel.version,
        "share_bp": channel.share_bp,
        "device_id": request.device_id,
        "transfer": transfer,
    }


def load_version(remote: RemoteFolder, version: str):
    """The version's manifest as a Package, its bytes held to the version digest (immutable, so tamper-evident)."""
    from trtflow.deploy.provision import MAX_MANIFEST_BYTES, BadPackage, Package, _parse_manifest

    relative = version_file(version)
    try:
        data = remote.read(relative, MAX_MANIFEST_BYTES) or b""
    except FileNotFoundError:
        raise BadChannel(
            f"{remote.where(relative)}: not found, though the channel names it; publish the version again"
        ) from None
    if hashlib.sha256(data).hexdigest() != version:
        raise BadPackage(
            f"{remote.where(relative)}: its sha256 is not the version it is published as; the remote is corrupt or "
            "tampered with"
        )
    return Package(
        remote.shown, _parse_manifest(remote.where(relative), data), None, version, remote=remote, version=version
    )


def _switch_to_known(request: Request, known: dict, check: Check | None) -> dict | None:
    """Make an engine this device installed before current again, fetching nothing; None if it is not there any more."""
    from trtflow.deploy.provision import SAFE_NAME

    recipe, sha256, size = known.get("recipe"), known.get("sha256"), known.get("size")
    if not (
        isinstance(recipe, str)
        and SAFE_NAME.fullmatch(recipe)
        and isinstance(sha256, str)
        and DIGEST.fullmatch(sha256)
        and isinstance(size, int)
        and isinstance(known.get("engine"), dict)
    ):
        return None
    version_folder = request.dest / recipe / sha256
    if not (version_folder / f"{recipe}.engine").is_file() or not (version_folder / RECORD).is_file():
        return None
    try:
        engine = Engine.model_validate(known["engine"])
    except ValueError:
        return None

    def refuse_to_copy(sink) -> None:  # noqa: ANN001
        raise FileNotFoundError(version_folder)

    checked: dict = {}
    try:
        installed = install(
            request.dest,
            recipe,
            sha256,
            size,
            refuse_to_copy,
            {},
            request.keep,
            None if check is None else lambda path: checked.update(check(engine, path)),
        )
    except FileNotFoundError:
        return None
    return {
        "recipe": recipe,
        "action": installed.action,
        "sha256": sha256,
        "checks": checked or None,
        "chosen": {
            "file": engine.file,
            "reason": "chosen before for this version (kept installed)",
            "manifest_entry": known["engine"],
        },
        "written": {
            "engine": str(installed.current / installed.engine.name),
            "version": str(installed.engine.parent),
            "record": str(installed.record),
            "sha256": sha256,
        },
    }


def _flat_layout(request: Request, remote: RemoteFolder, make_device: Callable, check: Check | None) -> dict:
    """A remote of an earlier release (manifest.json at the URL): provision from it as before, with a note."""
    from trtflow.deploy import provision as prov

    package = prov.load_remote_package(request.url, request.options)
    if request.trust is not None:
        package = prov.require_signature(package, request.trust)
    record = prov.provision(package, make_device(package.manifest), request.dest, request.keep, check)
    note = (
        f"{remote.where(channel_file(request.channel))}: not found; read the flat layout of earlier releases "
        f"({MANIFEST_FILE} at the URL)"
    )
    return {**record, "channel": None, "version": None, "device_id": request.device_id, "note": note}


def _memo_key(request: Request) -> str:
    return hashlib.sha256(f"{request.url}\n{request.channel}\n{request.device_id}".encode()).hexdigest()[:24]


def _read_memo(path: Path, channel: str) -> dict | None:
    """The last poll's memo, or None when there is none or it is not what this module writes (never followed if a
    link)."""
    try:
        value = loads_bounded(read_regular(path, MAX_MEMO_BYTES + 1), MAX_MEMO_BYTES)
        parsed = parse_channel(json.dumps(value["channel_json"]).encode(), str(path), channel)
    except (OSError, ValueError, KeyError, TypeError, BadChannel):
        return None
    if (
        not isinstance(value, dict)
        or not isinstance(value.get("choices"), dict)
        or not isinstance(value.get("tag"), (str, type(None)))
    ):
        return None
    return {**value, "parsed": parsed}


def _write_memo(path: Path, memo: dict) -> None:
    try:
        write_nofollow(path, json.dumps(memo, indent=1).encode())
    except OSError:
        pass  # only a cache: the next poll reads the channel whole
