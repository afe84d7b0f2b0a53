"""Getting engines to devices: `provision` (a package or a published URL, once) and `publish` (a package to a remote);
the agent (cli/fleet.py) provisions through the same services.provisioning.provision_once."""

from __future__ import annotations

import json
from pathlib import Path

import click

from trtflow.cli import output
from trtflow.cli.app import cli
from trtflow.errors import TrtflowError
from trtflow.services import provisioning


@cli.command()
@click.argument("package", metavar="PACKAGE|URL")
@click.option(
    "--gpu",
    default="auto",
    show_default=True,
    help="auto (nvidia-smi), a compute capability (sm_86 or 8.6), or a target name of the package.",
)
@click.option(
    "--runtime-version",
    help="TensorRT or TensorRT-RTX version on the device, e.g. 10.13.3; without it version rules are not applied.",
)
@click.option(
    "--backend", type=click.Choice(["tensorrt-rtx", "tensorrt"]), help="Consider only engines of this backend."
)
@click.option("--precision", help="Consider only engines of this precision.")
@click.option(
    "--prefer",
    help="Precisions in order of preference, e.g. fp16,int8 (default: fp8,int8,fp16,bf16,fp32: fewest bits first); "
    "drop first ranks by the task accuracy drop the manifest measured (lowest first).",
)
@click.option(
    "--allow-failed",
    is_flag=True,
    help="Also consider engines whose verification or accuracy check failed (recorded with on_fail: warn).",
)
@click.option(
    "--dest",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Folder to install into: <recipe>/current -> <sha256>/ holding <recipe>.engine and provision.json.",
)
@click.option(
    "--keep",
    type=click.IntRange(min=1),
    default=2,
    show_default=True,
    help="Engine versions to keep per recipe (the current one included).",
)
@click.option(
    "--require-signature",
    is_flag=True,
    help="Refuse a package unless a --trust key signed its provenance (<recipe>.intoto.jsonl beside it).",
)
@click.option(
    "--trust",
    "trust",
    multiple=True,
    type=click.Path(path_type=Path),
    help="An Ed25519 public key (PEM) whose signatures are accepted; repeatable.",
)
@click.option(
    "--provenance",
    "provenance_file",
    type=click.Path(path_type=Path),
    help="The provenance file, if not beside the package.",
)
@click.option(
    "--channel", default="stable", show_default=True, help="For a URL: the channel to follow (channels/<name>.json)."
)
@click.option(
    "--device-id",
    help="For a URL: this device's id, which decides whether it is in a rollout's share (default: the host name).",
)
@click.option(
    "--no-preflight", is_flag=True, help="Do not check the engine against the installed runtime before `current` flips."
)
@click.option(
    "--plugin-dir",
    type=click.Path(path_type=Path),
    help="The plugin libraries this device has (found by sha256); "
    "an engine needing one neither here nor carried by the package is refused.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the JSON record.")
def provision(
    package: str,
    gpu: str,
    runtime_version: str | None,
    backend: str | None,
    precision: str | None,
    prefer: str | None,
    allow_failed: bool,
    dest: Path,
    keep: int,
    require_signature: bool,
    trust: tuple[Path, ...],
    provenance_file: Path | None,
    channel: str,
    device_id: str | None,
    no_preflight: bool,
    plugin_dir: Path | None,
    as_json: bool,
) -> None:
    """Install the engine of PACKAGE (folder, .tar.gz, manifest.json, or a URL `trtflow publish` wrote) that fits a GPU.

    From a URL: the channel's version for this device, its manifest and the chosen engine are fetched (nothing but
    one conditional request when nothing changed); the engine's sha256 is checked while it streams."""
    failed: list[dict] = []  # for --json: the engines for this GPU that failed to build
    options = provisioning.ProvisionOptions(
        gpu=gpu,
        runtime_version=runtime_version,
        backend=backend,
        precision=precision,
        prefer=prefer,
        allow_failed=allow_failed,
        dest=dest,
        keep=keep,
        require_signature=require_signature,
        trust=trust,
        provenance_file=provenance_file,
        channel=channel,
        device_id=device_id,
        preflight=not no_preflight,
        plugin_dir=plugin_dir,
    )

    def install() -> dict:
        return provisioning.provision_once(package, options, failed)

    if not as_json:
        output.print_provision(install())
        return
    try:
        record = install()
    except TrtflowError as exc:  # --json: one JSON object on stdout on failure too; the one line still goes to stderr
        click.echo(
            json.dumps(
                {"action": "failed", "exit_code": exc.exit_code, "error": str(exc), "failed_engines": failed}, indent=2
            )
        )
        raise
    click.echo(json.dumps({**record, "exit_code": 0}, indent=2))


@cli.command()
@click.argument("package", type=click.Path(path_type=Path))
@click.argument("url")
@click.option(
    "--channel",
    default="stable",
    show_default=True,
    help="The channel whose newest version it becomes (e.g. stable, canary).",
)
@click.option("--json", "as_json", is_flag=True, help="Print what was sent as JSON.")
def publish(package: Path, url: str, channel: str, as_json: bool) -> None:
    """Upload a package folder to URL (s3://bucket/prefix, file:///shared/...) as a version, then flip CHANNEL to it.

    Engines go to engines/<sha256>.engine (sent only when missing), the manifest to versions/<sha256>/, the small
    channels/<name>.json last: a device never sees a manifest whose engines are being replaced."""
    summary = provisioning.publish(package, url, channel)
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    unchanged = f", {len(summary['engines_unchanged'])} unchanged" if summary["engines_unchanged"] else ""
    click.echo(
        f"published {summary['recipe']} to {summary['url']} as version {summary['version'][:12]} on channel {channel}: "
        f"{len(summary['engines_sent'])} engine(s) sent{unchanged}, {summary['files_sent']} file(s), "
        f"{summary['bytes_sent']} bytes"
    )
