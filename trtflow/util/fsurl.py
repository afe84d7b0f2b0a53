"""fsspec URLs (s3://, gs://, file://, ...) for everything trtflow reads or writes remotely: one way to open them.

S3 and HTTP get short timeouts (S3 one quick retry, botocore's own retries off): a remote that does not answer must
not hold up a build or a provision for minutes. Credentials come from the environment or the filesystem's own
configuration; messages show URLs without user info or query strings. fsspec is imported only when used.
"""

from __future__ import annotations

import copy
from typing import Any

from trtflow.errors import EnvironmentProblem
from trtflow.util.text import clipped

S3_DEFAULTS: dict[str, Any] = {
    "config_kwargs": {"connect_timeout": 3, "read_timeout": 30, "retries": {"max_attempts": 1, "mode": "standard"}},
    "skip_instance_cache": True,
}
S3_RETRIES = 2


def is_url(text: str) -> bool:
    """True for `scheme://...` (a remote or file:// URL), False for a plain local path."""
    head, sep, _ = text.partition("://")
    return bool(sep) and head.replace("+", "").replace("-", "").isalnum()


def filesystem(url: str, options: dict, purpose: str = "a remote cache") -> tuple[Any, str]:
    """(fsspec filesystem, base path) for `url`; `purpose` names what needs it in the errors."""
    try:
        import fsspec
    except ImportError:
        raise EnvironmentProblem(f"{purpose} needs fsspec: pip install 'trtflow[remote]'") from None
    protocol = url.split("://", 1)[0]
    if protocol in ("s3", "s3a"):
        options = {**copy.deepcopy(S3_DEFAULTS), **options}  # s3fs edits the dicts it is given
    elif protocol in ("http", "https"):
        options = {**_http_defaults(), **options}
    try:
        fs, base = fsspec.core.url_to_fs(url, **options)
    except ImportError as exc:
        raise EnvironmentProblem(
            f"{purpose} {redacted(url)} needs a package that is missing ({exc}): pip install 'trtflow[s3]'"
        ) from exc
    except ValueError as exc:
        raise EnvironmentProblem(f"{purpose} {redacted(url)} cannot be opened: {exc}") from exc
    if protocol in ("s3", "s3a"):
        fs.retries = S3_RETRIES
    return fs, base.rstrip("/")


def _http_defaults() -> dict[str, Any]:
    """A server that accepts and then says nothing fails in seconds, not aiohttp's five minutes; a large engine
    still streams as long as bytes keep coming."""
    try:
        import aiohttp
    except ImportError:  # fsspec says what is missing when it opens the URL
        return {}
    return {"client_kwargs": {"timeout": aiohttp.ClientTimeout(total=None, sock_connect=3, sock_read=30)}}


def redacted(url: str) -> str:
    """The URL without `user:password@` and without its query string, for messages and logs."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def protocols(fs: Any) -> tuple[str, ...]:
    """The filesystem's protocol names (fsspec gives a string or a tuple)."""
    protocol = fs.protocol
    return (protocol,) if isinstance(protocol, str) else tuple(protocol)


def one_line(exc: BaseException) -> str:
    """`Type: message` on one line, at most 300 characters: what a remote's failure looks like in a message."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return clipped(f"{type(exc).__name__}: {text}", 300)
