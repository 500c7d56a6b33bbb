"""A tiny real HTTP proxy in front of the real Schema Registry that answers 503 on demand.

The registry's 5xx path is a real failure of a real HTTP server (sockets, status line, body), as
a load balancer in front of a restarting registry gives one; the registry itself stays up, so
the run after the failure finds it healthy. Not a mock of the registry: every other request goes
through to it unchanged.
"""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit


@contextmanager
def failing_schema_lookups(registry_url: str, monkeypatch):
    """A FailingProxy in front of `registry_url` (a Confluent-compatible URL with its path),
    exported as DELTAFERRY_SCHEMA_REGISTRY_URL, answering 503 to every schema-id lookup."""
    path = registry_url.split("://", 1)[1].split("/", 1)[1]
    with FailingProxy(registry_url) as proxy:
        monkeypatch.setenv("DELTAFERRY_SCHEMA_REGISTRY_URL", proxy.url(f"/{path}"))
        proxy.failing = f"/{path}/schemas/ids/"
        yield proxy


class FailingProxy:
    """Forwards to `upstream` (scheme://host:port); while `failing` is set, a request whose path
    starts with it gets HTTP 503 instead (counted in `refused`)."""

    def __init__(self, upstream: str):
        parts = urlsplit(upstream)
        self.upstream = f"{parts.scheme}://{parts.netloc}"
        self.failing: str | None = None
        self.refused = 0
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def url(self, path: str = "") -> str:
        """This proxy's base URL plus `path` (e.g. the registry's /apis/ccompat/v7)."""
        return f"http://127.0.0.1:{self.server.server_address[1]}{path}"

    def __enter__(self) -> FailingProxy:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _handler(self):
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _answer(self, status: int, body: bytes, content_type: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _forward(self) -> None:
                if proxy.failing is not None and self.path.startswith(proxy.failing):
                    proxy.refused += 1
                    self._answer(503, b'{"error_code":50301,"message":"unavailable"}',
                                 "application/json")
                    return
                length = int(self.headers.get("Content-Length") or 0)
                request = urllib.request.Request(
                    proxy.upstream + self.path, method=self.command,
                    data=self.rfile.read(length) if length else None,
                    headers={k: v for k, v in self.headers.items()
                             if k.lower() in ("content-type", "accept", "authorization")})
                try:
                    with urllib.request.urlopen(request, timeout=30) as response:
                        status, body = response.status, response.read()
                        content_type = response.headers.get("Content-Type", "")
                except urllib.error.HTTPError as exc:
                    status, body = exc.code, exc.read()
                    content_type = exc.headers.get("Content-Type", "")
                self._answer(status, body, content_type)

            do_GET = do_POST = do_PUT = do_DELETE = _forward

        return Handler
