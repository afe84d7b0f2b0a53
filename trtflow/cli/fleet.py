"""Fleet commands: promote, rollback, agent, fleet status, remote gc."""

from __future__ import annotations

import json
from pathlib import Path

import click

from trtflow.cli.app import cli
from trtflow.services import fleet as fleets
from trtflow.services import provisioning


@cli.command()
@click.argument("url")
@click.option("--channel", default="stable", show_default=True, help="The channel to change.")
@click.option(
    "--share",
    required=True,
    help="The part of the channel's devices that take the version, e.g. 10% (by a hash of each device id).",
)
@click.option(
    "--from", "source", default="canary", show_default=True, help="The channel whose newest version is promoted."
)
@click.option("--version", help="Promote this version (sha256, as publish --json prints it) instead.")
@click.option("--json", "as_json", is_flag=True, help="Print the channel as JSON.")
def promote(url: str, channel: str, share: str, source: str, version: str | None, as_json: bool) -> None:
    """Give the newest version of --from (or --version) to --share of CHANNEL's devices; the rest keep the previous
    one."""
    done = fleets.promote(url, channel, share, source, version)
    _say(
        done,
        as_json,
        f"{channel}: {done['version'][:12]} for {done['share_bp'] / 100:g}% of devices, previous "
        f"{(done['previous'] or 'none')[:12]} for the rest",
    )


@cli.command()
@click.argument("url")
@click.option("--channel", default="stable", show_default=True, help="The channel to roll back.")
@click.option("--json", "as_json", is_flag=True, help="Print the channel as JSON.")
def rollback(url: str, channel: str, as_json: bool) -> None:
    """Put CHANNEL back on its previous version for every device (they switch without fetching an engine they kept)."""
    done = fleets.rollback(url, channel)
    _say(done, as_json, f"{channel}: rolled back from {done['rolled_back'][:12]} to {done['version'][:12]}")


def _say(done: dict, as_json: bool, line: str) -> None:
    click.echo(json.dumps(done, indent=2) if as_json else line)


@cli.command()
@click.argument("url")
@click.option(
    "--dest",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="The destination this agent keeps (one agent each).",
)
@click.option(
    "--gpu",
    default="auto",
    show_default=True,
    help="auto (nvidia-smi), a compute capability (sm_86), or a target name.",
)
@click.option(
    "--runtime-version",
    help="TensorRT or TensorRT-RTX version on the device (default: the installed runtime's, for the preflight).",
)
@click.option("--channel", default="stable", show_default=True, help="The channel to follow.")
@click.option("--device-id", help="This device's id (default: the host name).")
@click.option(
    "--interval",
    type=click.FloatRange(min=1),
    default=300,
    show_default=True,
    help="Seconds between polls (+-10% jitter).",
)
@click.option(
    "--backoff",
    type=click.FloatRange(min=0.1),
    default=10,
    show_default=True,
    help="First retry delay after a failure, doubling up to --backoff-cap.",
)
@click.option(
    "--backoff-cap",
    type=click.FloatRange(min=0.1),
    default=900,
    show_default=True,
    help="Longest delay between retries.",
)
@click.option(
    "--health-cmd",
    help="Run `CMD <engine>` (TRTFLOW_ENGINE set) before `current` flips; non-zero keeps the old engine.",
)
@click.option(
    "--health-timeout",
    type=click.FloatRange(min=1),
    default=300,
    show_default=True,
    help="Seconds the health command may take.",
)
@click.option(
    "--keep",
    type=click.IntRange(min=2),
    default=2,
    show_default=True,
    help="Engine versions kept (the previous one for an instant rollback).",
)
@click.option(
    "--report",
    is_flag=True,
    help="Also send status.json to <url>/devices/<device-id>.json (for `trtflow fleet status`).",
)
@click.option("--once", is_flag=True, help="One poll, then exit with its exit code (for cron).")
@click.option(
    "--max-runtime", type=click.FloatRange(min=0), help="Stop after this many seconds (default: run until stopped)."
)
@click.option("--json", "as_json", is_flag=True, help="Print the last status as JSON.")
def agent(
    url: str,
    dest: Path,
    gpu: str,
    runtime_version: str | None,
    channel: str,
    device_id: str | None,
    interval: float,
    backoff: float,
    backoff_cap: float,
    health_cmd: str | None,
    health_timeout: float,
    keep: int,
    report: bool,
    once: bool,
    max_runtime: float | None,
    as_json: bool,
) -> None:
    """Keep DEST on the version URL's CHANNEL says for this device: poll, back off on failure, write status.json."""
    options = provisioning.ProvisionOptions(
        gpu=gpu,
        runtime_version=runtime_version,
        dest=dest,
        keep=keep,
        channel=channel,
        device_id=device_id,
        health_cmd=health_cmd,
        health_timeout=health_timeout,
    )
    plan = provisioning.AgentPlan(interval, backoff, backoff_cap, max_runtime, once, report)
    status, error = provisioning.keep_device(url, options, plan, lambda line: click.echo(f"note: {line}", err=True))
    click.echo(
        json.dumps(status, indent=2)
        if as_json
        else f"{status['device_id']}: {status.get('action')} {(status.get('version') or '-')[:12]} ({channel})"
        + (f"; error: {status['last_error']}" if status.get("last_error") else "")
    )
    if error is not None:
        raise error


@cli.group()
def fleet() -> None:
    """What the devices of a remote report."""


@fleet.command("status")
@click.argument("url")
@click.option(
    "--stale",
    type=click.FloatRange(min=0),
    default=3600,
    show_default=True,
    help="Seconds after which a silent device counts as stale.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def fleet_status(url: str, stale: float, as_json: bool) -> None:
    """Devices by channel, version and GPU, from the reports at URL/devices/ (agent --report)."""
    status = fleets.fleet_status(url, stale)
    rows, refused = status.rows, status.refused
    if as_json:
        click.echo(json.dumps({"devices": status.devices, "rows": rows, "refused": refused}, indent=2))
        return
    click.echo(f"{'channel':<12} {'version':<14} {'gpu':<10} {'devices':>8} {'errors':>7} {'stale':>6}")
    for row in rows:
        click.echo(
            f"{row['channel'][:12]:<12} {row['version'][:12]:<14} {row['gpu'][:10]:<10} {row['devices']:>8} "
            f"{row['with_error']:>7} {row['stale']:>6}"
        )
    for line in refused:
        click.echo(f"note: report set aside: {line}", err=True)


@cli.group()
def remote() -> None:
    """A published remote's housekeeping."""


@remote.command("gc")
@click.argument("url")
@click.option(
    "--keep",
    type=click.IntRange(min=2),
    default=5,
    show_default=True,
    help="Newest versions kept per channel (2 at least: rollback).",
)
@click.option(
    "--grace",
    type=click.FloatRange(min=0),
    default=3600,
    show_default=True,
    help="Never delete what is younger (a publish in progress).",
)
@click.option("--yes", is_flag=True, help="Delete (without it, only say what would be deleted).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def remote_gc(url: str, keep: int, grace: float, yes: bool, as_json: bool) -> None:
    """Delete the versions no channel keeps and the engines only they name."""
    done = fleets.remote_gc(url, keep, grace, yes)
    verb = "deleted" if yes else "to delete"
    field = verb.replace(" ", "_")
    leftovers = done[f"temporary_files_{field}"]
    swept = f"; temporary file(s) a writer left {verb}: {', '.join(leftovers)}" if leftovers else ""
    _say(
        done,
        as_json,
        f"{done['url']}: {len(done[f'versions_{field}'])} version(s) and {len(done[f'engines_{field}'])} engine(s) "
        f"{verb}; kept {len(done['kept_versions'])} version(s){swept}",
    )
