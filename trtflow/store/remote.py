"""A shared remote cache (S3, or any fsspec URL): pull a stage on a local miss, push it after a build.

Layout under the remote URL:

    records/<stage key>.json   the stage's record, uploaded last
    objects/<aa>/<sha256>      artifact bytes, uploaded first

Nothing from the remote is trusted until checked: a record must name its key and its components must
hash back to that key, and every object is re-hashed before it enters the local store. With `cache.trust`
set, a record must also be signed by one of those keys (a DSSE envelope, see signing.py): a writer who can
pair a valid key with another valid object cannot sign the pair. Any failed check rejects the whole record
with a warning, and the stage is built locally (then pushed, replacing the bad object). Records are pushed
in an envelope, signed when the environment holds a signing key; with `cache.trust` set and no signing key,
nothing is pushed (one warning). A remote that is down, slow or denies access costs one warning and local builds:
the first failure switches the remote off for the rest of the run. With `--remote-required` it is an error.

Credentials come from the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL, ...)
or the filesystem's own configuration, never from pipeline.yaml, and are never written into records.
fsspec and s3fs are imported only when a remote is configured.
"""

from __future__ import annotations

import concurrent.futures as futures
import json
import tempfile
import threading
import uuid
from pathlib import Path
from typing import Any

from trtflow.errors import ObjectMismatch, RemoteUnavailable
from trtflow.signing import (
    KEY_FILE_ENV,
    KEY_TEXT_ENV,
    RECORD_TYPE,
    SignatureRejected,
    Signer,
    TrustedKeys,
    envelope_body,
    envelope_of,
)
from trtflow.store.records import NO_RECORD, RECORD_MAX_BYTES, StageRecord, checked_record
from trtflow.store.store import Store
from trtflow.util.fsurl import filesystem, one_line, protocols, redacted
from trtflow.util.jsondata import BoundExceeded, loads_bounded

CHUNK = 1 << 20


class _RemoteFailure(Exception):
    """Anything the remote filesystem raised, kept apart from local write errors."""


class Remote:
    """One remote cache for one run. `pull` and `push` never raise for remote trouble unless `required`."""

    def __init__(
        self,
        url: str,
        options: dict | None = None,
        required: bool = False,
        signer: Signer | None = None,
        trust: TrustedKeys | None = None,
    ):
        self.url = url.rstrip("/")
        self.signer, self.trust = signer, trust
        self.shown = redacted(self.url)  # what messages print: no user info, no query (SAS tokens live there)
        self.required = required
        self.down: str | None = None  # why the remote was switched off for this run
        self._warnings: list[str] = []  # appended to by push threads too
        self._lock = threading.Lock()
        self._unsigned_noted = False
        self._rejected: set[str] = set()  # digests the remote holds wrong bytes for: re-upload them
        self._pushes: list[futures.Future] = []
        self._threads: futures.ThreadPoolExecutor | None = None
        self._fs, self._base = filesystem(self.url, dict(options or {}))

    # reading -------------------------------------------------------------------------------
    def pull(self, key: str, node_id: str, store: Store, workdir: Path) -> StageRecord | None:
        """The stage's record with every object verified and added to `store`, or None (miss, rejected, down)."""
        if self.down:
            return None
        try:
            text = self._read(f"records/{key}.json")
        except FileNotFoundError:
            return None
        except _RemoteFailure as exc:
            self._failed(exc.__cause__ or exc, f"reading the record of {node_id}")
            return None
        record, problem = self._opened_record(text, key)
        if problem:
            self._reject(node_id, problem)
            return None
        for digest in record["outputs"].values():
            if not store.objects.intact(digest) and not self._pull_object(digest, node_id, store, workdir):
                return None
        return store.records.put(key, record)

    def _opened_record(self, text: bytes, key: str) -> tuple[StageRecord, str]:
        """(record, "") if the envelope is signed as `cache.trust` demands and the record checks out, else ({}, why
        not)."""
        try:
            document = loads_bounded(text, RECORD_MAX_BYTES)
        except ValueError as exc:
            return NO_RECORD, str(exc) if isinstance(exc, BoundExceeded) else "it is not JSON"
        enveloped = isinstance(document, dict) and "payloadType" in document
        try:
            if self.trust is not None:
                body, _ = self.trust.open(document, RECORD_TYPE)
            else:
                body = envelope_body(document, RECORD_TYPE) if enveloped else text
        except SignatureRejected as exc:
            return NO_RECORD, str(exc)
        return checked_record(body, key)

    def _pull_object(self, digest: str, node_id: str, store: Store, workdir: Path) -> bool:
        temp = Path(tempfile.mkstemp(dir=workdir, prefix="pull-")[1])
        try:
            self._download(f"objects/{digest[:2]}/{digest}", temp, store)
            store.objects.add(temp, expected=digest)
            return True
        except FileNotFoundError:
            self._reject(node_id, f"it names object {digest} that the remote does not hold")
        except ObjectMismatch as exc:
            self._rejected.add(digest)
            self._reject(node_id, f"object {digest} does not match its sha256 ({exc})")
        except _RemoteFailure as exc:
            self._failed(exc.__cause__ or exc, f"downloading an object of {node_id}")
        finally:
            temp.unlink(missing_ok=True)
        return False

    def _read(self, relative: str) -> bytes:
        try:
            data: bytes = self._fs.cat_file(f"{self._base}/{relative}")
            return data
        except FileNotFoundError:
            raise
        except Exception as exc:  # connection refused, access denied, timeouts: every library has its own
            raise _RemoteFailure(str(exc)) from exc

    def _download(self, relative: str, target: Path, store: Store) -> None:
        """Stream a remote file into `target`; remote errors become _RemoteFailure, local ones StoreWriteError."""
        try:
            source = self._fs.open(f"{self._base}/{relative}", "rb")
        except FileNotFoundError:
            raise
        except Exception as exc:
            raise _RemoteFailure(str(exc)) from exc
        with source, store.writing("(downloading from the remote cache)"), open(target, "wb") as out:
            while chunk := _read_chunk(source):
                out.write(chunk)

    # writing -------------------------------------------------------------------------------
    def push(self, key: str, record: StageRecord, store: Store) -> None:
        """Upload a freshly built stage in the background: its objects first, its record last."""
        if self.down:
            return
        if self.trust is not None and self.signer is None:
            if not self._unsigned_noted:
                self._unsigned_noted = True
                self._warn(
                    f"remote cache {self.shown}: not pushing: cache.trust requires signed records and no signing key "
                    f"is set ({KEY_FILE_ENV} or {KEY_TEXT_ENV})"
                )
            return
        if self._threads is None:
            self._threads = futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="trtflow-push")
        paths = {digest: store.objects.path(digest) for digest in record["outputs"].values()}
        self._pushes.append(self._threads.submit(self._push_now, key, record, paths))

    def _push_now(self, key: str, record: StageRecord, paths: dict[str, Path]) -> None:
        if self.down:
            return
        try:
            for digest, path in paths.items():
                target = f"{self._base}/objects/{digest[:2]}/{digest}"
                if digest in self._rejected or not self._fs.exists(target):
                    self._put(target, lambda name, path=path: self._fs.put_file(str(path), name))
            record_text = json.dumps(envelope_of(RECORD_TYPE, record, self.signer), sort_keys=True).encode()
            self._put(f"{self._base}/records/{key}.json", lambda name: self._fs.pipe_file(name, record_text))
        except Exception as exc:  # see _read
            self._failed(exc, f"pushing {record.get('node', key)}")

    def _put(self, target: str, write: Any) -> None:
        """A local directory gets a temp file and a rename (readers never see half a file); S3 PUTs are atomic."""
        if "file" not in protocols(self._fs):
            write(target)
            return
        self._fs.makedirs(target.rsplit("/", 1)[0], exist_ok=True)
        temp = f"{target}.incoming-{uuid.uuid4().hex}"
        write(temp)
        self._fs.mv(temp, target)

    def finish(self) -> None:
        """Wait for every push; with `required`, a failed push raises here."""
        for push in self._pushes:
            push.result()
        self._pushes.clear()

    def close(self) -> None:
        """Stop the push threads: a running upload finishes, queued ones are cancelled (`finish` waits for all)."""
        if self._threads is not None:
            self._threads.shutdown(wait=True, cancel_futures=True)

    # trouble -------------------------------------------------------------------------------
    def take_warnings(self) -> list[str]:
        """Warnings since the last call (the runner shows them as they come)."""
        with self._lock:
            taken, self._warnings = self._warnings, []
        return taken

    def _warn(self, message: str) -> None:
        with self._lock:
            self._warnings.append(message)

    def _failed(self, exc: BaseException, doing: str) -> None:
        message = f"remote cache {self.shown} unavailable ({doing}: {one_line(exc)})"
        if self.required:
            raise RemoteUnavailable(f"{message}; --remote-required was given")
        if self.down is None:
            self.down = message
            self._warn(f"{message}; building locally, remote off for the rest of this run")

    def _reject(self, node_id: str, problem: str) -> None:
        self._warn(f"remote cache: rejected the record of {node_id}: {problem}; building it locally")


def _read_chunk(source: Any) -> bytes:
    try:
        chunk: bytes = source.read(CHUNK)
        return chunk
    except Exception as exc:  # see Remote._read
        raise _RemoteFailure(str(exc)) from exc
