"""An HTTPS server on 127.0.0.1 that demands a token: a JSON API and git over smart HTTP.

Its certificate (for ``localhost`` and ``127.0.0.1``) comes from a test CA of its own,
``ca_file``: give that to whoever must trust it (the daemon's ``SSL_CERT_FILE``, so that its
credential proxy trusts this server). Every request needs ``Authorization: Bearer TOKEN``,
or basic auth with ``TOKEN`` as the password (what git's credential helper gives), else
``401``. What it serves:

* ``/api/...``: ``{"ok": true, "path": ..., "method": ...}`` (a body is read and counted);
* ``/NAME.git/...``: the bare repository ``root/NAME.git`` through ``git http-backend``
  (as :mod:`tests.fakes.git_server` does it, over TLS here).

Each request's ``Authorization`` headers (all of them, as received) are kept in
``authorizations``, so a test can see exactly what reached the server.
"""

from __future__ import annotations

import base64
import datetime as dt
import hmac
import ipaddress
import json
import socket
import ssl
import threading
from pathlib import Path
from types import TracebackType
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tests.fakes.git_server import _Handler as _GitHandler
from tests.fakes.git_server import _Server as _GitServer

__all__ = ["HttpsServer", "TestCA"]


class TestCA:
    """A throwaway CA that signs server certificates for the tests (files under ``directory``)."""

    __test__ = False  # not a pytest class

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self._key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "superagent test CA")])
        now = dt.datetime.now(dt.UTC)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(hours=1))
            .not_valid_after(now + dt.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self._key, hashes.SHA256())
        )
        self.ca_file = directory / "test-ca.pem"
        self.ca_file.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))

    def issue(self, name: str, hosts: list[str]) -> tuple[Path, Path]:
        """A server certificate for ``hosts`` (names or IPs): (cert file, key file)."""
        key = ec.generate_private_key(ec.SECP256R1())
        sans: list[x509.GeneralName] = []
        for host in hosts:
            try:
                sans.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                sans.append(x509.DNSName(host))
        now = dt.datetime.now(dt.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(hours=1))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(self._key, hashes.SHA256())
        )
        cert_file = self.directory / f"{name}.pem"
        key_file = self.directory / f"{name}.key"
        cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_file.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        key_file.chmod(0o600)
        return cert_file, key_file


class _Server(_GitServer):
    def __init__(self, root: Path, token: str, context: ssl.SSLContext) -> None:
        self.token = token
        self.allowed = 0
        self.authorizations: list[list[str]] = []
        self.lock = threading.Lock()
        self.context = context
        # The git server's handler compares basic auth's password with `password`.
        super().__init__(root, token)
        self.RequestHandlerClass = _Handler

    def finish_request(
        self, request: socket.socket | tuple[bytes, socket.socket], client_address: Any
    ) -> None:
        # TLS in the connection's own thread: a client that never says hello stalls only it.
        assert isinstance(request, socket.socket)
        request.settimeout(30)
        try:
            wrapped = self.context.wrap_socket(request, server_side=True)
        except (OSError, ssl.SSLError):
            return
        super().finish_request(wrapped, client_address)

    def handle_error(
        self, request: socket.socket | tuple[bytes, socket.socket], client_address: Any
    ) -> None:
        pass  # a client that went away mid-request is no test failure


class _Handler(_GitHandler):
    server: _Server

    def _authorized(self) -> str | None:
        given = self.headers.get_all("Authorization") or []
        with self.server.lock:
            self.server.authorizations.append(list(given))
        user: str | None = None
        if len(given) == 1 and given[0].startswith("Bearer "):
            ok = hmac.compare_digest(given[0][7:].encode(), self.server.token.encode())
            user = "bearer" if ok else None
        elif len(given) == 1:
            user = super()._authorized()
        if user is not None:
            with self.server.lock:
                self.server.allowed += 1
        return user

    def _deny(self) -> None:
        with self.server.lock:
            self.server.denied += 1
        self.send_response(401)
        self.send_header("WWW-Authenticate", 'Basic realm="test"')
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _route(self) -> None:
        if ".git/" in self.path.split("?", 1)[0]:
            self._cgi()  # answers 401 itself
            return
        if self._authorized() is None:
            self._deny()
            return
        length = int(self.headers.get("Content-Length") or 0)
        received = len(self.rfile.read(length)) if length else 0
        body = json.dumps(
            {"ok": True, "path": self.path, "method": self.command, "received": received}
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = _route
    do_POST = _route


class HttpsServer:
    """``with HttpsServer(tmp_path, token) as server: server.url("/api/x")``."""

    def __init__(
        self, directory: Path, token: str, *, ca: TestCA | None = None, name: str = "server"
    ) -> None:
        self.ca = ca or TestCA(directory / "test-ca")
        cert_file, key_file = self.ca.issue(name, ["localhost", "127.0.0.1"])
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert_file, key_file)
        self.root = directory / f"{name}-repos"
        self.root.mkdir(parents=True, exist_ok=True)
        self._server = _Server(self.root.resolve(), token, context)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def ca_file(self) -> Path:
        return self.ca.ca_file

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def url(self, path: str, host: str = "localhost") -> str:
        return f"https://{host}:{self.port}{path}"

    def git_url(self, name: str, host: str = "localhost") -> str:
        return self.url(f"/{name}.git", host)

    @property
    def denied(self) -> int:
        return self._server.denied

    @property
    def allowed(self) -> int:
        return self._server.allowed

    @property
    def authorizations(self) -> list[list[str]]:
        with self._server.lock:
            return [list(a) for a in self._server.authorizations]

    def __enter__(self) -> HttpsServer:
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


def basic(user: str, password: str) -> str:
    """An ``Authorization: Basic`` value."""
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
