"""The console's web application: pages, the live state stream, actions and logins
(DESIGN §13 "Console"), on Starlette.

    GET  /                    the single page (every view is drawn by static/console.js)
    GET  /static/...          its script and style, shipped in the package (no CDN)
    GET  /api/state           the model's view as JSON
    GET  /api/events          the view (without `me`), as server-sent events: one `state`
                              event at once and one after each change (at most `max_rate` a
                              second, one every two seconds by default), built once for all streams
    GET  /api/queries/{id}/logs   its output lines as server-sent events (`lines`), what
                              exists, then what comes
    POST /api/queries/{id}/kill   kill a query, as the logged-in principal
    POST /api/topics/{name}/delete  delete a topic, as the logged-in principal
    GET  /login?token=T       the start-up link: logs its holder in as the admin
    POST /login               principal and password (its Kafka SASL password) -> a login
    POST /logout
    GET  /metrics             the process's metrics in Prometheus' text format (reading
                              rights, or HTTP basic authentication with a principal and its
                              password, for scrapers)

Access (`Access`): bound to a loopback address, reading needs no login from a request that
names a loopback host (not from another site's page whose name resolves to 127.0.0.1: DNS
rebinding); bound elsewhere, everything but the login page and the static files does.
Actions (kill, delete) always need a login, and run as its principal through the
coordinator, which authorizes them as it does the CLI's. A login is a random cookie
(HttpOnly, SameSite=Strict); actions also need the header `X-Tq-Console: 1`, which no
cross-site form can send.

Must not: act as anyone but the logged-in principal, or block its event loop on the cluster.
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import ipaddress
import json
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import (
    FileResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from catalog.errors import NotAuthorizedError, TqError

from ._model import ClusterModel

__all__ = ["Access", "Changes", "build_app", "is_loopback"]

STATIC = Path(__file__).parent / "static"
COOKIE = "tq_console"
ACTION_HEADER = "x-tq-console"
MAX_LOGINS = 1024  # logins held at once; the oldest goes first
MAX_FORM_BYTES = 4096
MAX_QUERY_ID = 2**63 - 1  # what the coordinator's messages carry
BAD_QUERY_ID = f"a query id is a whole number from 0 to {MAX_QUERY_ID}"
CROSS_SITE = "a page of another site may not log in or out here"


class Changes:
    """A counter the feed bumps and the event streams wait on (the console's loop only)."""

    def __init__(self) -> None:
        self.count = 0
        self.closed = False  # the console stops: every stream ends
        self._event = asyncio.Event()

    def bump(self) -> None:
        self.count += 1
        self._event.set()

    def close(self) -> None:
        self.closed = True
        self._event.set()

    async def after(self, seen: int, timeout: float) -> int:
        """The count once it is past `seen` (or after `timeout` seconds, whatever it is)."""
        while self.count <= seen and not self.closed:
            self._event.clear()
            try:
                await asyncio.wait_for(self._event.wait(), timeout)
            except TimeoutError:
                break
        return self.count


@dataclass
class Access:
    """Who may do what on this console, and the logins it holds."""

    loopback: bool                                 # bound to a loopback address only
    token: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    # principal, password -> whether the password is that principal's (the console's owner
    # knows how: it holds the cluster secret)
    check_password: Callable[[str, str], bool] = lambda principal, password: False
    logins: dict[str, str] = field(default_factory=dict)  # cookie -> principal
    secure: bool = False  # served over HTTPS: cookies go back over HTTPS only

    def login(self, principal: str) -> str:
        while len(self.logins) >= MAX_LOGINS:
            self.logins.pop(next(iter(self.logins)))
        cookie = secrets.token_urlsafe(32)
        self.logins[cookie] = principal
        return cookie

    def principal(self, request: Request) -> str | None:
        cookie = request.cookies.get(COOKIE)
        return None if cookie is None else self.logins.get(cookie)

    def may_read(self, request: Request) -> bool:
        # Without a login only a page of a loopback name reads: a page of another site whose
        # name its owner made resolve to 127.0.0.1 (DNS rebinding) names its own host.
        return (self.loopback and _names_loopback(request)) \
            or self.principal(request) is not None


Kill = Callable[[str, int], Awaitable[Any]]  # principal, query id -> the query after
Delete = Callable[[str, str], Awaitable[None]]  # principal, topic name
# query id -> batches of its output lines, for as long as the page reads them
Lines = Callable[[int], AsyncIterator[list[dict[str, Any]]]]


_closing: set[asyncio.Future[None]] = set()  # log streams' readers being closed (kept alive)


async def _close_after(pending: asyncio.Future[Any] | None, batches: Any) -> None:
    """Close `batches` (an async generator) once `pending` (a task running it) is done."""
    if pending is not None:
        await asyncio.wait({pending})
    await batches.aclose()


def build_app(model: ClusterModel, changes: Changes, access: Access, kill: Kill,
              lines: Lines, *, delete: Delete | None = None,
              metrics: Callable[[], bytes] | None = None,
              max_rate: float = 0.5) -> Starlette:
    """The console's ASGI application over `model` (see the module docstring)."""

    def refuse_reader(request: Request) -> Response | None:
        if access.may_read(request):
            return None
        if request.url.path.startswith("/api/"):
            return JSONResponse({"error": "log in first"}, status_code=401)
        return RedirectResponse("/login", status_code=303)

    async def page(request: Request) -> Response:
        return refuse_reader(request) or FileResponse(STATIC / "index.html")

    async def state(request: Request) -> Response:
        return refuse_reader(request) or JSONResponse(_state(model, access, request))

    # The view as JSON, built once per change however many pages watch (each event stream
    # sends the same text; who is logged in comes with /api/state, once per page).
    cached: dict[str, Any] = {"count": -1, "text": ""}

    def view_text() -> str:
        if cached["count"] != changes.count:
            cached["count"], cached["text"] = changes.count, json.dumps(model.view())
        return str(cached["text"])

    async def events(request: Request) -> Response:
        refused = refuse_reader(request)
        if refused is not None:
            return refused

        async def stream() -> AsyncIterator[str]:
            seen = -1
            while not changes.closed and not await request.is_disconnected():
                now = await changes.after(seen, timeout=15.0)
                if changes.closed:
                    break
                if now == seen:
                    yield ": still here\n\n"  # a comment: keeps proxies and the browser calm
                    continue
                seen = now
                yield f"event: state\ndata: {view_text()}\n\n"
                await asyncio.sleep(1.0 / max_rate)

        return StreamingResponse(stream(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store"})

    async def metrics_text(request: Request) -> Response:
        if metrics is None:
            return PlainTextResponse("no metrics here", status_code=404)
        if not access.may_read(request) and not _basic_auth_ok(access, request):
            return PlainTextResponse("log in, or give a principal and its password (HTTP "
                                     "basic authentication)", status_code=401,
                                     headers={"WWW-Authenticate": 'Basic realm="tq"'})
        body = await asyncio.to_thread(metrics)  # built on the owners' loops: wait off ours
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    async def logs(request: Request) -> Response:
        refused = refuse_reader(request)
        if refused is not None:
            return refused
        query_id = _query_id(request)
        if query_id is None:
            return JSONResponse({"error": BAD_QUERY_ID}, status_code=400)

        async def stream() -> AsyncIterator[str]:
            batches = lines(query_id)
            pending: asyncio.Future[Any] | None = None
            try:
                yield ": reading\n\n"
                pending = asyncio.ensure_future(anext(batches))
                idle = 0
                while not changes.closed and not await request.is_disconnected():
                    done, _ = await asyncio.wait({pending}, timeout=1.0)
                    if not done:
                        idle += 1
                        if idle % 15 == 0:
                            yield ": still here\n\n"
                        continue
                    idle = 0
                    batch = pending.result()
                    pending = asyncio.ensure_future(anext(batches))
                    yield f"event: lines\ndata: {json.dumps(batch)}\n\n"
            finally:
                # The lines are closed once the task reading the next batch has left them
                # (closing them while it runs them fails), by a task of its own: this one is
                # being cancelled when the browser left, and would be again at each await.
                if pending is not None:
                    pending.cancel()
                closing = asyncio.ensure_future(_close_after(pending, batches))
                _closing.add(closing)
                closing.add_done_callback(_closing.discard)

        return StreamingResponse(stream(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store"})

    def refuse_actor(request: Request, what: str) -> Response | None:
        if access.principal(request) is None:
            return JSONResponse({"error": f"log in to {what}"}, status_code=401)
        if request.headers.get(ACTION_HEADER) != "1":
            return JSONResponse({"error": f"actions need the {ACTION_HEADER} header"},
                                status_code=403)
        return None

    async def delete_topic(request: Request) -> Response:
        refused = refuse_actor(request, "delete a topic")
        if refused is not None:
            return refused
        if delete is None:
            return JSONResponse({"error": "this console deletes nothing"}, status_code=404)
        name = request.path_params["name"]
        try:
            await delete(access.principal(request) or "", name)
        except TqError as exc:
            status = 403 if isinstance(exc, NotAuthorizedError) else 409
            return JSONResponse({"error": str(exc), "kind": type(exc).__name__},
                                status_code=status)
        return JSONResponse({"deleted": name})

    async def kill_query(request: Request) -> Response:
        refused = refuse_actor(request, "kill a query")
        if refused is not None:
            return refused
        principal = access.principal(request) or ""
        query_id = _query_id(request)
        if query_id is None:
            return JSONResponse({"error": BAD_QUERY_ID}, status_code=400)
        try:
            query = await kill(principal, query_id)
        except TqError as exc:
            status = 403 if isinstance(exc, NotAuthorizedError) else 409
            return JSONResponse({"error": str(exc), "kind": type(exc).__name__},
                                status_code=status)
        return JSONResponse({"query_id": query.query_id, "state": str(query.state)})

    async def login_page(request: Request) -> Response:
        token = request.query_params.get("token")
        if token is not None:
            if not hmac.compare_digest(token.encode(), access.token.encode()):
                return PlainTextResponse("this login link is not valid (tq prints a new one "
                                         "at every start)", status_code=401)
            return _logged_in(access.login("admin"), access.secure)
        return FileResponse(STATIC / "login.html")

    async def login(request: Request) -> Response:
        if not _same_origin(request):
            return PlainTextResponse(CROSS_SITE, status_code=403)
        try:
            body = await _bounded_body(request, MAX_FORM_BYTES)
        except ClientDisconnect:  # gone before its form came (or closed for being slow)
            return Response(status_code=400)
        if body is None:
            return PlainTextResponse("a login form is at most 4 KiB", status_code=413)
        # A urlencoded form (what login.html posts), parsed here: no multipart dependency.
        try:
            form = parse_qs(body.decode("utf-8", "replace"), max_num_fields=8)
        except ValueError:  # more fields than that: not a login form
            return PlainTextResponse("a login form has a principal and a password",
                                     status_code=400)
        principal = form.get("principal", [""])[0].strip()
        password = form.get("password", [""])[0]
        if principal and "admin" != principal and ":" not in principal:
            principal = f"user:{principal}"
        if not principal or not access.check_password(principal, password):
            return RedirectResponse("/login?failed=1", status_code=303)
        return _logged_in(access.login(principal), access.secure)

    async def logout(request: Request) -> Response:
        if not _same_origin(request):
            return PlainTextResponse(CROSS_SITE, status_code=403)
        cookie = request.cookies.get(COOKIE)
        if cookie is not None:
            access.logins.pop(cookie, None)
        response = RedirectResponse("/", status_code=303)
        response.delete_cookie(COOKIE)
        return response

    return Starlette(routes=[
        Route("/", page),
        Route("/api/state", state),
        Route("/metrics", metrics_text),
        Route("/api/events", events),
        Route("/api/queries/{query_id}/logs", logs),
        Route("/api/queries/{query_id}/kill", kill_query, methods=["POST"]),
        Route("/api/topics/{name:path}/delete", delete_topic, methods=["POST"]),
        Route("/login", login_page),
        Route("/login", login, methods=["POST"]),
        Route("/logout", logout, methods=["POST"]),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ])


def _state(model: ClusterModel, access: Access, request: Request) -> dict[str, Any]:
    view = model.view()
    view["me"] = access.principal(request)
    return view


def _same_origin(request: Request) -> bool:
    """Whether a form post comes from a page of the console itself: a browser names the
    posting page's origin (another site's page would log the browser in as whoever it chose,
    or out); a client that names none is not a page."""
    origin = request.headers.get("origin")
    if origin is None:
        return True
    try:
        posted_from = urlsplit(origin).netloc.lower()
    except ValueError:
        return False
    return bool(posted_from) and posted_from == request.headers.get("host", "").lower()


def _query_id(request: Request) -> int | None:
    """The query id the path names, or None when no query can have it."""
    text = request.path_params["query_id"]
    if not (text.isascii() and text.isdigit()) or len(text) > 19:
        return None
    query_id = int(text)
    return query_id if query_id <= MAX_QUERY_ID else None


async def _bounded_body(request: Request, limit: int) -> bytes | None:
    """The request's body, or None once it passes `limit` bytes (read no further)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        return None
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            return None
    return bytes(body)


def is_loopback(host: str) -> bool:
    """Whether `host` (an address or a name) is this host's loopback."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _names_loopback(request: Request) -> bool:
    """Whether the request's Host header names a loopback host."""
    try:
        name = urlsplit("//" + request.headers.get("host", "")).hostname
    except ValueError:  # not a host at all ("[::1")
        return False
    return name is not None and is_loopback(name)


def _basic_auth_ok(access: Access, request: Request) -> bool:
    """A scraper's credentials: HTTP basic authentication with a principal and its password."""
    scheme, _, encoded = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "basic" or len(encoded) > 1024:
        return False
    try:
        principal, _, password = base64.b64decode(encoded, validate=True).decode().partition(":")
    except (ValueError, UnicodeDecodeError):
        return False
    if principal != "admin" and ":" not in principal:
        principal = f"user:{principal}"
    return access.check_password(principal, password)


def _logged_in(cookie: str, secure: bool) -> Response:
    response = RedirectResponse("/", status_code=303)
    response.set_cookie(COOKIE, cookie, httponly=True, samesite="strict", secure=secure)
    return response
