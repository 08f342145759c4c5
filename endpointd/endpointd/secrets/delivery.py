"""Handing brokered credentials to an exec's child process, and taking them back.

A command names the credentials it needs (``Command.credentials``, names only) and how each
reaches the child; the values come from the device's keyring. This module turns the two
into what the child gets:

``DELIVERY_ENV``
    The value in environment variable ``env_var``.
``DELIVERY_FILE``
    The value in a fresh 0600 file in ``<spool>/credentials/`` (a 0700 directory), whose
    absolute path goes in ``env_var``.
``DELIVERY_GIT_HELPER``
    git is configured through ``GIT_CONFIG_COUNT``/``GIT_CONFIG_KEY_n``/``GIT_CONFIG_VALUE_n``
    to use one credential helper only, ``endpointd/secrets/git_helper.py``, which asks a
    :class:`GitHelperServer` in the daemon over a unix socket made for this command alone
    (0600, in a fresh 0700 directory): it answers ``get`` with ``username`` (``env_var``, or
    ``x-access-token``) and ``password`` (the value), but only for ``protocol=https`` and a
    ``host`` among the credential's ``hosts`` in the local policy (required), and only to a
    process of the command's tree (``SO_PEERCRED``, then the parent chain to the
    supervisor, on Linux). Anything else gets no answer, and git fails to authenticate.
``DELIVERY_HTTP``
    The value never reaches the command. A :class:`~endpointd.secrets.proxy.CredentialProxy`
    in the daemon, for this command alone, adds the credential's header (the policy's
    ``header``) to HTTPS requests for the credential's ``hosts`` (required). The command gets
    the proxy in ``HTTPS_PROXY``/``HTTP_PROXY`` (and lower-case; ``NO_PROXY`` emptied), and
    a CA bundle (the system's trust store plus the device CA, whose leaf certificates the
    proxy shows for those hosts) in ``SSL_CERT_FILE``, ``REQUESTS_CA_BUNDLE``,
    ``NODE_EXTRA_CA_CERTS``, ``GIT_SSL_CAINFO`` and ``CURL_CA_BUNDLE``. The same proxy, without
    credentials, enforces ``network = "proxy"`` (``[proxy] allow_hosts``) for commands that
    have none (:func:`prepare` with ``egress``).

Where values may go: the environment the daemon hands the supervisor (in memory: a pipe or
the zygote's socket, never a file or argv; see :mod:`endpointd.process.executor`), the child's
environment, the DELIVERY_FILE files, the git helper's socket, and the proxy's upstream
connections. Never argv, never a log, never an error message (errors name credentials and
variables, never values).

What a command can read: env and file deliveries, plainly. The git helper's value is never
in its environment or files, but any of its processes can ask git for it
(``git credential fill``) for the credential's hosts, so count it as readable by the command.
Only the http delivery keeps the value out of the command altogether.

When things go away:

* DELIVERY_FILE files: the supervisor deletes them (it lists them in its spec's
  ``remove_after``) once the command and whatever was left of its process group are gone,
  before it writes ``status.json``. The supervisor outlives a daemon restart, so this
  holds across one. If the supervisor itself dies (SIGKILL), :func:`remove` (the daemon,
  when it records the command's end, at once or after a restart) deletes the directory.
* The git helper and the proxy: served by the daemon that started the command, closed when
  it ends (:meth:`Prepared.close`). A restarted daemon serves neither: git's requests then
  fail, so the command fails to authenticate rather than getting anything else, and its
  requests through the proxy fail to connect. The supervisor removes the git helper's
  socket and its directory at the end as well, so a daemon crash leaves nothing behind
  either. The CA bundle (public certificates only) goes with :meth:`Prepared.close`.

Env var names are checked (:func:`check`) so that a control plane cannot use a delivered
value, or the path of a delivered file, to change how programs start (``BASH_ENV`` pointed
at a secret file, ``LD_PRELOAD``, ``PATH``, ``PYTHON*``, ``GIT_*`` ...).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import shlex
import shutil
import socket
import struct
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from endpointd import commanduser
from endpointd.rules import environment
from endpointd.secrets import peer
from endpointd.secrets.proxy import (
    HTTPS_PORT,
    CredentialProxy,
    Egress,
    Injection,
    host_matches,
    parse_authority,
)
from endpointd.spoolformat import TMP_DIR
from superagent_shared.messages import CredentialRef, Delivery

if TYPE_CHECKING:
    from endpointd.rules.tables import CredentialScope
    from endpointd.secrets.ca import DeviceCA

log = logging.getLogger(__name__)

# Under the command's spool: the DELIVERY_FILE files.
# Inside the command's private TMPDIR: the one place outside its workspace the sandbox lets
# it read (the rest of endpointd's state dir, other commands' credentials included, is
# denied to it).
CREDENTIALS_DIR = os.path.join(TMP_DIR, "credentials")
# Under the command's spool, until the sandbox gives each command its own TMPDIR: the CA
# bundle of the http delivery.
TMP_DIR = "tmp"
# What the command's environment gets for the proxy and its CA bundle.
PROXY_VARS = ("HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy")
NO_PROXY_VARS = ("NO_PROXY", "no_proxy")
CA_BUNDLE_VARS = (
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
    "GIT_SSL_CAINFO",
    "CURL_CA_BUNDLE",
)
GIT_USERNAME_DEFAULT = "x-access-token"
# Linux refuses a single environment string longer than this (MAX_ARG_STRLEN, 128 KiB); a
# little margin for the name.
MAX_ENV_VALUE = 120 * 1024
# A unix socket path must fit sun_path (104 bytes on macOS, 108 on Linux).
_MAX_SOCKET_PATH = 100
# The git helper's request and the time it may take to send it.
_MAX_REQUEST = 64 * 1024
_REQUEST_TIMEOUT = 10.0

_CLIENT = Path(__file__).with_name("git_helper.py")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# Variables a delivered value may never be put in: those that change how a program or the
# dynamic loader starts, which files a shell sources, where programs are found, where they
# send traffic and what they trust (:func:`endpointd.rules.environment.reserved`).

_DELIVERY_NAMES: dict[int, str] = {
    Delivery.ENV: "env",
    Delivery.FILE: "file",
    Delivery.GIT_HELPER: "git helper",
    Delivery.HTTP: "http",
}


class DeliveryError(Exception):
    """A credential cannot be delivered as asked. The message names the credential and the
    variable, never the value: the daemon sends it back as Refused
    (REASON_CREDENTIAL_UNAVAILABLE)."""


def _check_env_name(ref: CredentialRef) -> None:
    name = ref.env_var
    how = _DELIVERY_NAMES.get(ref.delivery, "this delivery")
    if not name:
        raise DeliveryError(f"credential {ref.name!r}: {how} delivery needs env_var")
    if not _ENV_NAME.match(name):
        raise DeliveryError(
            f"credential {ref.name!r}: env_var {name!r} is not a valid environment variable "
            "name (letters, digits and _, not starting with a digit)"
        )
    if environment.reserved(name):
        raise DeliveryError(
            f"credential {ref.name!r}: env_var {name!r} is reserved (it could change how "
            "programs start); choose another name"
        )


def check(refs: Sequence[CredentialRef]) -> None:
    """Check what can be checked without the values (names, variables, deliveries).

    Raises :class:`DeliveryError`. The daemon may call this on receipt, before Accepted;
    :func:`prepare` calls it again.
    """
    targets: dict[str, str] = {}
    git_helpers = 0
    for ref in refs:
        if not ref.name:
            raise DeliveryError("a credential reference has no name")
        if ref.delivery in (Delivery.ENV, Delivery.FILE):
            _check_env_name(ref)
            earlier = targets.get(ref.env_var.upper())
            if earlier is not None:
                raise DeliveryError(
                    f"credentials {earlier!r} and {ref.name!r} both target env_var {ref.env_var!r}"
                )
            targets[ref.env_var.upper()] = ref.name
        elif ref.delivery == Delivery.HTTP:
            pass  # env_var unused; the hosts are checked against the policy by prepare()
        elif ref.delivery == Delivery.GIT_HELPER:
            git_helpers += 1
            if git_helpers > 1:
                raise DeliveryError(
                    f"credential {ref.name!r}: only one credential per command can be "
                    "delivered through the git helper"
                )
            if ref.env_var and not _plain_line(ref.env_var.encode()):
                raise DeliveryError(
                    f"credential {ref.name!r}: the git username (env_var) must be one line "
                    "without NUL"
                )
        else:
            raise DeliveryError(
                f"credential {ref.name!r}: unknown delivery {int(ref.delivery)} "
                "(expected env, file, git helper or http)"
            )


def _plain_line(value: bytes) -> bool:
    return not any(c in value for c in (b"\n", b"\r", b"\0"))


class GitCredential:
    """What the git helper serves for one command (the password is a secret)."""

    __slots__ = ("hosts", "password", "socket_path", "username")

    def __init__(
        self, socket_path: str, username: str, password: bytes, hosts: Sequence[str] = ()
    ) -> None:
        self.socket_path = socket_path
        self.username = username
        self.password = password
        self.hosts = tuple(hosts)

    def __repr__(self) -> str:
        return (
            f"GitCredential(socket_path={self.socket_path!r}, username={self.username!r},"
            f" hosts={self.hosts!r})"
        )


class Prepared:
    """One command's delivered credentials: what to add to its environment, what to remove
    once it ends, and the git helper and proxy to serve meanwhile.

    ``repr`` names credentials only. Lifecycle: :func:`prepare` → :meth:`start` (serves the
    git helper and the proxy, if any) → the command runs
    (:func:`endpointd.process.executor.exec_spec` takes this object) → :meth:`close` when it ends
    (also fine if the command never started).
    """

    def __init__(self) -> None:
        # Variables to set (values may be secret).
        self.env: dict[str, str] = {}
        # git configuration entries to append after any GIT_CONFIG_* already present.
        self.git_config: list[tuple[str, str]] = []
        # Files first, then directories: what the supervisor removes when the command ends.
        self.remove_after: list[str] = []
        self.git: GitCredential | None = None
        self.names: list[str] = []  # the credentials delivered (for last-use bookkeeping)
        # The command's proxy (http delivery, or network = "proxy"); its CA bundle.
        self.proxy: CredentialProxy | None = None
        self.ca_bundle: Path | None = None
        # The command's supervisor pid, once known (the git helper and proxy check peers).
        self.root_pid: Callable[[], int | None] | None = None
        self._file_dir: str | None = None
        self._socket_dir: str | None = None
        self._server: GitHelperServer | None = None
        self._proxy_started = False

    def __repr__(self) -> str:
        return f"Prepared(credentials={self.names!r}, proxy_port={self.proxy_port})"

    @property
    def proxy_port(self) -> int | None:
        """The port of the command's proxy on 127.0.0.1 (None: no proxy)."""
        return self.proxy.port if self.proxy is not None else None

    def apply(self, env: Mapping[str, str]) -> dict[str, str]:
        """``env`` with the delivered variables set, and the git helper configured.

        The git entries are appended to any ``GIT_CONFIG_COUNT`` entries ``env`` holds, so
        those keep working; git applies entries in order, and ours (an empty
        ``credential.helper`` that clears the list, then ours) come last.
        """
        merged = {**env, **self.env}
        if self.git_config:
            try:
                count = int(merged.get("GIT_CONFIG_COUNT", "0"))
            except ValueError:
                count = 0  # git would refuse a bogus count anyway: start afresh
            count = max(count, 0)
            for key, value in self.git_config:
                merged[f"GIT_CONFIG_KEY_{count}"] = key
                merged[f"GIT_CONFIG_VALUE_{count}"] = value
                count += 1
            merged["GIT_CONFIG_COUNT"] = str(count)
        return merged

    async def start(self) -> None:
        """Serve the git helper and the proxy, if this command has them (before it starts).

        Raises :class:`DeliveryError` if they cannot be served.
        """
        if self.git is not None and self._server is None:
            server = GitHelperServer()
            try:
                await server.start(
                    self.git.socket_path,
                    self.git.username,
                    self.git.password,
                    hosts=self.git.hosts,
                    root_pid=self.root_pid,
                )
            except OSError as exc:
                server.close()
                raise DeliveryError(
                    f"the git credential helper cannot be served: {exc.strerror or exc}"
                ) from None
            self._server = server
        if self.proxy is not None and not self._proxy_started:
            try:
                await self.proxy.start()
            except OSError as exc:
                raise DeliveryError(
                    f"the credential proxy cannot be served: {exc.strerror or exc}"
                ) from None
            self._proxy_started = True

    def close(self) -> None:
        """Stop the git helper and the proxy, delete what :func:`prepare` made. Idempotent."""
        if self._server is not None:
            self._server.close()
            self._server = None
        if self.proxy is not None:
            self.proxy.close()
        if self._file_dir is not None:
            shutil.rmtree(self._file_dir, ignore_errors=True)
        if self._socket_dir is not None:
            shutil.rmtree(self._socket_dir, ignore_errors=True)
        if self.ca_bundle is not None:
            with contextlib.suppress(OSError):
                self.ca_bundle.unlink()


def credentials_dir(spool: Path) -> Path:
    return spool / CREDENTIALS_DIR


def remove(spool: Path) -> None:
    """Delete a command's DELIVERY_FILE files, whoever started it (see the module doc).

    For the daemon, whenever it records an exec's end (also the "outcome unknown" end after
    a restart): normally the supervisor has deleted them already.
    """
    shutil.rmtree(credentials_dir(spool), ignore_errors=True)


def prepare(
    spool: Path,
    refs: Sequence[CredentialRef],
    values: Mapping[str, bytes],
    *,
    scopes: Mapping[str, CredentialScope] | None = None,
    egress: Egress | None = None,
    directory: Path | None = None,
    ca: DeviceCA | None = None,
    root_pid: Callable[[], int | None] | None = None,
) -> Prepared:
    """Lay out the delivery of ``refs`` (values by credential name) for a command.

    ``scopes``: the local policy's ``[credentials.NAME]`` tables (the git helper and the
    http delivery need their ``hosts``, the http delivery their ``header``). ``egress``:
    the policy's network mode and ``[proxy] allow_hosts``; under ``network = "proxy"`` the
    command gets the proxy even without an http credential. ``directory``: where the CA
    bundle goes (default ``<spool>/tmp``, made 0700). ``ca``: the device CA (default: one
    made for this process, in memory). ``root_pid``: the command's supervisor pid once it
    is known, for the peer checks of the git helper and the proxy.

    Writes the DELIVERY_FILE files and the CA bundle, picks the git helper's socket path
    and the proxy's port; nothing is served until :meth:`Prepared.start`. Raises
    :class:`DeliveryError` (nothing is left behind).
    """
    check(refs)
    for ref in refs:
        if ref.name not in values:
            raise DeliveryError(f"credential {ref.name!r} is not available on this device")
    scopes = scopes or {}
    egress = egress or Egress()
    prepared = Prepared()
    prepared.root_pid = root_pid
    injections: list[Injection] = []
    try:
        for index, ref in enumerate(refs):
            value = values[ref.name]
            if ref.delivery == Delivery.ENV:
                prepared.env[ref.env_var] = _env_value(ref, value)
            elif ref.delivery == Delivery.FILE:
                path = _write_file(prepared, spool, index, ref, value)
                prepared.env[ref.env_var] = path
            elif ref.delivery == Delivery.HTTP:
                injections.append(_injection(ref, scopes, value))
            else:
                _prepare_git(prepared, ref, value, _hosts(ref, scopes))
            prepared.names.append(ref.name)
        if injections or egress.network == "proxy":
            _prepare_proxy(prepared, spool, injections, egress, directory, ca)
    except BaseException:
        prepared.close()
        raise
    if prepared._file_dir is not None:
        prepared.remove_after.append(prepared._file_dir)
    if prepared._socket_dir is not None:
        assert prepared.git is not None
        prepared.remove_after += [prepared.git.socket_path, prepared._socket_dir]
    return prepared


def _hosts(ref: CredentialRef, scopes: Mapping[str, CredentialScope]) -> tuple[str, ...]:
    """The credential's ``hosts`` in the policy; DeliveryError when there are none."""
    scope = scopes.get(ref.name)
    hosts = scope.hosts if scope is not None else ()
    if not hosts:
        how = _DELIVERY_NAMES.get(ref.delivery, "this")
        raise DeliveryError(
            f"credential {ref.name!r}: {how} delivery is only for the hosts the local policy"
            f' names: add hosts = ["api.example.com"] to [credentials.{ref.name}] in'
            " policy.toml"
        )
    return hosts


def _injection(
    ref: CredentialRef, scopes: Mapping[str, CredentialScope], value: bytes
) -> Injection:
    from endpointd.rules.terms import DEFAULT_HEADER

    hosts = _hosts(ref, scopes)
    scope = scopes[ref.name]
    try:
        return Injection(ref.name, hosts, scope.header or DEFAULT_HEADER, value)
    except (ValueError, UnicodeError) as exc:
        raise DeliveryError(str(exc) if isinstance(exc, ValueError) else "bad header") from None


_fallback_ca: DeviceCA | None = None


def _process_ca() -> DeviceCA:
    """A CA for this process alone, when the caller has no device CA to give."""
    global _fallback_ca
    if _fallback_ca is None:
        from endpointd.secrets.ca import DeviceCA

        _fallback_ca = DeviceCA.generate()
    return _fallback_ca


def _prepare_proxy(
    prepared: Prepared,
    spool: Path,
    injections: Sequence[Injection],
    egress: Egress,
    directory: Path | None,
    ca: DeviceCA | None,
) -> None:
    if injections:
        from endpointd.secrets.ca import write_bundle

        ca = ca or _process_ca()
        if directory is None:
            directory = spool.absolute() / TMP_DIR
            spool.mkdir(parents=True, exist_ok=True, mode=0o700)
            directory.mkdir(mode=0o700, exist_ok=True)
        try:
            prepared.ca_bundle = write_bundle(directory, ca)
        except OSError as exc:
            raise DeliveryError(
                f"cannot write the CA bundle for the credential proxy: {exc.strerror or exc}"
            ) from None
    proxy = CredentialProxy(
        injections=injections,
        egress=egress,
        ca=ca if injections else None,
        root_pid=prepared.root_pid,
    )
    try:
        proxy.bind()
    except OSError as exc:
        raise DeliveryError(
            f"the credential proxy cannot listen on 127.0.0.1: {exc.strerror or exc}"
        ) from None
    prepared.proxy = proxy
    for name in PROXY_VARS:
        prepared.env[name] = proxy.url
    for name in NO_PROXY_VARS:
        prepared.env[name] = ""
    if prepared.ca_bundle is not None:
        for name in CA_BUNDLE_VARS:
            prepared.env[name] = str(prepared.ca_bundle)


def _env_value(ref: CredentialRef, value: bytes) -> str:
    if b"\0" in value:
        raise DeliveryError(
            f"credential {ref.name!r} contains a NUL byte, which an environment variable "
            "cannot hold; deliver it as a file"
        )
    if len(value) > MAX_ENV_VALUE:
        raise DeliveryError(
            f"credential {ref.name!r} is too large for an environment variable "
            f"({len(value)} bytes); deliver it as a file"
        )
    # Any bytes: surrogateescape round-trips what is not UTF-8 (through the spec's JSON
    # too) back to the same bytes when the supervisor hands the environment to exec.
    return os.fsdecode(value)


def _write_file(
    prepared: Prepared, spool: Path, index: int, ref: CredentialRef, value: bytes
) -> str:
    if prepared._file_dir is None:
        directory = credentials_dir(spool.absolute())
        # A leftover from an earlier attempt at this command holds nothing anyone needs.
        shutil.rmtree(directory, ignore_errors=True)
        directory.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        directory.mkdir(mode=0o700)
        os.chmod(directory, 0o700)  # whatever the umask
        prepared._file_dir = str(directory)
    path = os.path.join(prepared._file_dir, f"{index}-{ref.env_var}")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(path, flags, 0o600)
    try:
        os.fchmod(fd, 0o600)  # before the first byte, whatever the umask
        view = memoryview(value)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)
    prepared.remove_after.insert(0, path)
    return path


def _prepare_git(
    prepared: Prepared, ref: CredentialRef, value: bytes, hosts: Sequence[str]
) -> None:
    if not value or not _plain_line(value):
        raise DeliveryError(
            f"credential {ref.name!r} cannot be given to git: a git password must be one "
            "non-empty line without NUL"
        )
    directory = tempfile.mkdtemp(prefix="endpointd-git-")  # 0700, unpredictable
    if len(directory) + 2 > _MAX_SOCKET_PATH:
        os.rmdir(directory)
        directory = tempfile.mkdtemp(prefix="endpointd-git-", dir="/tmp")
    prepared._socket_dir = directory
    socket_path = os.path.join(directory, "s")
    prepared.git = GitCredential(
        socket_path, ref.env_var or GIT_USERNAME_DEFAULT, value, hosts=hosts
    )
    prepared.git_config = [
        ("credential.helper", ""),  # clears every helper configured elsewhere
        ("credential.helper", git_helper_command(socket_path)),
    ]


def git_helper_command(socket_path: str) -> str:
    """The ``credential.helper`` value: git runs it through the shell with the action added.

    ``-I -S``: the client needs the standard library only and must not be steered by the
    command's ``PYTHON*`` variables or site-packages.
    """
    argv = [sys.executable, "-I", "-S", str(_CLIENT), socket_path]
    return "!" + " ".join(shlex.quote(a) for a in argv)


# ------------------------------------------------------------------------ the git helper


class GitHelperServer:
    """Answers one command's git credential requests on a unix socket (asyncio).

    The socket is only reachable by this user: it is 0600 in a 0700 directory, and on Linux
    a connecting process of another user is turned away as well (SO_PEERCRED), and so is
    one outside the command's process tree (``root_pid``: the supervisor's pid, once known).
    ``get`` is answered with the username and password only for ``protocol=https`` and a
    ``host`` matching ``hosts`` (``host:port`` rules of
    :func:`endpointd.secrets.proxy.host_matches`, port 443 by default); anything else gets
    an empty answer. ``store`` and ``erase`` are acknowledged and ignored (endpointd's
    credential store is the only store).
    """

    def __init__(self) -> None:
        self._server: asyncio.Server | None = None
        self._path: str | None = None
        self._answer = b""
        self._hosts: tuple[str, ...] = ()
        self._root_pid: Callable[[], int | None] | None = None

    async def start(
        self,
        path: str,
        username: str,
        password: bytes,
        *,
        hosts: Sequence[str],
        root_pid: Callable[[], int | None] | None = None,
    ) -> None:
        if not _plain_line(username.encode()) or not _plain_line(password):
            raise DeliveryError("a git username and password must be single lines without NUL")
        if not hosts:
            raise DeliveryError("the git credential helper needs the hosts it answers for")
        self._answer = b"username=" + username.encode() + b"\npassword=" + password + b"\n\n"
        self._hosts = tuple(hosts)
        self._root_pid = root_pid
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        self._server = await asyncio.start_unix_server(self._serve, path=path)
        os.chmod(path, 0o600)
        self._path = path

    @property
    def path(self) -> str | None:
        return self._path

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            if not _peer_is_us(writer):
                log.warning("git credential helper: refused a connection from another user")
                return
            if not await self._peer_in_tree(writer):
                log.warning("git credential helper: refused a process outside the command")
                return
            request = await asyncio.wait_for(_read_request(reader), _REQUEST_TIMEOUT)
            action, _, body = request.partition(b"\n")
            if action.strip() == b"get" and self._server is not None:
                if self._wanted(body):
                    writer.write(self._answer)
                    await writer.drain()
                else:
                    log.info("git credential helper: no credential for that protocol and host")
        except (TimeoutError, OSError, ValueError):
            pass  # the client gets nothing and git carries on without a credential
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def _peer_in_tree(self, writer: asyncio.StreamWriter) -> bool:
        if self._root_pid is None or not peer.proc_available():
            return True
        root = self._root_pid()
        sock = writer.get_extra_info("socket")
        pid = peer.unix_peer_pid(sock) if sock is not None else None
        if root is None or pid is None:
            return False
        return await asyncio.to_thread(peer.descends_from, pid, root)

    def _wanted(self, body: bytes) -> bool:
        """Whether git's request (``key=value`` lines) is for https and one of our hosts."""
        fields: dict[bytes, bytes] = {}
        for line in body.split(b"\n"):
            key, equals, value = line.partition(b"=")
            if equals and key not in fields:
                fields[key] = value.strip()
        if fields.get(b"protocol") != b"https":
            return False
        try:
            host, port = parse_authority(fields.get(b"host", b"").decode("ascii"), HTTPS_PORT)
        except (UnicodeDecodeError, ValueError):
            return False
        return host_matches(self._hosts, host, port, default_port=HTTPS_PORT)

    def close(self) -> None:
        """Stop serving and remove the socket. Idempotent."""
        server, self._server = self._server, None
        self._answer = b""
        if server is not None:
            server.close()
        if self._path is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._path)


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    """The client's request: its action line, then git's input; it ends with EOF."""
    data = bytearray()
    while len(data) <= _MAX_REQUEST:
        chunk = await reader.read(4096)
        if not chunk:
            return bytes(data)
        data += chunk
    raise ValueError("request too large")


_PEERCRED = struct.Struct("3i")


def _peer_is_us(writer: asyncio.StreamWriter) -> bool:
    so_peercred = getattr(socket, "SO_PEERCRED", None)
    sock = writer.get_extra_info("socket")
    if so_peercred is None or sock is None:
        return True  # not Linux: the directory's permissions are the whole check
    try:
        _, uid, _ = _PEERCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, so_peercred, 12))
    except OSError:
        return False
    return commanduser.is_command_uid(uid)
