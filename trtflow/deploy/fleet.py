"""The fleet seen from the remote: device reports (`devices/<id>.json`), `fleet status`, and `remote gc`.

A report is an agent's status.json, sent as is; read back it is untrusted like everything at the remote: at most
64 KiB, bounded JSON, string fields on one line with control characters shown (a field never forges a row of
`fleet status`), the file named by a valid device id. `remote gc --keep N` keeps the N newest
versions of every channel (at least 2: the previous one is what a rollback needs) and the engines they name, and
deletes other versions and engines older than the grace period (a publish in progress has sent engines its
channel does not name yet). Channel histories lose the versions gc deletes in the same step, before they are deleted,
so a rollback never lands on a version that is gone; temporary files a killed writer left are swept.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from datetime import datetime

from trtflow.deploy.channels import (
    DIGEST,
    FULL_SHARE,
    BadChannel,
    Channel,
    channel_file,
    parse_channel,
    read_channel,
    version_file,
    write_channel,
)
from trtflow.deploy.remote import RemoteFolder, is_temporary
from trtflow.errors import BadRollout, TrtflowError
from trtflow.manifest import Manifest
from trtflow.util.jsondata import loads_bounded
from trtflow.util.text import clipped, single_line

DEVICE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
MAX_REPORT_BYTES = 64 << 10
MAX_REPORTS = 200_000
FIELDS = ("device_id", "channel", "version", "gpu", "recipe", "last_check", "last_error")


def report_file(device_id: str) -> str:
    """`devices/<device-id>.json`; ValueError for an id that is not a plain name."""
    if not DEVICE_ID.fullmatch(device_id):
        raise ValueError(f"device id {device_id[:80]!r} is not a plain name ([A-Za-z0-9._:-], at most 128)")
    return f"devices/{device_id}.json"


def send_report(remote: RemoteFolder, status: dict) -> None:
    """Upload the device's status to the remote (one small PUT)."""
    import json

    remote.put_atomic((json.dumps(status, indent=1) + "\n").encode(), report_file(str(status.get("device_id"))))


def read_reports(remote: RemoteFolder) -> tuple[list[dict], list[str]]:
    """(every readable report, one line per report set aside)."""
    reports, refused = [], []
    for info in remote.listing("devices")[:MAX_REPORTS]:
        name = remote.name_of(info)
        if is_temporary(name):  # an agent's report on its way
            continue
        if not name.endswith(".json") or not DEVICE_ID.fullmatch(name[:-5]):
            refused.append(f"{name[:80]}: not a device report name")
            continue
        try:
            value = loads_bounded(remote.read(f"devices/{name}", MAX_REPORT_BYTES) or b"", MAX_REPORT_BYTES)
        except (ValueError, FileNotFoundError, OSError, TrtflowError) as exc:
            refused.append(f"{name}: {clipped(str(exc), 200)}")
            continue
        if not isinstance(value, dict):
            refused.append(f"{name}: not a JSON object")
            continue
        reports.append({k: None if value.get(k) is None else single_line(str(value.get(k)))[:200] for k in FIELDS})
    return reports, [single_line(line) for line in refused]


def fleet_table(reports: list[dict], stale_after: float, now: float | None = None) -> list[dict]:
    """Devices counted by (channel, version, gpu): how many, how many report an error, how many are stale."""
    now = time.time() if now is None else now
    rows: Counter = Counter()
    errors: Counter = Counter()
    stale: Counter = Counter()
    for report in reports:
        key = (report.get("channel") or "-", report.get("version") or "-", report.get("gpu") or "-")
        rows[key] += 1
        errors[key] += bool(report.get("last_error"))
        stale[key] += _age(report.get("last_check"), now) > stale_after
    return [
        {"channel": c, "version": v, "gpu": g, "devices": n, "with_error": errors[(c, v, g)], "stale": stale[(c, v, g)]}
        for (c, v, g), n in sorted(rows.items())
    ]


def _age(stamp: str | None, now: float) -> float:
    try:
        return now - datetime.fromisoformat(str(stamp)).timestamp()
    except ValueError:
        return float("inf")


def gc_remote(
    url: str, keep: int, grace: float, delete: bool, options: dict | None = None, now: float | None = None
) -> dict:
    """Versions and engines no channel keeps (older than `grace` seconds): listed, and deleted when `delete`."""
    remote = RemoteFolder(url, options)
    channels = _channels(remote)
    kept = {v for channel in channels for v in channel.history[: max(keep, 2)]}
    now = time.time() if now is None else now
    listed = remote.listing("versions")
    present = {remote.name_of(i) for i in listed}
    old = [remote.name_of(i) for i in listed if _folder_modified(remote, i) < now - grace]
    versions = [v for v in old if DIGEST.fullmatch(v) and v not in kept]
    engines = _referenced_engines(remote, kept)
    unused = [remote.name_of(i) for i in remote.listing("engines") if _modified(i) < now - grace]
    unused = [e for e in unused if e.endswith(".engine") and DIGEST.fullmatch(e[:-7]) and e[:-7] not in engines]
    leftovers = [t for t in remote.temporaries() if t[1] < now - grace]
    if delete:
        gone = set(versions) | {v for channel in channels for v in channel.history if v not in present}
        for name in [c.name for c in channels if set(c.history) & gone]:  # first: no channel names a deleted version
            _forget_versions(remote, name, gone)
        for version in versions:
            remote.remove(f"versions/{version}")
        for engine in unused:
            remote.remove(f"engines/{engine}")
        for relative, _ in leftovers:
            remote.remove(relative)
    return {
        "url": remote.shown,
        "kept_versions": sorted(kept),
        "versions_deleted" if delete else "versions_to_delete": versions,
        "engines_deleted" if delete else "engines_to_delete": unused,
        "temporary_files_deleted" if delete else "temporary_files_to_delete": sorted(r for r, _ in leftovers),
    }


def _forget_versions(remote: RemoteFolder, name: str, gone: set[str]) -> None:
    """Take `gone` out of a channel's history, read again just before it is written (a publish that flipped it
    meanwhile is kept); a channel left with nothing is left as it is."""
    channel = read_channel(remote, name)
    history = tuple(v for v in channel.history if v not in gone) if channel is not None else ()
    if channel is not None and history and history != channel.history:
        write_channel(remote, Channel(name, history, channel.share_bp if len(history) > 1 else FULL_SHARE))


def _channels(remote: RemoteFolder) -> list[Channel]:
    """Every channel at the remote (writes in progress skipped); BadChannel for one that does not read."""
    channels = []
    for info in remote.listing("channels"):
        listed = remote.name_of(info)
        if is_temporary(listed):
            continue
        name = listed.removesuffix(".json")
        try:
            channels.append(
                parse_channel(remote.read(channel_file(name), 16 << 10) or b"", remote.where(channel_file(name)), name)
            )
        except (BadChannel, BadRollout, FileNotFoundError, ValueError) as exc:
            raise BadChannel(
                f"{remote.where('channels/' + listed)}: {exc}; fix or remove it before gc (nothing deleted)"
            ) from exc
    return channels


def _referenced_engines(remote: RemoteFolder, versions: set[str]) -> set[str]:
    """The engine digests the kept versions' manifests name."""
    from trtflow.deploy.provision import MAX_MANIFEST_BYTES

    found: set[str] = set()
    for version in versions:
        try:
            manifest = Manifest.model_validate_json(remote.read(version_file(version), MAX_MANIFEST_BYTES) or b"")
        except FileNotFoundError:
            continue
        except ValueError:
            raise BadChannel(
                f"{remote.where(version_file(version))}: not a trtflow manifest; fix the remote before gc (nothing "
                "deleted)"
            ) from None
        found.update(e.sha256 for e in manifest.engines)
    return found


def _modified(info: dict) -> float:
    """When a listed entry was last written (a folder of an object store has no time: it counts as new)."""
    value = info.get("LastModified") or info.get("mtime") or info.get("created")
    if isinstance(value, datetime):
        return value.timestamp()
    if isinstance(value, (int, float)):
        return float(value)
    return float("inf")


def _folder_modified(remote: RemoteFolder, info: dict) -> float:
    """A version folder's time: its own, or (object stores have no folders) the newest of what it holds."""
    own = _modified(info)
    if own != float("inf") or not DIGEST.fullmatch(remote.name_of(info)):
        return own
    return max((_modified(i) for i in remote.listing(f"versions/{remote.name_of(info)}")), default=float("inf"))
