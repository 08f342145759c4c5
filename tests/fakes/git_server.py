"""A git server over smart HTTP, behind basic auth, on loopback: ``git http-backend`` as CGI.

Fetch and push both need the password, so a push that succeeds proves the credential
reached git (through endpointd's credential helper, in the tests that use it). Bare
repositories live under ``root``; ``http://127.0.0.1:PORT/NAME.git`` serves ``root/NAME.git``.

With ``ca`` (a :class:`tests.fakes.https_server.TestCA`) it serves HTTPS instead, with a
certificate for ``127.0.0.1`` and ``localhost`` from that CA: endpointd's git credential
helper answers only ``https`` requests, so that is what a test of the helper needs. Whoever
connects must trust ``ca.ca_file`` (git: ``GIT_SSL_CAINFO`` or ``http.sslCAInfo``).
"""

from __future__ import annotations

import base64
import http.server
import os
import socket
import ssl
import subprocess
import threading
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tests.fakes.https_server import TestCA


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, root: Path, password: str, tls: ssl.SSLContext | None = None) -> None:
        self.root = root
        self.password = password
        self.denied = 0
        self.pushes = 0
        self.tls = tls
        super().__init__(("127.0.0.1", 0), _Handler)

    def finish_request(
        self, request: socket.socket | tuple[bytes, socket.socket], client_address: Any
    ) -> None:
        if self.tls is not None:
            # TLS in the connection's own thread: a client that never says hello stalls
            # only its own connection.
            assert isinstance(request, socket.socket)
            request.settimeout(30)
            try:
                request = self.tls.wrap_socket(request, server_side=True)
            except (OSError, ssl.SSLError):
                return
        super().finish_request(request, client_address)


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server

    def _authorized(self) -> str | None:
        header = self.headers.get("Authorization", "")
        if not header.startswith("Basic "):
            return None
        try:
            user, _, password = base64.b64decode(header[6:]).decode().partition(":")
        except ValueError:
            return None
        return user if password == self.server.password else None

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = bytearray()
            while True:
                size = int(self.rfile.readline().strip().split(b";")[0], 16)
                if size == 0:
                    self.rfile.readline()
                    return bytes(out)
                out += self.rfile.read(size)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _cgi(self) -> None:
        user = self._authorized()
        if user is None:
            self.server.denied += 1
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="git"')
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        path, _, query = self.path.partition("?")
        body = self._body()
        if path.endswith("/git-receive-pack"):
            self.server.pushes += 1
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "GIT_PROJECT_ROOT": str(self.server.root),
            "GIT_HTTP_EXPORT_ALL": "1",
            "REMOTE_USER": user,
            "REMOTE_ADDR": "127.0.0.1",
            "REQUEST_METHOD": self.command,
            "PATH_INFO": path,
            "QUERY_STRING": query,
            "CONTENT_TYPE": self.headers.get("Content-Type", ""),
            "CONTENT_LENGTH": str(len(body)),
            "GIT_CONFIG_NOSYSTEM": "1",
            "HOME": str(self.server.root),
        }
        if self.headers.get("Content-Encoding") == "gzip":
            env["HTTP_CONTENT_ENCODING"] = "gzip"
        done = subprocess.run(
            ["git", "http-backend"], input=body, env=env, capture_output=True, timeout=60
        )
        head, _, payload = done.stdout.partition(b"\r\n\r\n")
        if not _:
            head, _, payload = done.stdout.partition(b"\n\n")
        status = 200
        headers: list[tuple[str, str]] = []
        for line in head.decode("latin-1").splitlines():
            name, _, value = line.partition(":")
            if name.lower() == "status":
                status = int(value.strip().split()[0])
            elif name:
                headers.append((name, value.strip()))
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = _cgi
    do_POST = _cgi

    def log_message(self, format: str, *args: object) -> None:
        pass


class GitServer:
    """``with GitServer(root, password) as server: server.url("repo")``; HTTPS with ``ca``."""

    def __init__(self, root: Path, password: str, *, ca: TestCA | None = None) -> None:
        tls = None
        if ca is not None:
            cert_file, key_file = ca.issue("git-server", ["127.0.0.1", "localhost"])
            tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            tls.load_cert_chain(cert_file, key_file)
        self._server = _Server(root, password, tls)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def host(self) -> str:
        """``127.0.0.1:PORT``: what git names in its credential requests (``host=``)."""
        return f"127.0.0.1:{self.port}"

    def url(self, name: str) -> str:
        scheme = "https" if self._server.tls is not None else "http"
        return f"{scheme}://{self.host}/{name}.git"

    @property
    def pushes(self) -> int:
        return self._server.pushes

    @property
    def denied(self) -> int:
        return self._server.denied

    def __enter__(self) -> GitServer:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._server.shutdown()
        self._server.server_close()
