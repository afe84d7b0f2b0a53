"""SLSA provenance for each package: an in-toto Statement in a DSSE envelope, `<packages>/<recipe>.intoto.jsonl`.

What it says: the subjects (the package's manifest.json, every engine and its archive if it has one, by sha256),
what they were built from (the source model, the cleaned model, each engine's calibration data digest, each engine's
stage key) and by what (trtflow's version, each backend and its version). It holds no time stamp and no machine
name, so the same package and key give the same bytes. Signed with the run's signing key when the environment holds
one (signing.py), unsigned otherwise; `provision --require-signature --trust KEY.pub` accepts a package only
when a trusted key signed a statement whose manifest digest (and archive digest, for a .tar.gz it names) match.
The chain is: signature -> manifest.json's sha256 -> every engine's sha256 (checked while it is copied).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trtflow import __version__
from trtflow.errors import UntrustedPackage
from trtflow.manifest import MANIFEST_FILE
from trtflow.signing import STATEMENT_TYPE, SignatureRejected, Signer, TrustedKeys, envelope_of
from trtflow.util.fs import read_regular
from trtflow.util.jsondata import BoundExceeded, loads_bounded

STATEMENT = "https://in-toto.io/Statement/v1"
PREDICATE = "https://slsa.dev/provenance/v1"
BUILD_TYPE = "urn:trtflow:build-type:package:v1"
BUILDER = "urn:trtflow:builder"
SUFFIX = ".intoto.jsonl"
MAX_BYTES = 8 << 20


def provenance_path(package: Path) -> Path:
    """Where a package's provenance lives: beside its folder or archive, `<recipe>.intoto.jsonl`."""
    name = package.name.removesuffix(".tar.gz").removesuffix(".tgz")
    return package.with_name(name + SUFFIX)


def statement(recipe: str, archive_sha256: str | None, manifest_sha256: str, manifest: dict, package_key: str) -> dict:
    """The in-toto Statement (SLSA provenance v1 predicate) of one package (its archive a subject when it has one)."""
    engines = manifest.get("engines", [])
    subjects = [{"name": f"{recipe}.tar.gz", "digest": {"sha256": archive_sha256}}] if archive_sha256 else []
    subjects += [{"name": f"{recipe}/{MANIFEST_FILE}", "digest": {"sha256": manifest_sha256}}]
    subjects += [{"name": f"{recipe}/{e['file']}", "digest": {"sha256": e["sha256"]}} for e in engines]
    source = manifest.get("source", {})
    materials = [
        {"name": "source model", "digest": {"sha256": source.get("sha256")}},
        {"name": "cleaned model", "digest": {"sha256": source.get("cleaned_sha256")}},
    ]
    materials += [
        {
            "name": f"calibration data of {e['precision']} ({e['target']})",
            "digest": {"sha256": e["calibration"]["data_digest"]},
        }
        for e in engines
        if e.get("calibration")
    ]
    builds = [
        {
            "file": e["file"],
            "target": e["target"],
            "precision": e["precision"],
            "compute_capabilities": e["compute_capabilities"],
            "builder": e.get("builder"),
            "stage_key": e.get("stage_key"),
        }
        for e in engines
    ]
    versions = {"trtflow": __version__, **{e["backend"]: e["backend_version"] for e in engines}}
    return {
        "_type": STATEMENT,
        "subject": subjects,
        "predicateType": PREDICATE,
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": {"recipe": recipe},
                "internalParameters": {
                    "package_stage_key": package_key,
                    "engines": builds,
                    "missing": manifest.get("missing", []),
                },
                "resolvedDependencies": materials,
            },
            "runDetails": {"builder": {"id": BUILDER, "version": versions}},
        },
    }


def envelope_line(statement_: dict, signer: Signer | None) -> bytes:
    """The provenance file's bytes: one DSSE envelope as a JSON line."""
    return json.dumps(envelope_of(STATEMENT_TYPE, statement_, signer), sort_keys=True).encode() + b"\n"


def check(
    path: Path, trust: TrustedKeys, recipe: str, manifest_sha256: str, archive_sha256: str | None
) -> tuple[dict, str]:
    """(the verified statement of a package, the id of the key that signed it), or UntrustedPackage naming what is
    wrong."""
    statement_, keyid = _open(path, trust)
    subject = statement_.get("subject")
    subjects = subject if isinstance(subject, list) else []
    digests = {
        s["name"]: s["digest"].get("sha256")
        for s in subjects
        if isinstance(s, dict) and isinstance(s.get("name"), str) and isinstance(s.get("digest"), dict)
    }
    if digests.get(f"{recipe}/{MANIFEST_FILE}") != manifest_sha256:
        raise UntrustedPackage(
            f"{path}: the signed provenance does not cover this {MANIFEST_FILE} (it was changed or "
            "belongs to another package)"
        )
    archived = digests.get(f"{recipe}.tar.gz")
    if archive_sha256 is not None and archived is not None and archived != archive_sha256:
        raise UntrustedPackage(
            f"{path}: the signed provenance does not cover this archive (it was changed or belongs to another build)"
        )
    return statement_, keyid


def _open(path: Path, trust: TrustedKeys) -> tuple[dict, str]:
    """The statement inside the provenance file, if a trusted key signed it."""
    try:
        if not path.is_file():
            raise UntrustedPackage(
                f"{path}: no provenance beside the package (--require-signature); fetch {path.name} with it"
            )
        if path.stat().st_size > MAX_BYTES:
            raise UntrustedPackage(f"{path}: over {MAX_BYTES >> 20} MiB: not a provenance file")
        envelope = loads_bounded(read_regular(path, MAX_BYTES + 1).splitlines()[0], MAX_BYTES)
        body, keyid = trust.open(envelope, STATEMENT_TYPE)
        statement_: Any = loads_bounded(body, MAX_BYTES)
    except (OSError, ValueError, IndexError) as exc:
        why = str(exc) if isinstance(exc, BoundExceeded) else type(exc).__name__
        raise UntrustedPackage(f"{path}: not a provenance file ({why})") from exc
    except SignatureRejected as exc:
        raise UntrustedPackage(f"{path}: the provenance is refused: {exc}") from exc
    if (
        not isinstance(statement_, dict)
        or statement_.get("_type") != STATEMENT
        or statement_.get("predicateType") != PREDICATE
    ):
        raise UntrustedPackage(f"{path}: not an in-toto SLSA provenance statement")
    return statement_, keyid
