"""A local webhook: an HTTP server in a thread that records every JSON POST it gets. The demo's
and the tests' notify target (an Airflow HTTP connection whose host is `url`)."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class WebhookReceiver:
    """Records each POST's JSON body (`posts`, in arrival order) and answers 200; serves from
    `start()` (or entering the context) until `stop()`."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, path: str = "/deltaferry"):
        self.posts: list[dict[str, Any]] = []
        self.path = path
        received = self.posts
        arrived = self._arrived = threading.Condition()

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802  (http.server's name)
                length = int(self.headers.get("Content-Length") or 0)
                try:
                    body = json.loads(self.rfile.read(length) or b"null")
                except ValueError:
                    body = {"unreadable": True}
                with arrived:
                    received.append({"path": self.path, "body": body})
                    arrived.notify_all()
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:  # quiet
                return

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.1,),
                                        daemon=True, name="webhook-receiver")

    @property
    def url(self) -> str:
        """The URL the webhook answers on."""
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}{self.path}"

    def connection(self) -> dict[str, Any]:
        """An Airflow HTTP connection to this webhook (its JSON form, for AIRFLOW_CONN_<ID>)."""
        return {"conn_type": "http", "host": self.url}

    def bodies(self) -> list[dict[str, Any]]:
        """The JSON bodies received so far."""
        return [post["body"] for post in self.posts]

    def wait_for(self, count: int, timeout: float = 30.0) -> list[dict[str, Any]]:
        """The bodies once at least `count` arrived (those so far after `timeout` seconds)."""
        end = time.monotonic() + timeout
        with self._arrived:
            while len(self.posts) < count and time.monotonic() < end:
                self._arrived.wait(max(0.0, end - time.monotonic()))
        return self.bodies()

    def start(self) -> WebhookReceiver:
        """Start serving in a daemon thread; self."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket."""
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> WebhookReceiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
