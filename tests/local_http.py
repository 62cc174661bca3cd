"""What the tests' stand-in servers and CLI jobs share.

``LocalHTTPServer``: a threaded HTTP server on 127.0.0.1 (a free port) whose subclasses answer ``_get`` and
``_post``; used as a context manager. ``job_cmd`` and ``env``: the real CLI in a subprocess, as a user runs it.
"""

from __future__ import annotations

import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


class LocalHTTPServer:
    _httpd: ThreadingHTTPServer | None = None

    @property
    def port(self) -> int:
        assert self._httpd is not None
        return self._httpd.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):  # quiet
                pass

            def do_GET(self):
                server._get(self)

            def do_POST(self):
                server._post(self)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()

    def _send(self, h, status: int, body: bytes, ctype: str = "application/json", headers: dict | None = None):
        h.send_response(status)
        h.send_header("Content-Type", ctype)
        h.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        h.end_headers()
        h.wfile.write(body)

    def _get(self, h) -> None:
        raise NotImplementedError

    def _post(self, h) -> None:
        raise NotImplementedError


def job_cmd(prompt: str, urls: list[str], out: Path, *extra: str) -> list[str]:
    """The main job through the real CLI: Markdown only, quiet, one --backend per URL."""
    cmd = [sys.executable, "-m", "orchestrator", prompt, "--out", str(out), "--format", "md", "-q", *extra]
    for u in urls:
        cmd += ["--backend", u]
    return cmd


def env() -> dict[str, str]:
    """The environment without a key or backends of the developer's own."""
    return {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "HANDBOOK_BACKENDS")}
