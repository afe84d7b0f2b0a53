"""A published remote's channels and devices, below the CLI: promote, rollback, fleet status and the remote's gc."""

from __future__ import annotations

from dataclasses import dataclass


def promote(url: str, channel: str, share: str, source: str, version: str | None) -> dict:
    """Give the newest version of `source` (or `version`) to `share` of `channel`'s devices: the channel as written."""
    from trtflow.deploy.channels import promote as promote_channel

    return promote_channel(url, channel, share, source, version)


def rollback(url: str, channel: str) -> dict:
    """Put `channel` back on its previous version for every device: the channel as written."""
    from trtflow.deploy.channels import rollback as rollback_channel

    return rollback_channel(url, channel)


@dataclass(frozen=True)
class FleetStatus:
    """The devices' reports at a remote: how many, one row per (channel, version, gpu), and the reports set aside."""

    devices: int
    rows: list[dict]
    refused: list[str]


def fleet_status(url: str, stale: float) -> FleetStatus:
    """What the devices of `url` report (agent --report); a device silent for `stale` s counts as stale."""
    from trtflow.deploy.fleet import fleet_table, read_reports
    from trtflow.deploy.remote import RemoteFolder

    reports, refused = read_reports(RemoteFolder(url))
    return FleetStatus(len(reports), fleet_table(reports, stale), refused)


def remote_gc(url: str, keep: int, grace: float, delete: bool) -> dict:
    """The versions no channel keeps (the newest `keep` per channel are), the engines only they name and the temporary
    files a writer left, older than `grace` s: listed, or deleted if `delete`."""
    from trtflow.deploy.fleet import gc_remote

    return gc_remote(url, keep, grace, delete)
