"""The dashboard's HTTP server: the standard library's ThreadingHTTPServer, read-only.

Why the standard library: the page is one user polling a few small JSON views every two
seconds; ``http.server`` does that with no dependency to install on a GPU box, and the few
rules that matter are easier to see in forty lines here than in a framework's middleware.

The rules, checked on every request before anything is read:

* **Loopback** (the default, ``--host 127.0.0.1``): only clients whose address is loopback
  are served, and the ``Host`` header must name a loopback host (a web page elsewhere could
  otherwise reach the dashboard through DNS rebinding).
* **Any other host** (``--host 0.0.0.0``, a LAN address): a token is required on every
  request, loopback clients included. It is made at start (or taken from
  ``AUTOLOOP_DASHBOARD_TOKEN`` for a stable bookmark), printed in the URL
  ``http://host:port/?token=...``, and accepted from that query parameter, an
  ``Authorization: Bearer`` header, or the HttpOnly, SameSite=Strict cookie the page gets
  when it is opened with the token, compared in constant time.
* **Read-only**: GET and HEAD only; the page and its two files are served from the package
  by fixed names (no path from a request ever reaches the file system); the JSON views take
  numbers, not paths (views.py confines the ledger's paths to ``results/``).
* Every response forbids framing, sniffing, referrers (the token is in the URL) and
  caching, and the page's Content-Security-Policy allows its own script and style only.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import math
import os
import re
import secrets
import socket
from collections.abc import Callable, Mapping
from http import HTTPStatus
from http.cookies import SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from autoloop.core.errors import AutoloopError
from autoloop.review.dashboard.views import NotFound, WorkspaceViews

TOKEN_ENV = "AUTOLOOP_DASHBOARD_TOKEN"
MIN_TOKEN_CHARS = 16
DEFAULT_PORT = 8765
STATIC = {   # URL path -> (package file, content type)
    "/": ("index.html", "text/html; charset=utf-8"),
    "/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/app.css": ("app.css", "text/css; charset=utf-8"),
}
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
_LOOPBACK_NAMES = {"localhost", "localhost.", "ip6-localhost"}
Query = dict[str, list[str]]   # a request's query string, as parse_qs gives it


class DashboardError(AutoloopError):
    """The dashboard cannot start (port taken, bad host, bad token); one line for the user."""


def is_loopback_host(host: str) -> bool:
    """Whether binding ``host`` serves this machine only."""
    if host.lower() in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def is_loopback_client(address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped   # ::ffff:127.0.0.1 on a dual-stack socket
    return ip.is_loopback


def host_header_is_loopback(value: str | None) -> bool:
    """``Host: 127.0.0.1:8765`` / ``localhost`` / ``[::1]:8765``: yes; anything else: no."""
    if not value:
        return False
    host = value.strip()
    if host.startswith("["):
        host = host[1:host.find("]")] if "]" in host else host
    elif host.count(":") == 1:
        host = host.split(":", 1)[0]
    return is_loopback_host(host)


def static_file(name: str) -> bytes:
    return resources.files("autoloop.review.dashboard").joinpath("static", name).read_bytes()


class Dashboard:
    """What the handler needs: the workspace's views and the access rule in force."""

    def __init__(self, root: Path, token: str | None):
        self.views = WorkspaceViews(root)
        self.token = token
        self.cookie: str | None = None   # named after the port, once bound (make_server)

    def token_ok(self, given: str | None) -> bool:
        if not given or self.token is None:
            return False
        return hmac.compare_digest(given.encode(), self.token.encode())


class Handler(BaseHTTPRequestHandler):
    server_version = "autoloop-dashboard"
    sys_version = ""
    dashboard: Dashboard   # set on the subclass made by make_server

    # -- access -----------------------------------------------------------------------------

    def _token_given(self, query: Query) -> tuple[str | None, bool]:
        """(token, came in the URL): the query, a bearer header, or the cookie."""
        if query.get("token"):
            return query["token"][0], True
        auth = self.headers.get("Authorization", "")
        if auth.lower().startswith("bearer "):
            return auth[7:].strip(), False
        cookie = SimpleCookie()
        try:
            cookie.load(self.headers.get("Cookie", ""))
        except Exception:  # a malformed cookie header is no token
            return None, False
        morsel = cookie.get(self.dashboard.cookie or "")
        return (morsel.value if morsel else None), False

    def _denied(self, query: Query) -> tuple[HTTPStatus, str] | None:
        d = self.dashboard
        if d.token is None:
            if not is_loopback_client(self.client_address[0]):
                return (HTTPStatus.FORBIDDEN,
                        "this dashboard serves this machine only (start it with --host to share it)")
            if not host_header_is_loopback(self.headers.get("Host")):
                return HTTPStatus.FORBIDDEN, "bad Host header: open the dashboard as 127.0.0.1 or localhost"
            return None
        given, _ = self._token_given(query)
        if not d.token_ok(given):
            return HTTPStatus.UNAUTHORIZED, "token required: open the URL that autoloop dashboard printed"
        return None

    # -- responses ---------------------------------------------------------------------------

    def _send(self, status: HTTPStatus, body: bytes, content_type: str, extra: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("X-Frame-Options", "DENY")
        self.send_header("Referrer-Policy", "no-referrer")
        self.send_header("Cross-Origin-Resource-Policy", "same-origin")
        self.send_header("Content-Security-Policy", CSP)
        for key, value in (extra or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _text(self, status: HTTPStatus, text: str) -> None:
        self._send(status, (text + "\n").encode(), "text/plain; charset=utf-8")

    def _json(self, data: dict[str, Any]) -> None:
        self._send(HTTPStatus.OK, json.dumps(_finite(data), allow_nan=False).encode(), "application/json")

    def do_GET(self) -> None:  # http.server's name
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        denied = self._denied(query)
        if denied:
            self._text(*denied)
            return
        try:
            self._route(url.path, query)
        except NotFound as e:
            self._text(HTTPStatus.NOT_FOUND, str(e))
        except (BrokenPipeError, ConnectionResetError):
            pass
        except Exception as e:  # one bad view must not take the page down
            self._text(HTTPStatus.INTERNAL_SERVER_ERROR, f"{type(e).__name__}: {' '.join(str(e).split())}")

    do_HEAD = do_GET

    def _refuse_method(self) -> None:
        self._send(HTTPStatus.METHOD_NOT_ALLOWED, b"read-only: GET and HEAD only\n", "text/plain; charset=utf-8",
                   {"Allow": "GET, HEAD"})

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _refuse_method

    def _route(self, path: str, query: Query) -> None:
        views = self.dashboard.views
        if path in STATIC:
            name, content_type = STATIC[path]
            extra = {}
            given, in_url = self._token_given(query)
            if path == "/" and in_url and self.dashboard.token_ok(given):
                # The page's own requests then carry the token without it in every URL.
                extra["Set-Cookie"] = (f"{self.dashboard.cookie}={given}; HttpOnly; SameSite=Strict; Path=/")
            self._send(HTTPStatus.OK, static_file(name), content_type, extra)
        elif path == "/api/summary":
            self._json(views.summary())
        elif path == "/api/attempts":
            self._json(views.attempts(_int(query, "start", 0)))
        elif path == "/api/attempt":
            self._json(views.attempt(_int(query, "trial", -1), _int(query, "attempt", 1)))
        elif path == "/api/live":
            self._json(views.live())
        elif path == "/api/history":
            self._json(views.history())
        else:
            self._text(HTTPStatus.NOT_FOUND, "not found")

    def log_message(self, format: str, *args: Any) -> None:  # http.server's signature
        pass   # polling every two seconds would flood the terminal


def _finite(value: Any) -> Any:
    """JSON has no NaN or infinity (a diverged run's number): they go out as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _int(query: Query, key: str, default: int) -> int:
    try:
        return int(query[key][0])
    except (KeyError, IndexError, ValueError):
        if default == -1:
            raise NotFound(f"'{key}' must be a whole number") from None
        return default


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def resolve_token(host: str, environ: Mapping[str, str] | None = None) -> str | None:
    """None on loopback; else the token from the environment, or a fresh one."""
    if is_loopback_host(host):
        return None
    given = (environ if environ is not None else os.environ).get(TOKEN_ENV)
    if given is not None:
        if len(given) < MIN_TOKEN_CHARS or not re.fullmatch(r"[A-Za-z0-9_\-.~]+", given):
            raise DashboardError(f"{TOKEN_ENV}: must be at least {MIN_TOKEN_CHARS} characters of letters, digits, "
                                 "'-', '_', '.' or '~'")
        return given
    return secrets.token_urlsafe(24)


def make_server(root: Path, host: str, port: int, token: str | None) -> ThreadingHTTPServer:
    dashboard = Dashboard(root, token)
    handler = type("BoundHandler", (Handler,), {"dashboard": dashboard})
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        server_class = type("Server", (_Server,), {"address_family": family})
        server: ThreadingHTTPServer = server_class((host, port), handler)
    except socket.gaierror:
        raise DashboardError(f"--host {host}: not an address or a name of this machine") from None
    except OSError as e:
        if e.errno in (98, 48):   # EADDRINUSE on Linux, macOS
            raise DashboardError(f"port {port} is in use on {host} (pick another with --port, or 0 for any)") from None
        raise DashboardError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    dashboard.cookie = f"autoloop_token_{server.server_address[1]}"
    return server


def urls(host: str, port: int, token: str | None) -> list[str]:
    """The URLs to print: the bound host's, and for a wildcard bind this machine's name and
    127.0.0.1 (the token in each)."""
    suffix = f"/?token={token}" if token else "/"
    if host in ("0.0.0.0", "::"):
        names = [socket.gethostname(), "127.0.0.1"]
    else:
        names = [f"[{host}]" if ":" in host else host]
    return [f"http://{name}:{port}{suffix}" for name in names]


def serve(root: Path, host: str, port: int, say: Callable[[str], None]) -> None:
    """Serve until Ctrl-C. ``say`` prints one line."""
    if not (Path(root) / "results").is_dir():
        raise DashboardError(f"no results/ in {root}: start a night with autoloop run first (or pass -C DIR)")
    token = resolve_token(host)
    server = make_server(root, host, port, token)
    for url in urls(host, server.server_address[1], token):
        say(f"dashboard: {url}")
    say("read-only; " + ("the token is checked on every request; " if token else "this machine only; ")
        + "Ctrl-C stops it")
    try:
        server.serve_forever(poll_interval=0.25)
    finally:
        server.server_close()
