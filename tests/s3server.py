"""A real S3-compatible server (moto) on 127.0.0.1 that counts the bytes it serves, per object path, and the size of
every request's and response's HTTP head (request line + headers, status line + headers, as the WSGI layer sees them:
the wire adds only the separators counted here)."""

from __future__ import annotations

import os
import threading
import uuid
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import Any


class CountingS3:
    """moto's S3 in a thread of this process, behind a WSGI layer that adds up GET response bodies by path."""

    def __init__(self) -> None:
        from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
        from moto.server import MotoRequestHandler
        from werkzeug.serving import make_server

        self.served: Counter[str] = Counter()  # path -> body bytes sent for GET requests
        self.requests: list[tuple[str, str]] = []
        # per request: (request head bytes, response head bytes, response status)
        self.heads: list[tuple[int, int, int]] = []
        self._lock = threading.Lock()

        class QuietHandler(MotoRequestHandler):
            def log_request(self, *args: Any) -> None:  # one line per request on stderr otherwise
                pass

        app = DomainDispatcherApplication(create_backend_app)
        self._server = make_server("127.0.0.1", 0, self._counting(app), threaded=True, request_handler=QuietHandler)
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def _counting(self, app: Any) -> Any:
        def wrapped(environ: dict, start_response: Any) -> Iterator[bytes]:
            method, path = environ["REQUEST_METHOD"], environ.get("PATH_INFO", "")
            with self._lock:
                self.requests.append((method, path))
            request_head = (
                len(f"{method} {environ.get('RAW_URI') or path} HTTP/1.1\r\n")
                + sum(
                    len(f"{key[5:].replace('_', '-')}: {value}\r\n")
                    for key, value in environ.items()
                    if key.startswith("HTTP_")
                )
                + sum(
                    len(f"{name}: {environ[key]}\r\n")
                    for key, name in (("CONTENT_TYPE", "Content-Type"), ("CONTENT_LENGTH", "Content-Length"))
                    if environ.get(key)
                )
                + 2
            )

            def counted_start(status: str, headers: list, *rest: Any) -> Any:
                head = len(f"HTTP/1.1 {status}\r\n") + sum(len(f"{k}: {v}\r\n") for k, v in headers) + 2
                with self._lock:
                    self.heads.append((request_head, head, int(status.split()[0])))
                return start_response(status, headers, *rest)

            body: Iterable[bytes] = app(environ, counted_start)
            try:
                for chunk in body:
                    if method == "GET":
                        with self._lock:
                            self.served[path] += len(chunk)
                    yield chunk
            finally:
                close = getattr(body, "close", None)
                if close:
                    close()

        return wrapped

    def reset(self) -> None:
        with self._lock:
            self.served.clear()
            self.requests.clear()
            self.heads.clear()

    def client(self) -> Any:
        """A boto3 S3 client of this server (what an operator's own tools would use beside trtflow)."""
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
        )

    def bucket(self) -> str:
        """A new empty bucket's name."""
        name = f"fleet-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return name

    def env(self) -> dict[str, str]:
        """The environment a trtflow process needs to reach this server (as a fleet agent's would hold)."""
        return {
            **os.environ,
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_CONFIG_FILE": os.devnull,
            "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        }

    def stop(self) -> None:
        self._server.shutdown()
        self._thread.join(timeout=10)
