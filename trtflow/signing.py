"""Ed25519 signatures over stage records (remote cache) and package provenance (DSSE envelopes).

Writers sign with a private key from the environment (TRTFLOW_SIGNING_KEY_FILE: a PEM file; or
TRTFLOW_SIGNING_KEY: the PEM text), never from pipeline.yaml. Readers trust the public keys pipeline.yaml
lists (`cache: {trust: [keys/ci.pub]}`) or `provision --trust` names. A key's id is the sha256 of its raw
32 bytes. Every signature is over a DSSE pre-authentication encoding (type + body), so a record signature
cannot be replayed as a provenance signature or the other way round.

A leaf: imports errors and util only; `cryptography` is imported when a key is used.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtflow.errors import EnvironmentProblem, ProjectError, SignatureRejected, TrtflowError
from trtflow.util.fs import atomic_write
from trtflow.util.reads import note_path
from trtflow.util.text import clipped

KEY_FILE_ENV = "TRTFLOW_SIGNING_KEY_FILE"
KEY_TEXT_ENV = "TRTFLOW_SIGNING_KEY"
RECORD_TYPE = "application/vnd.trtflow.record+json"
STATEMENT_TYPE = "application/vnd.in-toto+json"
KEY_FILE_MAX = 64 << 10


def pae(payload_type: str, body: bytes) -> bytes:
    """DSSE's pre-authentication encoding: what is actually signed."""
    kind = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(body), body)


def key_id(raw_public: bytes) -> str:
    """The id of a public key: sha256 of its raw 32 bytes, hex."""
    return hashlib.sha256(raw_public).hexdigest()


@dataclass(frozen=True)
class Signer:
    """A private key that signs envelopes."""

    key: Any  # cryptography's Ed25519PrivateKey
    keyid: str

    def envelope(self, payload_type: str, body: bytes) -> dict:
        """A DSSE envelope of `body` with this key's signature."""
        signature = self.key.sign(pae(payload_type, body))
        return {
            "payloadType": payload_type,
            "payload": base64.b64encode(body).decode(),
            "signatures": [{"keyid": self.keyid, "sig": base64.b64encode(signature).decode()}],
        }


def unsigned_envelope(payload_type: str, body: bytes) -> dict:
    """A DSSE envelope with no signature (what a writer without a key publishes)."""
    return {"payloadType": payload_type, "payload": base64.b64encode(body).decode(), "signatures": []}


def envelope_of(payload_type: str, value: Any, signer: Signer | None) -> dict:
    """A DSSE envelope of `value`'s canonical JSON, signed by `signer` when there is one."""
    body = canonical_bytes(value)
    return signer.envelope(payload_type, body) if signer is not None else unsigned_envelope(payload_type, body)


@dataclass(frozen=True)
class TrustedKeys:
    """The public keys whose signatures a reader accepts, by key id."""

    keys: dict[str, Any]  # keyid -> Ed25519PublicKey

    def open(self, envelope: Any, payload_type: str) -> tuple[bytes, str]:
        """(body, id of the trusted key that signed it); SignatureRejected says why not."""
        body = envelope_body(envelope, payload_type)
        signatures = envelope.get("signatures") if isinstance(envelope.get("signatures"), list) else []
        if not signatures:
            raise SignatureRejected("it is not signed")
        from cryptography.exceptions import InvalidSignature

        named = []
        for entry in signatures:
            keyid = entry.get("keyid") if isinstance(entry, dict) else None
            named.append(str(keyid)[:16])
            if not isinstance(keyid, str) or keyid not in self.keys:  # a list or an object is no key id
                continue
            try:
                self.keys[keyid].verify(_b64(entry.get("sig")), pae(payload_type, body))
                return body, keyid
            except (InvalidSignature, ValueError):
                raise SignatureRejected(f"its signature by key {keyid[:16]} does not verify (tampered)") from None
        raise SignatureRejected(f"it is signed by no trusted key (signed by {', '.join(named)})")


def envelope_body(envelope: Any, payload_type: str) -> bytes:
    """The payload of a well-formed DSSE envelope of `payload_type` (SignatureRejected if it is not one)."""
    if not isinstance(envelope, dict) or envelope.get("payloadType") != payload_type:
        raise SignatureRejected(f"it is not a {payload_type} envelope")
    try:
        return _b64(envelope.get("payload"))
    except ValueError:
        raise SignatureRejected("its payload is not base64") from None


def _b64(value: Any) -> bytes:
    if not isinstance(value, str):
        raise ValueError("not base64 text")
    return base64.b64decode(value, validate=True)


def signer_from_environment(environ: Mapping[str, str] | None = None) -> Signer | None:
    """The signing key the environment names, or None; a key that cannot be used is exit 4, one line."""
    env: Mapping[str, str] = os.environ if environ is None else environ
    if env.get(KEY_FILE_ENV):
        where = f"{KEY_FILE_ENV}={env[KEY_FILE_ENV]}"
        text = _read_key_file(Path(env[KEY_FILE_ENV]), where, EnvironmentProblem)
    elif env.get(KEY_TEXT_ENV):
        where, text = KEY_TEXT_ENV, env[KEY_TEXT_ENV].encode()
    else:
        return None
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    try:
        key = serialization.load_pem_private_key(text, password=None)
    except (ValueError, TypeError) as exc:
        raise EnvironmentProblem(f"{where}: not an unencrypted PEM private key ({_first_line(exc)})") from exc
    if not isinstance(key, Ed25519PrivateKey):
        raise EnvironmentProblem(f"{where}: an Ed25519 key is needed (make one with `trtflow keygen`)")
    return Signer(key, key_id(_raw_public(key.public_key())))


def trusted_keys(paths: Iterable[tuple[Path, str]], error: type[TrtflowError] = ProjectError) -> TrustedKeys:
    """Load public keys; each (path, where) names the file and the field it came from, for a one-line error."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    keys = {}
    for path, where in paths:
        text = _read_key_file(path, where, error)
        try:
            key = serialization.load_pem_public_key(text)
        except (ValueError, TypeError) as exc:
            raise error(f"{where}: {path} is not a PEM public key ({_first_line(exc)})") from exc
        if not isinstance(key, Ed25519PublicKey):
            raise error(f"{where}: {path} is not an Ed25519 public key (make one with `trtflow keygen`)")
        keys[key_id(_raw_public(key))] = key
    return TrustedKeys(keys)


def generate_key_pair(stem: Path) -> tuple[Path, Path, str]:
    """Write `<stem>.key` (private, 0600) and `<stem>.pub`; refuses to overwrite either. Returns (key, pub, keyid)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    private, public = stem.with_name(stem.name + ".key"), stem.with_name(stem.name + ".pub")
    for path in (private, public):
        if path.exists() or path.is_symlink():
            raise ProjectError(f"{path} exists: refusing to overwrite a key")
    if not stem.parent.is_dir():
        raise ProjectError(f"{stem.parent} is not a folder")
    key = Ed25519PrivateKey.generate()
    atomic_write(
        private,
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
        mode=0o600,
    )
    atomic_write(
        public,
        key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo),
    )
    return private, public, key_id(_raw_public(key.public_key()))


def canonical_bytes(value: Any) -> bytes:
    """The JSON form that is signed: sorted keys, no spaces, UTF-8."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _read_key_file(path: Path, where: str, error: type[TrtflowError]) -> bytes:
    """A key file's bytes: a regular file of at most 64 KiB (one line naming `where` otherwise)."""
    try:
        if not path.is_file():
            raise error(f"{where}: {path} is not a file")
        if path.stat().st_size > KEY_FILE_MAX:
            raise error(f"{where}: {path} is over {KEY_FILE_MAX >> 10} KiB: not a key")
        note_path(path)
        return path.read_bytes()
    except OSError as exc:
        raise error(f"{where}: cannot read {path} ({exc.strerror or exc})") from exc


def _raw_public(key: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def _first_line(exc: BaseException) -> str:
    return clipped((str(exc).splitlines() or [type(exc).__name__])[0], 200)
