"""Getting engines to devices, below the CLI: one provision of a package or a channel, publishing a package, and the
agent's rounds. Each is one call the command makes; the agent provisions through the same `provision_once`."""

from __future__ import annotations

import random
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from trtflow.errors import TrtflowError


@dataclass(frozen=True, kw_only=True)
class ProvisionOptions:
    """What `provision` and `agent` are told about the device and where to install."""

    dest: Path
    gpu: str = "auto"
    runtime_version: str | None = None
    backend: str | None = None  # consider only engines of this backend
    precision: str | None = None  # consider only engines of this precision
    prefer: str | None = None  # precisions in order of preference (default: fewest bits first)
    allow_failed: bool = False  # also engines whose verification or accuracy check failed (on_fail: warn)
    keep: int = 2  # engine versions kept per recipe
    require_signature: bool = False
    trust: tuple[Path, ...] = ()
    provenance_file: Path | None = None
    channel: str = "stable"  # for a URL: the channel followed
    device_id: str | None = None  # default: the host name
    preflight: bool = True
    health_cmd: str | None = None
    health_timeout: float = 300.0
    plugin_dir: Path | None = None  # the plugin libraries this device has (found by sha256)


def device_id_of(options: ProvisionOptions) -> str:
    """--device-id, else the host name; BadRequest when it is not a plain name (it names the device's report)."""
    from trtflow.deploy.fleet import report_file
    from trtflow.deploy.provision import BadRequest

    device_id = options.device_id or socket.gethostname()
    try:
        report_file(device_id)
    except ValueError as exc:
        raise BadRequest(f"--device-id: {exc}") from exc
    return device_id


def _check(options: ProvisionOptions):
    """The checks to run before `current` flips: the preflight, then the health command."""
    from trtflow.deploy.agent import health_check
    from trtflow.deploy.preflight import preflight

    health = health_check(options.health_cmd, options.health_timeout) if options.health_cmd else None
    if not options.preflight and health is None:
        return None

    def check(engine, path: Path) -> dict:  # noqa: ANN001
        done = (
            preflight(engine, path, options.runtime_version)
            if options.preflight
            else {"preflight": "skipped: --no-preflight"}
        )
        return {**done, **(health(engine, path) if health else {})}

    return check


def provision_once(package: str, options: ProvisionOptions, failed: list) -> dict:
    """One provision of a package path or URL (a URL through its channel); `failed` gets the engines that failed to
    build."""
    from trtflow.deploy import provision as prov
    from trtflow.util.fsurl import is_url

    if options.require_signature and not options.trust:
        raise prov.BadRequest("--require-signature needs at least one --trust KEY.pub")
    keys = None
    if options.require_signature:
        from trtflow.signing import trusted_keys

        keys = trusted_keys(((path, f"--trust {path}") for path in options.trust), prov.BadRequest)

    def make_device(manifest):  # noqa: ANN001
        device = prov.device_from_options(
            options.gpu,
            manifest,
            options.runtime_version,
            options.backend,
            options.precision,
            options.prefer,
            options.allow_failed,
            options.plugin_dir,
        )
        failed.extend(m.model_dump() for m in prov.failed_for(manifest, device))
        return device

    if is_url(package) and options.provenance_file is None:
        from trtflow.deploy.rollout import Request, provision_channel

        choice = (options.runtime_version, options.backend, options.precision, options.prefer, options.allow_failed)
        request = Request(
            package, options.channel, device_id_of(options), options.gpu, options.dest, options.keep, choice, keys
        )
        return provision_channel(request, make_device, _check(options))
    loaded = prov.open_package(package)
    if keys is not None:
        loaded = prov.require_signature(loaded, keys, options.provenance_file)
    return prov.provision(loaded, make_device(loaded.manifest), options.dest, options.keep, _check(options))


def publish(package: Path, url: str, channel: str) -> dict:
    """Upload a package folder (and its provenance) to `url` as a version, then flip `channel` to it."""
    from trtflow import provenance
    from trtflow.deploy.channels import publish_version

    return publish_version(package, url, provenance.provenance_path(package), channel)


@dataclass(frozen=True)
class AgentPlan:
    """How the agent keeps a destination: poll every `interval` s (+-10%), back off from `backoff` doubling to
    `backoff_cap` after a failure, stop after `max_runtime` s (None: never) or after one round (`once`)."""

    interval: float = 300.0
    backoff: float = 10.0
    backoff_cap: float = 900.0
    max_runtime: float | None = None
    once: bool = False
    report: bool = False  # also send status.json to <url>/devices/<device-id>.json


def keep_device(
    url: str, options: ProvisionOptions, plan: AgentPlan, note: Callable[[str], None]
) -> tuple[dict, TrtflowError | None]:
    """Keep `options.dest` on the version `url`'s channel says for this device, as `plan` says; (the last status,
    the error of a single round that failed). `note` hears what went wrong without stopping the agent."""
    from trtflow.deploy import agent as agents
    from trtflow.deploy.remote import RemoteFolder
    from trtflow.util.text import clipped

    identity = {
        "device_id": device_id_of(options),
        "channel": options.channel,
        "url": RemoteFolder(url).shown,
        "gpu": options.gpu,
    }

    def one_round() -> tuple[dict, TrtflowError | None]:
        status, error = agents.one_round(lambda: provision_once(url, options, []), options.dest, identity)
        if plan.report:
            from trtflow.deploy.fleet import send_report

            try:
                send_report(RemoteFolder(url), status)
            except Exception as exc:  # a report that cannot be sent is no reason to stop keeping the engine
                note(f"status not reported: {clipped(str(exc).splitlines()[0], 200)}")
        return status, error

    with agents.agent_lock(options.dest):
        if plan.once:
            return one_round()
        schedule = agents.Schedule(plan.interval, plan.backoff, plan.backoff_cap)
        return agents.run(one_round, schedule, plan.max_runtime, random.Random()), None


def export_ort_context(package: str, dest: Path, embed: bool) -> list[dict]:
    """One ONNX Runtime EP-context model per engine of `package` (a folder, archive or URL), written to `dest`."""
    from trtflow.deploy.ort_context import export_ort_context as write
    from trtflow.deploy.provision import open_package

    return write(open_package(package), dest, embed)


def export_triton(
    packages: tuple[str, ...], repo: Path, model_name: str | None, version: int, precision: str | None
) -> dict:
    """A Triton model (config.pbtxt and the version's plans) serving the packages' full TensorRT engines."""
    from trtflow.deploy.provision import open_package
    from trtflow.deploy.triton import export_triton as write

    return write([open_package(p) for p in packages], repo, model_name, version, precision)
