"""The per-command HTTP(S) proxy that adds credentials at egress (DELIVERY_HTTP).

One :class:`CredentialProxy` per command that needs one, in the daemon's event loop, on
``127.0.0.1:<ephemeral>``. The command reaches it through ``HTTPS_PROXY``/``HTTP_PROXY``
(``http://endpointd:TOKEN@127.0.0.1:PORT``) and never sees a credential value:

* **Who may use it.** Every request must carry ``Proxy-Authorization: Basic`` with the
  per-command random token (else ``407``), and, on Linux, come from a process of the
  command's tree (:mod:`endpointd.secrets.peer`: the client's source port leads to its
  socket, the socket to its pid, the pid's parent chain to the command's supervisor; else
  ``403``). Where ``/proc`` is missing the token alone decides.
* **``CONNECT host:port`` to a credential's host** (:func:`host_matches` against the
  credential's ``hosts`` in the local policy): the proxy connects to the real host over TLS,
  verified with the daemon's default trust (``ssl.create_default_context()``, which honours
  ``SSL_CERT_FILE`` in the daemon's environment), then answers ``200``, terminates the
  command's TLS with a leaf certificate of the device CA (:mod:`endpointd.secrets.ca`,
  ALPN ``http/1.1`` only), reads the request head, removes any header of the credential's
  header name the client sent (and the hop-by-hop ones), adds the credential's header line
  and ``Connection: close``, and relays the answer back. One request per connection:
  only that request's body, as its framing delimits it (:class:`_Body`; an ambiguous
  framing is refused), goes upstream after it, and nothing the client sends after it. That
  request must be *for* the CONNECT host (:func:`_bound_target`): exactly one ``Host``
  naming the same host and port, and an origin-form target (``/path``) or an absolute one
  naming them too; else the proxy answers ``421`` (``400`` when malformed) itself and
  nothing goes upstream, so a tunnel opened to the credential's host cannot carry its
  credential (or a request) to another virtual host behind the same address.
* **``CONNECT`` to any other host**: under ``network = "allow"`` a plain TCP tunnel
  (no interception); under ``network = "proxy"`` only to ``[proxy] allow_hosts``; under
  ``network = "deny"`` never. Refusals are ``403`` with one line naming the host and the
  policy key.
* **Plain HTTP** (``GET http://host/...``): forwarded under the same egress rules, and
  never with a credential (a bearer token never travels in clear). A ``Host`` header must
  name the URL's host and port (``421`` otherwise): the egress rules judge the URL, and a
  server behind it would route by the header.

Host patterns: ``name`` (exact, case-insensitive), ``*.example.com`` (any name ending in
``.example.com``, not ``example.com`` itself), each optionally with ``:port``. Without a
port a pattern means the scheme's standard port (443 for ``CONNECT``, 80 for plain HTTP);
with one, exactly that port. So ``localhost:8443`` matches ``CONNECT localhost:8443`` only,
and ``api.github.com`` matches ``CONNECT api.github.com:443`` only.

Header heads are bounded (64 KiB), every read has an idle timeout, and no value ever goes
into a log line, a response or an exception: the only object holding it,
:class:`Injection`, shows the credential's name and hosts in its ``repr``.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hmac
import ipaddress
import logging
import os
import re
import socket
import ssl
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from endpointd.secrets import egress_address, peer
from endpointd.secrets.proxy_door import Door

if TYPE_CHECKING:
    from endpointd.rules.terms import NetworkMode
    from endpointd.secrets.ca import DeviceCA

__all__ = [
    "CredentialProxy",
    "Egress",
    "Injection",
    "ProxyError",
    "host_matches",
    "parse_authority",
]

log = logging.getLogger(__name__)

MAX_HEAD = 64 * 1024
HEAD_TIMEOUT = 30.0
CONNECT_TIMEOUT = 30.0
IDLE_TIMEOUT = 300.0
TLS_HANDSHAKE_TIMEOUT = 30.0
MAX_CONNECTIONS = 256
PROXY_USER = "endpointd"
HTTPS_PORT = 443
HTTP_PORT = 80
_READ = 64 * 1024
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+\Z")
# Never forwarded: they concern the hop to the proxy (or would keep a connection open past
# the one request the credential was added to).
_HOP_BY_HOP = frozenset(
    {"connection", "proxy-connection", "keep-alive", "proxy-authorization", "proxy-authenticate"}
)


class ProxyError(Exception):
    """An answer the proxy gives instead of forwarding (never names a secret value)."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.message = message


# ------------------------------------------------------------------------ host matching


def _normal_host(host: str) -> str:
    host = host.strip().lower().rstrip(".")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host


def parse_authority(authority: str, default_port: int) -> tuple[str, int]:
    """``host[:port]`` (``[v6]:port`` too) -> (host, port); ValueError when malformed."""
    authority = authority.strip()
    if not authority or any(c in authority for c in "/@?# \t"):
        raise ValueError("not a host[:port]")
    if authority.startswith("["):
        end = authority.find("]")
        if end < 0:
            raise ValueError("unclosed [")
        host, rest = authority[1:end], authority[end + 1 :]
        ipaddress.IPv6Address(host)
        if rest and not rest.startswith(":"):
            raise ValueError("junk after ]")
        port_text = rest[1:]
    else:
        host, colon, port_text = authority.rpartition(":")
        if not colon:
            host, port_text = authority, ""
        if ":" in host:
            raise ValueError("an IPv6 address needs [brackets]")
    if port_text:
        if not port_text.isdigit():
            raise ValueError("bad port")
        port = int(port_text)
    else:
        port = default_port
    if not 0 < port < 65536 or not host:
        raise ValueError("bad host or port")
    return _normal_host(host), port


def _pattern(pattern: str, default_port: int) -> tuple[str, int] | None:
    """A host pattern as (name, port): ``*.`` kept on the name, the default port filled in."""
    pattern = pattern.strip()
    wildcard = pattern.startswith("*.")
    try:
        name, port = parse_authority(pattern[2:] if wildcard else pattern, default_port)
    except ValueError:
        return None
    return ("*." + name if wildcard else name), port


def host_matches(patterns: Iterable[str], host: str, port: int, *, default_port: int) -> bool:
    """Whether ``host:port`` matches one of ``patterns`` (see the module doc for the rules)."""
    host = _normal_host(host)
    for pattern in patterns:
        parsed = _pattern(pattern, default_port)
        if parsed is None or parsed[1] != port:
            continue
        name = parsed[0]
        if name.startswith("*."):
            suffix = name[1:]  # ".example.com"
            if host.endswith(suffix) and len(host) > len(suffix):
                return True
        elif host == name:
            return True
    return False


# ------------------------------------------------------------------------ configuration


class Injection:
    """One http-delivered credential: its hosts, and the header line it adds (secret).

    ``header`` is the policy's template (``"Authorization: Bearer {secret}"``); ValueError,
    naming the credential only, when it or the value cannot make one header line.
    """

    __slots__ = ("_line", "header_name", "hosts", "name")

    def __init__(self, name: str, hosts: Sequence[str], header: str, value: bytes) -> None:
        self.name = name
        self.hosts = tuple(hosts)
        field_name, colon, template = header.partition(":")
        if not colon or not _TOKEN.match(field_name) or template.count("{secret}") != 1:
            raise ValueError(
                f"credential {name!r}: its header must be 'Name: ...{{secret}}...' (one line)"
            )
        if any(c in value for c in b"\r\n\0"):
            raise ValueError(
                f"credential {name!r} cannot go in an HTTP header: it holds a line break or NUL"
            )
        before, after = header.split("{secret}")
        line = before.encode("latin-1", "strict") + value + after.encode("latin-1", "strict")
        self.header_name = field_name.lower()
        self._line = line.strip()

    def __repr__(self) -> str:
        return f"Injection(name={self.name!r}, hosts={self.hosts!r})"

    def line(self) -> bytes:
        return self._line


@dataclass(frozen=True)
class Egress:
    """Where a command may go through the proxy besides its credentials' hosts."""

    network: NetworkMode = "allow"
    allow_hosts: tuple[str, ...] = ()


# ------------------------------------------------------------------------ HTTP heads


@dataclass
class _Head:
    method: str
    target: str
    version: str
    headers: list[tuple[str, str]]

    def get(self, name: str) -> str | None:
        name = name.lower()
        return next((v for k, v in self.headers if k.lower() == name), None)


def _parse_head(raw: bytes) -> _Head:
    text = raw.decode("latin-1")
    lines = text.split("\r\n") if "\r\n" in text else text.split("\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not _TOKEN.match(parts[0]) or not parts[2].startswith("HTTP/1."):
        raise ProxyError(400, "Bad Request", "endpointd proxy: not an HTTP/1.x request line")
    headers: list[tuple[str, str]] = []
    for line in lines[1:]:
        if not line:
            continue
        if line[0] in " \t":
            raise ProxyError(400, "Bad Request", "endpointd proxy: folded header lines")
        name, colon, value = line.partition(":")
        if not colon or not _TOKEN.match(name):
            raise ProxyError(400, "Bad Request", "endpointd proxy: malformed header line")
        headers.append((name, value.strip()))
    return _Head(parts[0].upper(), parts[1], parts[2], headers)


async def _read_head(reader: asyncio.StreamReader, timeout: float) -> bytes | None:
    """The request head up to its blank line (None on EOF before any byte)."""
    try:
        data = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial.strip():
            return None
        raise ProxyError(400, "Bad Request", "endpointd proxy: incomplete request head") from None
    except asyncio.LimitOverrunError:
        raise ProxyError(
            431,
            "Request Header Fields Too Large",
            f"endpointd proxy: request head larger than {MAX_HEAD} bytes",
        ) from None
    except TimeoutError:
        raise ProxyError(408, "Request Timeout", "endpointd proxy: no request in time") from None
    return data[:-4]


def _bound_target(head: _Head, host: str, port: int, scheme: str, default_port: int) -> str:
    """The origin-form target of a request that is for ``host:port`` only; ProxyError
    (421 for another host, 400 when malformed) for anything else.

    ``Host`` must appear once and name ``host:port`` (a missing port meaning
    ``default_port``); the target must be ``/path`` (not ``//…``, which some servers read
    as a host) or an absolute ``scheme://host:port/path`` naming the same.
    """
    where = f"{host}:{port}"
    hosts = [value for name, value in head.headers if name.lower() == "host"]
    if len(hosts) != 1:
        raise ProxyError(
            400, "Bad Request", f"endpointd proxy: a request to {where} needs exactly one Host"
        )
    target = head.target
    named = [hosts[0]]
    if target.lower().startswith(scheme + "://"):
        url = urlsplit(target)
        if url.username is not None or url.password is not None:
            raise ProxyError(400, "Bad Request", "endpointd proxy: malformed request target")
        named.append(url.netloc)
        target = (url.path or "/") + (f"?{url.query}" if url.query else "")
    if not target.startswith("/") or target.startswith("//"):
        raise ProxyError(400, "Bad Request", "endpointd proxy: malformed request target")
    for authority in named:
        try:
            same = parse_authority(authority, default_port) == (_normal_host(host), port)
        except ValueError:
            same = False
        if not same:
            raise ProxyError(
                421,
                "Misdirected Request",
                f"endpointd proxy: this connection is for {where}; the request names another host",
            )
    return target


def _response(status: int, reason: str, message: str, extra: Sequence[str] = ()) -> bytes:
    body = (message + "\n").encode("utf-8", "replace")
    lines = [
        f"HTTP/1.1 {status} {reason}",
        "Content-Type: text/plain; charset=utf-8",
        f"Content-Length: {len(body)}",
        "Connection: close",
        *extra,
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1", "replace") + body


def _rewrite(head: _Head, target: str, drop: Iterable[str], add: Sequence[bytes]) -> bytes:
    dropped = {*_HOP_BY_HOP, *(d.lower() for d in drop)}
    lines = [f"{head.method} {target} {head.version}".encode("latin-1")]
    for name, value in head.headers:
        if name.lower() not in dropped:
            lines.append(f"{name}: {value}".encode("latin-1"))
    lines.append(b"Connection: close")
    lines.extend(add)
    return b"\r\n".join(lines) + b"\r\n\r\n"


# ------------------------------------------------------------------------ relaying


def _framing(head: _Head) -> int | None:
    """How long the request's body is: its ``Content-Length`` (0 without one), or None for
    ``chunked``; ProxyError when its framing is ambiguous (both, several different lengths,
    another transfer coding), the ground of request smuggling."""
    lengths = {v.strip() for k, v in head.headers if k.lower() == "content-length"}
    codings = [v.strip().lower() for k, v in head.headers if k.lower() == "transfer-encoding"]
    if codings:
        if lengths or codings != ["chunked"]:
            raise ProxyError(
                400, "Bad Request", "endpointd proxy: only one framing, chunked or a length"
            )
        return None
    if not lengths:
        return 0
    (length,) = lengths if len(lengths) == 1 else ("",)
    if not length.isdigit():
        raise ProxyError(400, "Bad Request", "endpointd proxy: a bad Content-Length")
    return int(length)


class _Body:
    """The one request's body as its framing delimits it, read from the client: once it has
    gone, reads end, so nothing the client sends after its request goes upstream (a second,
    pipelined request naming another host included)."""

    def __init__(self, length: int | None) -> None:
        self.chunked = length is None
        self.left = length or 0  # bytes of the body (or of the current chunk and its CRLF)
        self.done = length == 0

    async def read(self, src: asyncio.StreamReader) -> bytes:
        if self.done:
            return b""
        if self.chunked and self.left == 0:
            return await self._chunk_line(src)
        data = await src.read(min(_READ, self.left))
        self.left -= len(data)
        if not data or (self.left == 0 and not self.chunked):
            self.done = True
        return data

    async def _chunk_line(self, src: asyncio.StreamReader) -> bytes:
        try:
            line = await src.readuntil(b"\r\n")
            size = int(line.split(b";", 1)[0].strip(), 16)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            self.done = True  # a broken body ends the request here
            return b""
        if size > 0:
            self.left = size + 2
            return line
        trailers = line
        while True:  # the trailer section, up to its blank line
            try:
                field = await src.readuntil(b"\r\n")
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError):
                break
            trailers += field
            if field == b"\r\n":
                break
        self.done = True
        return trailers


async def _relay(
    client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    idle: float,
    body: _Body | None = None,
) -> None:
    """Copy bytes both ways until the upstream side ends (or nothing moves for ``idle``);
    with ``body``, only that body goes from the client upstream."""
    loop = asyncio.get_running_loop()
    last = [loop.time()]

    async def pump(
        src: asyncio.StreamReader, dst: asyncio.StreamWriter, body: _Body | None = None
    ) -> None:
        while True:
            try:
                chunk = src.read(_READ) if body is None else body.read(src)
                data = await asyncio.wait_for(chunk, idle)
            except TimeoutError:
                if loop.time() - last[0] < idle:
                    continue  # the other direction is busy
                raise
            if not data:
                return
            last[0] = loop.time()
            dst.write(data)
            await dst.drain()

    up = asyncio.create_task(pump(client[0], upstream[1], body))
    down = asyncio.create_task(pump(upstream[0], client[1]))
    try:
        done, _ = await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
        if down not in done and up.exception() is None:
            # The client finished sending: pass the half-close on where the transport can,
            # and wait for the rest of the answer.
            if upstream[1].can_write_eof():
                with contextlib.suppress(OSError):
                    upstream[1].write_eof()
            await down
    finally:
        for task in (up, down):
            task.cancel()
        for task in (up, down):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


def _close(writer: asyncio.StreamWriter | None) -> None:
    if writer is None:
        return
    with contextlib.suppress(Exception):
        writer.close()


# ------------------------------------------------------------------------ the proxy


class CredentialProxy:
    """One command's proxy. ``start()``, hand ``url`` to the command, ``close()`` at its end.

    ``root_pid`` returns the command's supervisor pid once it is known (None before: every
    client is refused, since no process of the command exists yet). Without ``root_pid``,
    or where ``/proc`` is missing, the token alone decides.
    """

    def __init__(
        self,
        *,
        injections: Sequence[Injection] = (),
        egress: Egress | None = None,
        ca: DeviceCA | None = None,
        root_pid: Callable[[], int | None] | None = None,
        upstream_context: ssl.SSLContext | None = None,
        idle_timeout: float = IDLE_TIMEOUT,
        head_timeout: float = HEAD_TIMEOUT,
    ) -> None:
        if injections and ca is None:
            raise ValueError("intercepting a credential's hosts needs the device CA")
        self.injections = tuple(injections)
        self.egress = egress or Egress()
        self.ca = ca
        self.root_pid = root_pid
        self.token = os.urandom(24).hex()
        self.idle_timeout = idle_timeout
        self.head_timeout = head_timeout
        self._upstream_context = upstream_context
        self._server: asyncio.Server | None = None
        self._socket: socket.socket | None = None
        self._closed = False
        self._tasks: set[asyncio.Task[None]] = set()
        self.port = 0
        # Listeners inside commands' network namespaces, received through the door.
        self._door: Door | None = None
        self._inside: list[asyncio.Server] = []
        self.check_peers = root_pid is not None and peer.proc_available()

    def __repr__(self) -> str:
        names = [i.name for i in self.injections]
        return f"CredentialProxy(port={self.port}, credentials={names!r})"

    @property
    def url(self) -> str:
        """What goes in the command's ``HTTPS_PROXY``/``HTTP_PROXY`` (holds the token)."""
        return f"http://{PROXY_USER}:{self.token}@127.0.0.1:{self.port}"

    def bind(self) -> int:
        """Take a port on 127.0.0.1 (known before :meth:`start` serves it); the port."""
        if self._socket is None:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                sock.bind(("127.0.0.1", 0))
                sock.listen(64)
                sock.setblocking(False)
            except BaseException:
                sock.close()
                raise
            self._socket = sock
            self.port = int(sock.getsockname()[1])
        if self._door is None and peer.proc_available():
            self._door = Door(self._serve_inside)
        return self.port

    @property
    def door(self) -> str:
        """The abstract name of the door through which a command's network namespace hands
        this proxy its listener (:mod:`endpointd.secrets.proxy_door`); "" without one."""
        return self._door.name if self._door is not None else ""

    def _serve_inside(self, listener: socket.socket, sender: int) -> None:
        """Serve the listener a namespace's init (``sender``) passed through the door."""
        if self._closed:
            listener.close()
            return

        async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await self._accept(reader, writer, inside=sender)

        async def serve() -> None:
            try:
                server = await asyncio.start_server(accept, sock=listener, limit=MAX_HEAD)
            except OSError:
                listener.close()
                return
            if self._closed:
                server.close()
            else:
                self._inside.append(server)

        task = asyncio.get_running_loop().create_task(serve())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def start(self) -> None:
        """Serve (in the running event loop) until :meth:`close`."""
        if self._server is not None or self._closed:
            return
        if self._upstream_context is None and self.injections:
            self._upstream_context = await asyncio.to_thread(_default_upstream_context)
        self.bind()
        self._server = await asyncio.start_server(self._accept, sock=self._socket, limit=MAX_HEAD)
        if self._door is not None:
            self._door.start()

    def close(self) -> None:
        """Stop listening and cut every open connection. Idempotent."""
        self._closed = True
        server, self._server = self._server, None
        sock, self._socket = self._socket, None
        if server is not None:
            server.close()
        if sock is not None:
            sock.close()
        if self._door is not None:
            self._door.close()
        for inside in self._inside:
            inside.close()
        self._inside.clear()
        for task in list(self._tasks):
            task.cancel()

    # ------------------------------------------------------------------ a connection

    async def _accept(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        inside: int | None = None,
    ) -> None:
        """One client; ``inside``: it came through a listener in a command's network
        namespace, which that pid passed through the door."""
        task = asyncio.current_task()
        if task is None or self._closed or len(self._tasks) >= MAX_CONNECTIONS:
            _close(writer)
            return
        self._tasks.add(task)
        upstream: asyncio.StreamWriter | None = None
        try:
            upstream = await self._serve(reader, writer, inside)
        except ProxyError as exc:
            with contextlib.suppress(Exception):
                extra = ['Proxy-Authenticate: Basic realm="endpointd"'] if exc.status == 407 else []
                writer.write(_response(exc.status, exc.reason, exc.message, extra))
                await asyncio.wait_for(writer.drain(), 5)
        except (OSError, TimeoutError, ssl.SSLError, asyncio.IncompleteReadError) as exc:
            log.debug("proxy connection ended: %s", type(exc).__name__)
        except asyncio.CancelledError:
            pass
        finally:
            self._tasks.discard(task)
            _close(upstream)
            _close(writer)

    async def _serve(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, inside: int | None
    ) -> asyncio.StreamWriter | None:
        raw = await _read_head(reader, self.head_timeout)
        if raw is None:
            return None
        head = _parse_head(raw)
        if not self._authorized(head):
            raise ProxyError(
                407,
                "Proxy Authentication Required",
                "endpointd proxy: use the proxy URL this command was given (HTTPS_PROXY)",
            )
        if not await self._from_the_command(writer, inside):
            log.warning("credential proxy: refused a client that is not the command's")
            raise ProxyError(
                403,
                "Forbidden",
                "endpointd proxy: this client is not one of the command's processes",
            )
        if head.method == "CONNECT":
            return await self._connect(head, reader, writer)
        if head.target.lower().startswith("http://"):
            return await self._plain(head, reader, writer)
        raise ProxyError(
            400,
            "Bad Request",
            "endpointd proxy: expected CONNECT host:port or an absolute http:// URL",
        )

    def _authorized(self, head: _Head) -> bool:
        given = head.get("Proxy-Authorization")
        if given is None:
            return False
        scheme, _, encoded = given.strip().partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            _, _, password = base64.b64decode(encoded.strip(), validate=True).partition(b":")
        except (binascii.Error, ValueError):
            return False
        return hmac.compare_digest(password, self.token.encode())

    async def _from_the_command(self, writer: asyncio.StreamWriter, inside: int | None) -> bool:
        if inside is not None:
            # Only the namespace's processes can reach its listener; the one that passed
            # it must be the command's (its init).
            root = self.root_pid() if self.root_pid is not None else None
            return root is not None and peer.descends_from(inside, root)
        if not self.check_peers or self.root_pid is None:
            return True
        root = self.root_pid()
        if root is None:
            return False
        client = writer.get_extra_info("peername")
        server = writer.get_extra_info("sockname")
        if not client or not server:
            return False
        return await asyncio.to_thread(
            peer.tcp_peer_in_tree, (client[0], client[1]), (server[0], server[1]), root
        )

    # ------------------------------------------------------------------ where to

    def _credential_for(self, host: str, port: int) -> Injection | None:
        for injection in self.injections:
            if host_matches(injection.hosts, host, port, default_port=HTTPS_PORT):
                return injection
        return None

    def _check_egress(self, host: str, port: int, default_port: int) -> None:
        where = f"{host}:{port}"
        network = self.egress.network
        if network == "allow":
            return
        for injection in self.injections:
            if host_matches(injection.hosts, host, port, default_port=default_port):
                return  # the owner named it for a credential of this command
        if network == "proxy":
            if host_matches(self.egress.allow_hosts, host, port, default_port=default_port):
                return
            log.info("credential proxy: refused %s (not in [proxy] allow_hosts)", where)
            raise ProxyError(
                403,
                "Forbidden",
                f"endpointd proxy: {where} is not allowed: add it to [proxy] allow_hosts in the"
                ' local policy (network = "proxy")',
            )
        log.info("credential proxy: refused %s (network = deny)", where)
        raise ProxyError(
            403,
            "Forbidden",
            f'endpointd proxy: {where} is not allowed: the local policy says network = "deny"',
        )

    async def _open(
        self, host: str, port: int, context: ssl.SSLContext | None
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        where = f"{host}:{port}"
        address = host
        if self.egress.network != "allow":
            # The daemon's side of a command's network namespace: a name must not lead to
            # this machine's own services (secrets/egress_address.py).
            address = await self._vetted(host, port)
        try:
            return await asyncio.wait_for(
                asyncio.open_connection(
                    address,
                    port,
                    ssl=context,
                    server_hostname=host if context is not None else None,
                    limit=MAX_HEAD,
                ),
                CONNECT_TIMEOUT,
            )
        except TimeoutError:
            raise ProxyError(
                504, "Gateway Timeout", f"endpointd proxy: {where} did not answer in time"
            ) from None
        except ssl.SSLCertVerificationError as exc:
            raise ProxyError(
                502,
                "Bad Gateway",
                f"endpointd proxy: {where} failed TLS verification ({exc.verify_message})",
            ) from None
        except (OSError, ssl.SSLError) as exc:
            reason = (
                exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
            )
            raise ProxyError(
                502, "Bad Gateway", f"endpointd proxy: cannot reach {where}: {reason}"
            ) from None

    async def _vetted(self, host: str, port: int) -> str:
        where = f"{host}:{port}"
        try:
            return await asyncio.wait_for(egress_address.vetted(host, port), CONNECT_TIMEOUT)
        except egress_address.LocalAddress as exc:
            log.info("credential proxy: refused %s (%s)", where, exc)
            raise ProxyError(
                403,
                "Forbidden",
                f"endpointd proxy: {where} is not allowed: {exc}; name the address itself in"
                " [proxy] allow_hosts if that is meant",
            ) from None
        except TimeoutError:
            raise ProxyError(
                504, "Gateway Timeout", f"endpointd proxy: {host} did not resolve in time"
            ) from None
        except OSError as exc:
            raise ProxyError(
                502, "Bad Gateway", f"endpointd proxy: cannot resolve {host}: {exc}"
            ) from None

    # ------------------------------------------------------------------ CONNECT

    async def _connect(
        self, head: _Head, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> asyncio.StreamWriter | None:
        try:
            host, port = parse_authority(head.target, HTTPS_PORT)
        except ValueError:
            raise ProxyError(
                400, "Bad Request", "endpointd proxy: CONNECT needs host:port"
            ) from None
        injection = self._credential_for(host, port)
        if injection is None:
            self._check_egress(host, port, HTTPS_PORT)
            up_reader, up_writer = await self._open(host, port, None)
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            await writer.drain()
            await _relay((reader, writer), (up_reader, up_writer), self.idle_timeout)
            return up_writer

        assert self.ca is not None
        assert self._upstream_context is not None
        up_reader, up_writer = await self._open(host, port, self._upstream_context)
        try:
            context = await asyncio.to_thread(self.ca.server_context, host)
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            await writer.drain()
            await writer.start_tls(context, ssl_handshake_timeout=TLS_HANDSHAKE_TIMEOUT)
            try:
                raw = await _read_head(reader, self.head_timeout)
                if raw is None:
                    return up_writer
                inner = _parse_head(raw)
                target = _bound_target(inner, host, port, "https", HTTPS_PORT)
                body = _Body(_framing(inner))
            except ProxyError as exc:
                log.info(
                    "credential proxy: refused a request inside %s:%d (%d)", host, port, exc.status
                )
                writer.write(_response(exc.status, exc.reason, exc.message))
                await writer.drain()
                return up_writer
            up_writer.write(_rewrite(inner, target, (injection.header_name,), (injection.line(),)))
            await up_writer.drain()
            log.debug("credential proxy: added %s's header for %s:%d", injection.name, host, port)
            await _relay((reader, writer), (up_reader, up_writer), self.idle_timeout, body)
        except BaseException:
            _close(up_writer)
            raise
        return up_writer

    # ------------------------------------------------------------------ plain HTTP

    async def _plain(
        self, head: _Head, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> asyncio.StreamWriter | None:
        try:
            url = urlsplit(head.target)
            if url.username is not None or url.password is not None:
                raise ValueError("userinfo")
            host, port = parse_authority(url.netloc, HTTP_PORT)
        except ValueError:
            raise ProxyError(400, "Bad Request", "endpointd proxy: malformed http:// URL") from None
        self._check_egress(host, port, HTTP_PORT)
        path = url.path or "/"
        if url.query:
            path += "?" + url.query
        if head.get("Host") is None:
            add = [f"Host: {url.netloc}".encode("latin-1")]
        else:
            add = []
            _bound_target(head, host, port, "http", HTTP_PORT)
        body = _Body(_framing(head))
        up_reader, up_writer = await self._open(host, port, None)
        try:
            # Never a credential here: plain HTTP would carry it in clear.
            up_writer.write(_rewrite(head, path, (), add))
            await up_writer.drain()
            await _relay((reader, writer), (up_reader, up_writer), self.idle_timeout, body)
        except BaseException:
            _close(up_writer)
            raise
        return up_writer


def _default_upstream_context() -> ssl.SSLContext:
    context = ssl.create_default_context()
    context.set_alpn_protocols(["http/1.1"])
    return context
