"""Signed remote records, signed package provenance, and --frozen refusing outputs that left the lock.

The attack these stop: a writer of a shared remote cache pairs a valid stage key with another valid object
(here the sm_86 engine under the sm_89 build's key). Every object still matches its digest and every record
still hashes to its key; only a signature, or the lock, tells the pairing is forged.
"""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import stat
from pathlib import Path

import pytest
from conftest import ARCHIVE, PIPELINE, TINY_RECIPE, read_remote_record, trtflow, write_project, write_remote_record

from trtflow.signing import (
    KEY_FILE_ENV,
    RECORD_TYPE,
    STATEMENT_TYPE,
    SignatureRejected,
    generate_key_pair,
    pae,
    signer_from_environment,
    trusted_keys,
)
from trtflow.util.archive import write_reproducible_tar

pytest.importorskip("fsspec", reason="the remote cache needs fsspec")

ADA, AMPERE = "build:tiny/fp32/rtx-ada", "build:tiny/fp32/rtx-ampere"


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two key pairs: ci (trusted) and mallory (not)."""
    folder = tmp_path_factory.mktemp("keys")
    return {name: generate_key_pair(folder / name)[0] for name in ("ci", "mallory")}


def signer(key: Path):
    return signer_from_environment({KEY_FILE_ENV: str(key)})


def project(root: Path, remote: Path, keys: dict[str, Path], trust: bool = True) -> Path:
    """The tiny project (fp32 on sm_86 and sm_89) with a file:// remote; its pipeline trusts the ci key."""
    (root / "keys").mkdir(parents=True)
    (root / "keys" / "ci.pub").write_bytes(keys["ci"].with_suffix(".pub").read_bytes())
    cache = f"cache:\n  remote: {remote.as_uri()}\n" + ("  trust: [keys/ci.pub]\n" if trust else "")
    return write_project(root, pipeline=PIPELINE + cache)


def run(root: Path, *args: str) -> dict:
    result = trtflow(root, "run", "--json", *args)
    summary = json.loads(result.out) if result.out.strip() else {}
    return {"code": result.code, "err": result.err, **summary}


def status(summary: dict, node_id: str) -> tuple[str, str]:
    return next((n["status"], n["reason"]) for n in summary["nodes"] if n["id"] == node_id)


def forge_pairing(remote: Path, lock: dict, signed_by=None) -> None:
    """Rewrite the sm_89 build's remote record to name the sm_86 engine: both valid, the pair forged."""
    path = remote / "records" / f"{lock[ADA]['key']}.json"
    record = read_remote_record(path)
    record["outputs"] = dict(lock[AMPERE]["outputs"])
    write_remote_record(path, record, signed_by)


# units ---------------------------------------------------------------------------------------


def test_keygen_writes_a_private_key_only_its_owner_reads(tmp_path: Path) -> None:
    result = trtflow(tmp_path, "keygen", str(tmp_path / "ci"))
    assert result.code == 0 and "key id" in result.out
    assert stat.S_IMODE((tmp_path / "ci.key").stat().st_mode) == 0o600
    assert trtflow(tmp_path, "keygen", str(tmp_path / "ci")).code == 3  # never overwrites a key


def test_a_signature_covers_the_type_and_every_byte(keys: dict[str, Path]) -> None:
    ci = signer(keys["ci"])
    trust = trusted_keys([(keys["ci"].with_suffix(".pub"), "test")])
    envelope = ci.envelope(RECORD_TYPE, b'{"key": "k"}')
    assert trust.open(envelope, RECORD_TYPE) == (b'{"key": "k"}', ci.keyid)
    with pytest.raises(SignatureRejected, match="not a application/vnd.in-toto"):
        trust.open(envelope, STATEMENT_TYPE)  # a record signature is no provenance signature
    retyped = {**envelope, "payloadType": STATEMENT_TYPE}
    with pytest.raises(SignatureRejected, match="does not verify"):
        trust.open(retyped, STATEMENT_TYPE)
    tampered = {**envelope, "payload": ci.envelope(RECORD_TYPE, b'{"key": "x"}')["payload"]}
    with pytest.raises(SignatureRejected, match="does not verify"):
        trust.open(tampered, RECORD_TYPE)
    with pytest.raises(SignatureRejected, match="signed by no trusted key"):
        trust.open(signer(keys["mallory"]).envelope(RECORD_TYPE, b"{}"), RECORD_TYPE)
    assert pae("t", b"ab") == b"DSSEv1 1 t 2 ab"


@pytest.mark.parametrize("content, message", [(None, "is not a file"), (b"not a key", "is not a PEM public key")])
def test_a_bad_trusted_key_is_a_project_error_naming_the_field(
    tmp_path: Path, keys: dict[str, Path], content, message
) -> None:
    root = project(tmp_path / "p", tmp_path / "remote", keys)
    if content is None:
        (root / "keys" / "ci.pub").unlink()
    else:
        (root / "keys" / "ci.pub").write_bytes(content)
    result = trtflow(root, "validate")
    assert result.code == 3 and f"pipeline.yaml: cache.trust[0]: {root / 'keys' / 'ci.pub'} {message}" in result.err


def test_a_bad_signing_key_is_exit_4_before_any_work(
    tmp_path: Path, keys: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    root = project(tmp_path / "p", tmp_path / "remote", keys)
    monkeypatch.setenv(KEY_FILE_ENV, str(keys["ci"].with_suffix(".pub")))
    result = trtflow(root, "run")
    assert result.code == 4 and f"{KEY_FILE_ENV}=" in result.err and "not an unencrypted PEM private key" in result.err
    assert not (root / "artifacts").exists()


# the remote ----------------------------------------------------------------------------------


@pytest.fixture
def published(tmp_path: Path, keys: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> tuple[Path, dict]:
    """A remote filled by a CI run holding the ci key; (remote, that run's lock nodes)."""
    remote = tmp_path / "remote"
    first = project(tmp_path / "first", remote, keys)
    monkeypatch.setenv(KEY_FILE_ENV, str(keys["ci"]))
    summary = run(first)
    assert summary["code"] == 0 and summary["warnings"] == [], summary["err"]
    monkeypatch.delenv(KEY_FILE_ENV)
    return remote, json.loads((first / "trtflow.lock").read_text())["nodes"]


def test_signed_records_are_pulled(tmp_path: Path, keys: dict[str, Path], published: tuple[Path, dict]) -> None:
    remote, _ = published
    summary = run(project(tmp_path / "second", remote, keys))
    assert summary["code"] == 0 and summary["built"] == 0 and summary["warnings"] == [], summary
    envelope = json.loads(next((remote / "records").glob("*.json")).read_text())
    assert envelope["payloadType"] == RECORD_TYPE and len(envelope["signatures"]) == 1


@pytest.mark.parametrize(
    "how, rejection",
    [("keep", "does not verify"), ("unsigned", "it is not signed"), ("mallory", "signed by no trusted key")],
)
def test_a_forged_pairing_is_rejected_and_built_locally(
    tmp_path: Path, keys: dict[str, Path], published: tuple[Path, dict], how: str, rejection: str
) -> None:
    remote, lock = published
    path = remote / "records" / f"{lock[ADA]['key']}.json"
    envelope = json.loads(path.read_text())
    forge_pairing(remote, lock, signer(keys["mallory"]) if how == "mallory" else None)
    if how == "keep":  # the forged record under the old, valid signature
        forged = json.loads(path.read_text())
        path.write_text(json.dumps({**forged, "signatures": envelope["signatures"]}))
    second = project(tmp_path / "second", remote, keys)
    summary = run(second)
    assert summary["code"] == 0, summary["err"]
    assert status(summary, ADA)[0] == "built"
    assert any(f"rejected the record of {ADA}: " in w and rejection in w for w in summary["warnings"]), summary[
        "warnings"
    ]
    manifest = json.loads((second / "artifacts/packages/tiny/manifest.json").read_text())
    engines = {e["target"]: e["sha256"] for e in manifest["engines"]}
    assert engines["rtx-ada"] != lock[AMPERE]["outputs"]["engine"]  # never the sm_86 engine under the sm_89 name


def test_without_trust_a_forged_pairing_is_refused_by_frozen(
    tmp_path: Path, keys: dict[str, Path], published: tuple[Path, dict]
) -> None:
    """No trust configured: the forged record passes every check but the lock's; --frozen refuses it."""
    remote, lock = published
    forge_pairing(remote, lock)
    second = project(tmp_path / "second", remote, keys, trust=False)
    (second / "trtflow.lock").write_bytes((tmp_path / "first" / "trtflow.lock").read_bytes())
    summary = run(second, "--frozen")
    assert summary["code"] == 1
    assert status(summary, ADA)[0] == "failed" and "engine differs from trtflow.lock" in status(summary, ADA)[1]
    assert not (second / "artifacts/packages/tiny").exists()


def test_trust_without_a_signing_key_reads_but_never_pushes(tmp_path: Path, keys: dict[str, Path]) -> None:
    remote = tmp_path / "remote"
    summary = run(project(tmp_path / "p", remote, keys))
    assert summary["code"] == 0
    assert [w for w in summary["warnings"] if "not pushing" in w and KEY_FILE_ENV in w] and len(
        summary["warnings"]
    ) == 1
    assert not (remote / "records").exists()


# packages ------------------------------------------------------------------------------------


@pytest.fixture
def signed_package(tmp_path: Path, keys: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> Path:
    root = write_project(tmp_path / "p", {"tiny": TINY_RECIPE + ARCHIVE})
    monkeypatch.setenv(KEY_FILE_ENV, str(keys["ci"]))
    assert trtflow(root, "run").code == 0
    monkeypatch.delenv(KEY_FILE_ENV)
    return root / "artifacts" / "packages"


def provision(packages: Path, target: str, *args: str):
    return trtflow(
        packages,
        "provision",
        str(packages / target),
        "--gpu",
        "sm_89",
        "--dest",
        str(packages.parent / "dest"),
        "--json",
        *args,
    )


@pytest.mark.parametrize("target", ["tiny", "tiny.tar.gz", "tiny/manifest.json"])
def test_provision_accepts_a_package_a_trusted_key_signed(
    signed_package: Path, keys: dict[str, Path], target: str
) -> None:
    result = provision(signed_package, target, "--require-signature", "--trust", str(keys["ci"].with_suffix(".pub")))
    assert result.code == 0, result.err
    assert json.loads(result.out)["signed_by"] == signer(keys["ci"]).keyid
    statement = json.loads(base64.b64decode(json.loads((signed_package / "tiny.intoto.jsonl").read_text())["payload"]))
    assert statement["predicateType"] == "https://slsa.dev/provenance/v1"
    assert {s["name"] for s in statement["subject"]} >= {"tiny.tar.gz", "tiny/manifest.json"}


def test_an_archive_packed_by_hand_is_held_to_the_signed_manifest_and_its_engines(
    tmp_path: Path, keys: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without `package: {archive: true}` the provenance names no archive: one packed later from the folder is
    accepted through the signed manifest, and an engine swapped inside it is still refused."""
    root = write_project(tmp_path / "p")
    monkeypatch.setenv(KEY_FILE_ENV, str(keys["ci"]))
    assert trtflow(root, "run").code == 0
    monkeypatch.delenv(KEY_FILE_ENV)
    packages = root / "artifacts" / "packages"
    statement = json.loads(base64.b64decode(json.loads((packages / "tiny.intoto.jsonl").read_text())["payload"]))
    assert "tiny.tar.gz" not in {s["name"] for s in statement["subject"]}
    write_reproducible_tar(packages / "tiny", packages / "tiny.tar.gz", "tiny")
    trust = ("--require-signature", "--trust", str(keys["ci"].with_suffix(".pub")))
    accepted = provision(packages, "tiny.tar.gz", *trust)
    assert accepted.code == 0, accepted.err
    swapped = tmp_path / "swapped"
    shutil.copytree(packages / "tiny", swapped)
    engine = next(swapped.glob("engines/rtx-ada/*.engine"))
    engine.chmod(0o644)
    engine.write_bytes(engine.read_bytes()[:-1] + b"\x01")
    write_reproducible_tar(swapped, packages / "tiny.tar.gz", "tiny")
    shutil.rmtree(root / "artifacts" / "dest")  # a device without the engine yet
    refused = provision(packages, "tiny.tar.gz", *trust)
    assert refused.code == 3 and "sha256" in refused.err, refused.err


def test_provision_refuses_what_the_signature_does_not_cover(signed_package: Path, keys: dict[str, Path]) -> None:
    trust = ("--require-signature", "--trust", str(keys["ci"].with_suffix(".pub")))
    assert provision(signed_package, "tiny", "--require-signature").code == 2  # no --trust
    untrusted = provision(
        signed_package, "tiny", "--require-signature", "--trust", str(keys["mallory"].with_suffix(".pub"))
    )
    assert untrusted.code == 3 and "signed by no trusted key" in untrusted.err
    manifest = signed_package / "tiny" / "manifest.json"
    manifest.write_text(manifest.read_text().replace('"passed": true', '"passed": false', 1))
    changed = provision(signed_package, "tiny", *trust)
    assert changed.code == 3 and "does not cover this manifest.json" in changed.err
    with open(signed_package / "tiny.tar.gz", "ab") as archive:
        archive.write(b"\0" * 512)
    assert provision(signed_package, "tiny.tar.gz", *trust).code == 3
    (signed_package / "tiny.intoto.jsonl").unlink()
    missing = provision(signed_package, "tiny", *trust)
    assert missing.code == 3 and "no provenance beside the package" in missing.err
    assert not (signed_package.parent / "dest").exists()


def test_a_published_package_is_checked_against_its_signed_provenance_at_the_url(
    signed_package: Path, keys: dict[str, Path], tmp_path: Path
) -> None:
    url = (tmp_path / "share" / "tiny").as_uri()
    assert trtflow(signed_package, "publish", str(signed_package / "tiny"), url).code == 0
    trust = ("--require-signature", "--trust", str(keys["ci"].with_suffix(".pub")))
    accepted = trtflow(
        signed_package, "provision", url, "--gpu", "sm_89", "--dest", str(tmp_path / "dest"), "--json", *trust
    )
    assert accepted.code == 0, accepted.err
    record = json.loads(accepted.out)
    share, version = tmp_path / "share" / "tiny", record["version"]
    # issue 29: the channel layout
    assert record["signed_by"] == signer(keys["ci"]).keyid and set(record["transfer"]["files"]) == {
        "channels/stable.json",
        f"versions/{version}/manifest.json",
        f"versions/{version}/provenance.intoto.jsonl",
        f"engines/{record['chosen']['manifest_entry']['sha256']}.engine",
    }
    edited = (
        (share / "versions" / version / "manifest.json")
        .read_text()
        .replace('"passed": true', '"passed": false', 1)
        .encode()
    )
    other = hashlib.sha256(edited).hexdigest()  # a self-consistent version the provenance does not cover
    (share / "versions" / other).mkdir()
    (share / "versions" / other / "manifest.json").write_bytes(edited)
    shutil.copyfile(
        share / "versions" / version / "provenance.intoto.jsonl", share / "versions" / other / "provenance.intoto.jsonl"
    )
    channel = json.loads((share / "channels" / "stable.json").read_text())
    (share / "channels" / "stable.json").write_text(json.dumps({**channel, "history": [other, version]}))
    changed = trtflow(signed_package, "provision", url, "--gpu", "sm_89", "--dest", str(tmp_path / "d2"), *trust)
    assert (
        changed.code == 3
        and f"{url}/versions/{other}/provenance.intoto.jsonl: the signed provenance does not cover this manifest.json"
        in changed.err
    )
    (share / "versions" / other / "provenance.intoto.jsonl").unlink()
    missing = trtflow(signed_package, "provision", url, "--gpu", "sm_89", "--dest", str(tmp_path / "d2"), *trust)
    assert missing.code == 3 and "provenance.intoto.jsonl: not found (--require-signature)" in missing.err
    assert not (tmp_path / "d2").exists()


def test_an_unsigned_run_writes_unsigned_provenance(built_project: Path, keys: dict[str, Path]) -> None:
    packages = built_project / "artifacts" / "packages"
    envelope = json.loads((packages / "tiny.intoto.jsonl").read_text())
    assert envelope["signatures"] == [] and envelope["payloadType"] == STATEMENT_TYPE
    result = trtflow(
        built_project,
        "provision",
        str(packages / "tiny"),
        "--gpu",
        "sm_89",
        "--dest",
        str(built_project / "d"),
        "--require-signature",
        "--trust",
        str(keys["ci"].with_suffix(".pub")),
    )
    assert result.code == 3 and "it is not signed" in result.err


# repair --------------------------------------------------------------------------------------


@pytest.mark.parametrize("damage", ["engine", "extra file", "manifest", "archive", "folder gone"])
def test_a_changed_package_is_found_and_restored(built_project: Path, damage: str) -> None:
    packages = built_project / "artifacts" / "packages"
    folder, archive = packages / "tiny", packages / "tiny.tar.gz"
    if damage == "archive":
        (built_project / "recipes" / "tiny.yaml").write_text(TINY_RECIPE + ARCHIVE)
        assert trtflow(built_project, "run").code == 0 and archive.is_file()
    before = {p.relative_to(packages): p.read_bytes() for p in packages.rglob("*") if p.is_file()}
    engine = next(folder.glob("engines/*/*.engine"))
    if damage == "engine":
        with open(engine, "r+b") as handle:
            handle.seek(100)
            handle.write(b"\xff")
    elif damage == "extra file":
        (folder / "engines" / "evil.engine").write_bytes(b"x")
    elif damage == "manifest":
        (folder / "manifest.json").write_text("{}")
    elif damage == "archive":
        archive.write_bytes(archive.read_bytes()[:-10])
    else:
        shutil.rmtree(folder)
    result = trtflow(built_project, "run", "--json")
    assert result.code == 0, result.err
    warnings = json.loads(result.out)["warnings"]
    if damage == "archive":  # written through its hard link: the store's object is found corrupt too
        assert len(warnings) == 2 and "was corrupt" in warnings[0], warnings
    assert "restored it from the store" in warnings[-1] and len(warnings) <= 2, warnings
    assert {p.relative_to(packages): p.read_bytes() for p in packages.rglob("*") if p.is_file()} == before
    again = trtflow(built_project, "run", "--json")
    assert json.loads(again.out)["warnings"] == []
