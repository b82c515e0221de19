"""Where a program comes from, and reading it from there (blocking: call on a worker thread).

A program *source* is one string, the way the catalog's `Query.program` holds it:

    sha256:<64 hex>          a blob uploaded to the coordinator (fetched by a callback the
                             executor agent provides; see `_artifacts.ArtifactFetcher`)
    file:///abs/path         a file or directory on this host, packed here (`_pack.pack_path`)
    http(s)://host/path      a download: a path ending in `.tar` is taken as a pack as is,
                             anything else as a single file named after the URL's last part

Every read is bounded (`max_bytes`; HTTP also by a total `timeout`), and every failure becomes
a FetchFailedError with its reason. This module knows nothing of the cache.
"""

from __future__ import annotations

import http.client
import re
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Literal

from ._errors import FetchFailedError, FetchReason, InvalidArtifactError
from ._pack import pack_bytes, pack_path, tree_size

__all__ = ["Source", "fetch_file", "fetch_http", "parse_source"]

_DIGEST = re.compile(r"[0-9a-f]{64}")
_CHUNK = 64 * 1024


@dataclass(frozen=True)
class Source:
    """A parsed program source: its kind, the URL or path, and the digest it promises."""

    kind: Literal["upload", "file", "http"]
    location: str            # the path (file), the URL (http), the digest (upload)
    digest: str | None       # the expected sha256 (hex) of the pack, when known

    @property
    def text(self) -> str:
        return f"sha256:{self.location}" if self.kind == "upload" else self.location


def check_digest(digest: str) -> str:
    """A digest as 64 lowercase hex digits (a `sha256:` prefix is allowed), else UserError."""
    value = digest.removeprefix("sha256:").lower()
    if not _DIGEST.fullmatch(value):
        raise InvalidArtifactError(f"not a sha256 digest: {digest[:80]!r} (want 64 hex digits)")
    return value


def parse_source(source: str, digest: str | None = None) -> Source:
    """The Source a program string names; `digest`, when given, is what its pack must hash to.
    FetchFailedError(UNSUPPORTED) for any other scheme."""
    expected = check_digest(digest) if digest else None
    if source.startswith("sha256:"):
        value = check_digest(source)
        if expected is not None and expected != value:
            raise InvalidArtifactError(f"source {source[:80]} and digest {digest} disagree")
        return Source("upload", value, value)
    parts = urllib.parse.urlsplit(source)
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise FetchFailedError(f"file URL names another host: {source[:200]}",
                                   reason=FetchReason.UNSUPPORTED, source=source)
        path = urllib.request.url2pathname(parts.path)
        if not path.startswith("/"):
            raise FetchFailedError(f"file URL needs an absolute path: {source[:200]}",
                                   reason=FetchReason.UNSUPPORTED, source=source)
        return Source("file", path, expected)
    if parts.scheme in ("http", "https") and parts.netloc:
        return Source("http", source, expected)
    raise FetchFailedError(f"cannot fetch a program from {source[:200]!r}: use sha256:DIGEST, "
                           "file:///path or http(s)://...", reason=FetchReason.UNSUPPORTED,
                           source=source)


def fetch_file(path: str, *, max_bytes: int) -> bytes:
    """The pack of a local file or directory."""
    source = Path(path).as_uri()
    if not Path(path).exists():
        raise FetchFailedError(f"no such file or directory: {path}", reason=FetchReason.NOT_FOUND,
                               source=source)
    size = tree_size(path)  # InvalidArtifactError (links to directories, fifos) is the user's
    if size > max_bytes:
        raise FetchFailedError(f"{path} is larger than the maximum of {max_bytes} bytes",
                               reason=FetchReason.TOO_LARGE, source=source)
    return pack_path(path, max_bytes=max_bytes)


class _HttpOnlyRedirects(urllib.request.HTTPRedirectHandler):
    """Follow redirects only to http(s): a download must not turn into a file:// read."""

    def redirect_request(self, req: urllib.request.Request, fp: IO[bytes], code: int, msg: str,
                         headers: http.client.HTTPMessage,
                         newurl: str) -> urllib.request.Request | None:
        if urllib.parse.urlsplit(newurl).scheme not in ("http", "https"):
            raise FetchFailedError(f"refusing a redirect to {newurl[:200]}",
                                   reason=FetchReason.UNSUPPORTED, source=req.full_url)
        return super().redirect_request(req, fp, code, msg, headers, newurl)


_OPENER = urllib.request.build_opener(_HttpOnlyRedirects)


def fetch_http(url: str, *, max_bytes: int, timeout: float) -> bytes:
    """Download `url` within `timeout` seconds in all and at most `max_bytes`; the result is a
    pack (the body itself for `.tar` URLs, else the body packed as one file)."""
    body = _download(url, max_bytes=max_bytes, timeout=timeout)
    name = urllib.parse.unquote(urllib.parse.urlsplit(url).path.rsplit("/", 1)[-1])
    if name.endswith(".tar"):
        return body
    try:
        return pack_bytes(name or "main.py", body)
    except InvalidArtifactError as exc:
        raise FetchFailedError(f"cannot name the program fetched from {url[:200]}: {exc}",
                               reason=FetchReason.UNSUPPORTED, source=url) from exc


def _download(url: str, *, max_bytes: int, timeout: float) -> bytes:
    deadline = time.monotonic() + timeout

    def fail(message: str, reason: FetchReason, retriable: bool | None = None) -> None:
        error = FetchFailedError(f"{url[:200]}: {message}", reason=reason, source=url)
        if retriable is not None:
            error.retriable = retriable
        raise error

    try:
        with _OPENER.open(url, timeout=timeout) as response:
            length = response.headers.get("Content-Length")
            if length is not None and length.isdigit() and int(length) > max_bytes:
                fail(f"{length} bytes is more than the maximum of {max_bytes}",
                     FetchReason.TOO_LARGE)
            chunks, received = [], 0
            while True:
                if time.monotonic() > deadline:
                    fail(f"not complete within {timeout}s", FetchReason.TIMEOUT)
                chunk = response.read(min(_CHUNK, max_bytes + 1 - received))
                if not chunk:
                    break
                received += len(chunk)
                if received > max_bytes:
                    fail(f"more than the maximum of {max_bytes} bytes", FetchReason.TOO_LARGE)
                chunks.append(chunk)
            # http.client ends a body cut short with b"", not an error: else half a program
            # would be installed and run.
            if length is not None and length.isdigit() and received != int(length):
                fail(f"the answer ended after {received} of {length} bytes",
                     FetchReason.UNREACHABLE)
            return b"".join(chunks)
    except urllib.error.HTTPError as exc:
        if exc.code in (404, 410):
            fail(f"HTTP {exc.code}", FetchReason.NOT_FOUND)
        if 300 <= exc.code < 400:  # urllib refused to follow it (to file:, to a loop)
            fail(f"HTTP {exc.code}: a redirect not followed ({exc.reason})",
                 FetchReason.UNSUPPORTED)
        fail(f"HTTP {exc.code} {exc.reason}", FetchReason.HTTP_STATUS,
             retriable=exc.code >= 500 or exc.code in (408, 429))
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, TimeoutError | socket.timeout):
            fail(f"no answer within {timeout}s", FetchReason.TIMEOUT)
        fail(f"unreachable: {exc.reason}", FetchReason.UNREACHABLE)
    except TimeoutError as exc:  # a read that timed out (socket.timeout is TimeoutError)
        raise FetchFailedError(f"{url[:200]}: no answer within {timeout}s",
                               reason=FetchReason.TIMEOUT, source=url) from exc
    except (OSError, http.client.HTTPException) as exc:  # reset, truncated or garbled answer
        raise FetchFailedError(f"{url[:200]}: {exc}", reason=FetchReason.UNREACHABLE,
                               source=url) from exc
    raise AssertionError("unreachable")  # every branch above returns or raises
