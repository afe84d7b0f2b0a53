"""Provision: pick the engine of a package that fits a device (the rules: deploy/choice.py), verify its sha256,
put it in place. The choice reads only the manifest, so a fleet agent decides without TensorRT or a GPU.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import re
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import TYPE_CHECKING, BinaryIO

from pydantic import ValidationError

from trtflow.deploy.channels import engine_file, version_file
from trtflow.deploy.choice import (  # noqa: F401  (re-exported: callers name them from here)
    AMPERE_PLUS,
    DEFAULT_PREFERENCE,
    EXACT,
    BadRequest,
    Device,
    NoEngineFits,
    Verdict,
    _runtime_refusal,
    choose,
    chosen_because,
    detect_compute_capabilities,
    device_from_options,
    failed_for,
    measured_drop,
)
from trtflow.deploy.install import install
from trtflow.deploy.plugins import plugin_installs
from trtflow.deploy.remote import PROVENANCE_FILE, ReadStream, RemoteFolder
from trtflow.errors import TamperedEngine, TrtflowError, required
from trtflow.hashing import sha256_file
from trtflow.manifest import MANIFEST_FILE, Engine, Manifest, Plugin
from trtflow.util.archive import UnsafeArchive, read_member

if TYPE_CHECKING:
    from trtflow.signing import TrustedKeys

CHUNK = 1 << 20
MAX_MANIFEST_BYTES = 64 << 20  # a manifest of thousands of engines is a few MB
SAFE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


class BadPackage(UnsafeArchive):
    """The package is missing, malformed, or names files outside itself."""

    exit_code = 3


@dataclass(frozen=True)
class Package:
    """A manifest and where its engines are: a folder (`root`), the .tar.gz at `path`, or a URL (`remote`)."""

    path: Path | str  # as messages and records show it (a URL without credentials for a remote)
    manifest: Manifest
    root: Path | None
    manifest_sha256: str  # of the exact bytes parsed: what a signed provenance must name
    signed_by: str | None = None  # the trusted key id whose provenance covers it (require_signature)
    remote: RemoteFolder | None = None
    version: str | None = None  # a content-addressed remote's version: engines are engines/<sha256>.engine there

    def where(self, file: str) -> str:
        """A file of the package as messages name it."""
        if self.remote is not None:
            return self.remote.where(file)
        return str((self.root or Path(self.path)) / file)


def load_package(path: Path) -> Package:
    """A package folder, its .tar.gz, or a manifest.json with the engines next to it."""
    if not path.exists():
        raise BadPackage(f"{path}: no such file or folder")
    if path.is_dir():
        manifest = path / MANIFEST_FILE
        data = _read_manifest(manifest) if manifest.is_file() else None
        return Package(path, _parse_manifest(manifest, data), path, _sha256(data))
    if path.name.endswith((".tar.gz", ".tgz")):
        try:
            data = read_member(path, "/" + MANIFEST_FILE, MAX_MANIFEST_BYTES)
        except (tarfile.TarError, OSError, EOFError, TrtflowError) as exc:
            raise BadPackage(f"{path}: not a readable package archive ({exc}); fetch the package again") from exc
        return Package(path, _parse_manifest(path, data), None, _sha256(data))
    if path.name.endswith(".json"):
        data = _read_manifest(path)
        return Package(path, _parse_manifest(path, data), path.parent, _sha256(data))
    raise BadPackage(f"{path}: not a package: pass a package folder, its .tar.gz, or its {MANIFEST_FILE}")


def open_package(location: str) -> Package:
    """A package from a local path (folder, .tar.gz, manifest.json) or a URL that `trtflow publish` wrote."""
    from trtflow.util.fsurl import is_url

    return load_remote_package(location) if is_url(location) else load_package(Path(location))


def load_remote_package(url: str, options: dict | None = None) -> Package:
    """A published package (`trtflow publish`) at an fsspec URL: only its manifest.json is read."""
    remote = RemoteFolder(url, options)
    try:
        data = remote.read(MANIFEST_FILE, MAX_MANIFEST_BYTES)
    except FileNotFoundError:
        raise BadPackage(
            f"{remote.where(MANIFEST_FILE)}: not found; publish the package there with `trtflow publish`"
        ) from None
    return Package(remote.shown, _parse_manifest(remote.where(MANIFEST_FILE), data), None, _sha256(data), remote=remote)


def require_signature(package: Package, trust: TrustedKeys, provenance_file: Path | None = None) -> Package:
    """The package if a trusted key signed a provenance covering its manifest (and archive); else UntrustedPackage
    (exit 3)."""
    from trtflow import provenance

    if package.remote is not None and provenance_file is None:
        _, keyid = _check_remote_provenance(package, trust)
        return dataclasses.replace(package, signed_by=keyid)
    path = provenance_file or provenance.provenance_path(
        package.root if package.root is not None else Path(package.path)
    )
    archive = sha256_file(Path(package.path)) if package.root is None and package.remote is None else None
    _, keyid = provenance.check(path, trust, package.manifest.recipe, package.manifest_sha256, archive)
    return dataclasses.replace(package, signed_by=keyid)


def _check_remote_provenance(package: Package, trust: TrustedKeys) -> tuple[dict, str]:
    """provenance.check on the remote package's provenance.intoto.jsonl, fetched to a temporary file."""
    from trtflow import provenance

    remote = package.remote
    assert remote is not None
    where = PROVENANCE_FILE if package.version is None else version_file(package.version, PROVENANCE_FILE)
    try:
        data = remote.read(where, provenance.MAX_BYTES)
    except FileNotFoundError:
        raise provenance.UntrustedPackage(
            f"{remote.where(where)}: not found (--require-signature); publish the package with its provenance"
        ) from None
    with tempfile.TemporaryDirectory(prefix="trtflow-provenance-") as folder:
        path = Path(folder) / PROVENANCE_FILE
        path.write_bytes(data or b"")
        try:
            return provenance.check(path, trust, package.manifest.recipe, package.manifest_sha256, None)
        except provenance.UntrustedPackage as exc:
            raise provenance.UntrustedPackage(str(exc).replace(str(path), remote.where(where))) from exc


def _sha256(data: bytes | None) -> str:
    return hashlib.sha256(data or b"").hexdigest()


def _read_manifest(path: Path) -> bytes:
    """A manifest file's bytes, refused above MAX_MANIFEST_BYTES (a real one is kilobytes)."""
    if path.stat().st_size > MAX_MANIFEST_BYTES:
        raise BadPackage(
            f"{path}: {path.stat().st_size} bytes; a manifest is at most {MAX_MANIFEST_BYTES}: not a trtflow package"
        )
    return path.read_bytes()


def _parse_manifest(path: Path | str, data: bytes | None) -> Manifest:
    if data is None:
        raise BadPackage(f"{path}: not a package (no {MANIFEST_FILE})")
    try:
        return Manifest.model_validate_json(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise BadPackage(f"{path}: not a trtflow manifest: {'.'.join(map(str, first['loc']))}: {first['msg']}") from exc


def _safe_relative(package: Package, file: str) -> str:
    """The manifest's engine path, refused when it could point outside the package."""
    parts = PurePosixPath(file).parts
    if (
        not parts
        or file.startswith("/")
        or "\\" in file
        or PureWindowsPath(file).drive
        or any(p in ("..", ".") for p in parts)
    ):
        raise BadPackage(
            f"{package.path}: manifest names engine file {file!r}, which escapes the package; refusing it (rebuild "
            "the package with `trtflow run`)"
        )
    return file


@contextlib.contextmanager
def _open_engine(package: Package, engine: Engine | Plugin) -> Iterator[ReadStream]:
    """The engine's (or a carried plugin's: anything with `file`) bytes as a stream, from the folder, straight from
    its archive member (never extracted to a path the package names) or from a published version."""
    what = "engine" if isinstance(engine, Engine) else "plugin"
    relative = _source_of(package, engine)
    if package.remote is not None:
        try:
            with package.remote.open(relative) as source:
                yield source
        except FileNotFoundError:
            raise BadPackage(
                f"{package.where(relative)}: the {what} file is missing; publish the package again"
            ) from None
        return
    if package.root is not None:
        path = package.root / relative
        if not path.is_file() or not path.resolve().is_relative_to(package.root.resolve()):
            raise BadPackage(
                f"{path}: the {what} file is missing or outside the package; rebuild the package with `trtflow run`"
            )
        with open(path, "rb") as source:
            yield source
        return
    with tarfile.open(package.path, "r:gz") as tar:
        member = next((m for m in tar if m.name == f"{package.manifest.recipe}/{relative}"), None)
        if member is None or not member.isfile():
            raise BadPackage(
                f"{package.path}: no regular file {package.manifest.recipe}/{relative} in the archive; fetch the "
                "package again"
            )
        with required(tar.extractfile(member), member.name) as source:  # a regular file: never None
            yield source


def _source_of(package: Package, item: Engine | Plugin) -> str:
    """Where an engine or a carried plugin is read from: its file in the package, or in a content-addressed remote
    the engine under its sha256 and a plugin beside the version's manifest."""
    if package.version is None:
        return _safe_relative(package, item.file)
    return (
        engine_file(item.sha256)
        if isinstance(item, Engine)
        else version_file(package.version, _safe_relative(package, item.file))
    )


def copy_verified(package: Package, engine: Engine | Plugin, sink: BinaryIO) -> None:
    """Copy the engine into `sink` while hashing it; a sha256 other than the manifest's is refused."""
    digest, written = hashlib.sha256(), 0
    where = package.where(_source_of(package, engine))
    with _open_engine(package, engine) as source:
        for chunk in iter(lambda: source.read(CHUNK), b""):
            written += len(chunk)
            if written > engine.size:  # never write more than the manifest promised
                raise TamperedEngine(
                    f"{where}: larger than the {engine.size} bytes the manifest records; the package is corrupt or "
                    "tampered with: fetch or rebuild it"
                )
            digest.update(chunk)
            sink.write(chunk)
    if digest.hexdigest() != engine.sha256:
        raise TamperedEngine(
            f"{where}: sha256 {digest.hexdigest()} does not match the manifest's {engine.sha256}; the package is "
            "corrupt or tampered with: fetch or rebuild it"
        )


def provision(
    package: Package, device: Device, dest: Path, keep: int = 2, check: Callable[[Engine, Path], dict] | None = None
) -> dict:
    """Choose, verify and install the engine as `<dest>/<recipe>/current/<recipe>.engine`; returns the JSON record.

    The engine is verified while it is copied into a folder that is renamed into place whole, so a tampered one
    never lands; the same engine again is a no-op (deploy.install). `check(engine, path)` (the preflight, a health
    command) runs on the installed bytes before `current` flips; what it raises leaves `current` as it was."""
    chosen, others = choose(package.manifest, device)
    recipe = package.manifest.recipe
    # from the package, into DEST's names
    for field, value in (
        ("recipe", recipe),
        ("precision", chosen.engine.precision),
    ):
        if not SAFE_NAME.fullmatch(value):
            raise BadPackage(
                f"{package.path}: {field} {value!r} is not a plain file name; refusing it (rebuild the package with "
                "`trtflow run`)"
            )
    plugins, extras = plugin_installs(
        chosen.engine, device.plugins, lambda plugin, sink: copy_verified(package, plugin, sink)
    )
    record = {**_record(package, device, chosen, others), **({"plugins": plugins} if plugins else {})}
    checked: dict = {}
    installed = install(
        dest,
        recipe,
        chosen.engine.sha256,
        chosen.engine.size,
        lambda sink: copy_verified(package, chosen.engine, sink),
        record,
        keep,
        None if check is None else lambda path: checked.update(check(chosen.engine, path)),
        extras,
    )
    written: dict[str, str | list[str]] = {
        "engine": str(installed.current / installed.engine.name),
        "version": str(installed.engine.parent),
        "record": str(installed.record),
        "sha256": chosen.engine.sha256,
    }
    written.update({"plugins": [str(installed.engine.parent / name) for name in extras]} if extras else {})
    transfer = (
        None
        if package.remote is None
        else {
            "from": package.remote.shown,
            "bytes": package.remote.transfer.total,
            "files": package.remote.transfer.files,
            "engine_size": chosen.engine.size,
        }
    )
    return {**record, "action": installed.action, "written": written, "transfer": transfer, "checks": checked or None}


def _record(package: Package, device: Device, chosen: Verdict, others: list[tuple[Verdict, str]]) -> dict:
    rules = "applied" if device.runtime_version else "not applied: no --runtime-version given"
    return {
        "package": str(package.path),
        "recipe": package.manifest.recipe,
        "package_complete": package.manifest.complete,
        "signed_by": package.signed_by,
        "package_missing": [m.model_dump() for m in package.manifest.missing],
        "device": {
            "gpu": device.label,
            "compute_capabilities": list(device.compute_capabilities),
            "source": device.source,
            "backend": device.backend,
            "precision": device.precision,
        },
        "runtime": {"version": device.runtime_version, "version_rules": rules},
        "chosen": {
            "file": chosen.engine.file,
            "reason": chosen_because(chosen),
            "manifest_entry": chosen.engine.as_json(),
        },
        "not_chosen": [
            {"file": v.engine.file, "target": v.engine.target, "precision": v.engine.precision, "reason": reason}
            for v, reason in others
        ],
    }
