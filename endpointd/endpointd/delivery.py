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
    to use one credential helper only, ``endpointd/git_credential.py``, which asks a
    :class:`GitHelperServer` in the daemon over a unix socket made for this command alone
    (0600, in a fresh 0700 directory): it answers ``get`` with ``username`` (``env_var``, or
    ``x-access-token``) and ``password`` (the value).

Where values may go: the environment the daemon hands the supervisor (in memory: a pipe or
the zygote's socket, never a file or argv; see :mod:`endpointd.executor`), the child's
environment, the DELIVERY_FILE files, and the git helper's socket. Never argv, never a log,
never an error message (errors name credentials and variables, never values).

When things go away:

* DELIVERY_FILE files: the supervisor deletes them (it lists them in its spec's
  ``remove_after``) once the command and whatever was left of its process group are gone,
  before it writes ``status.json``. The supervisor outlives a daemon restart, so this
  holds across one. If the supervisor itself dies (SIGKILL), :func:`remove` (the daemon,
  when it records the command's end, at once or after a restart) deletes the directory.
* The git helper: served by the daemon that started the command, closed when it ends
  (:meth:`Prepared.close`). A restarted daemon does not serve it again: git's requests then
  fail, so the command fails to authenticate rather than getting anything else. The
  supervisor removes the socket and its directory at the end as well, so a daemon crash
  leaves nothing behind either.

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
from collections.abc import Mapping, Sequence
from pathlib import Path

from superagent_proto.v1 import endpoint_pb2 as pb

log = logging.getLogger(__name__)

# Under the command's spool: the DELIVERY_FILE files.
CREDENTIALS_DIR = "credentials"
GIT_USERNAME_DEFAULT = "x-access-token"
# Linux refuses a single environment string longer than this (MAX_ARG_STRLEN, 128 KiB); a
# little margin for the name.
MAX_ENV_VALUE = 120 * 1024
# A unix socket path must fit sun_path (104 bytes on macOS, 108 on Linux).
_MAX_SOCKET_PATH = 100
# The git helper's request and the time it may take to send it.
_MAX_REQUEST = 64 * 1024
_REQUEST_TIMEOUT = 10.0

_CLIENT = Path(__file__).with_name("git_credential.py")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# Variables whose value (a secret, or the path of a file holding one) would change how a
# program or the dynamic loader starts, which files a shell sources, or where programs are
# found. Compared upper-cased: harmless on POSIX, and what Windows does.
_RESERVED = frozenset(
    {
        "PATH",
        "HOME",
        "SHELL",
        "USER",
        "LOGNAME",
        "IFS",
        "ENV",
        "BASH_ENV",
        "CDPATH",
        "PS4",
        "PROMPT_COMMAND",
        "SHELLOPTS",
        "BASHOPTS",
        "GLOBIGNORE",
        "ZDOTDIR",
        "TMPDIR",
        "EDITOR",
        "VISUAL",
        "PAGER",
        "LESSOPEN",
        "LESSCLOSE",
        "GCONV_PATH",
        "GLIBC_TUNABLES",
        "LOCPATH",
        "NLSPATH",
        "HOSTALIASES",
        "RES_OPTIONS",
        "LOCALDOMAIN",
        "NODE_OPTIONS",
        "NODE_PATH",
        "PERL5OPT",
        "PERL5LIB",
        "PERLLIB",
        "RUBYOPT",
        "RUBYLIB",
        "JAVA_TOOL_OPTIONS",
        "_JAVA_OPTIONS",
        "JDK_JAVA_OPTIONS",
        "CLASSPATH",
        "SSH_ASKPASS",
        "SUDO_ASKPASS",
        "SSH_AUTH_SOCK",
    }
)
_RESERVED_PREFIXES = ("LD_", "DYLD_", "PYTHON", "GIT_", "BASH_FUNC_", "ENDPOINTD_", "XDG_")

_DELIVERY_NAMES = {
    pb.CredentialRef.DELIVERY_ENV: "env",
    pb.CredentialRef.DELIVERY_FILE: "file",
    pb.CredentialRef.DELIVERY_GIT_HELPER: "git helper",
}


class DeliveryError(Exception):
    """A credential cannot be delivered as asked. The message names the credential and the
    variable, never the value: the daemon sends it back as Refused
    (REASON_CREDENTIAL_UNAVAILABLE)."""


def _check_env_name(ref: pb.CredentialRef) -> None:
    name = ref.env_var
    how = _DELIVERY_NAMES.get(ref.delivery, "this delivery")
    if not name:
        raise DeliveryError(f"credential {ref.name!r}: {how} delivery needs env_var")
    if not _ENV_NAME.match(name):
        raise DeliveryError(
            f"credential {ref.name!r}: env_var {name!r} is not a valid environment variable "
            "name (letters, digits and _, not starting with a digit)"
        )
    upper = name.upper()
    if upper in _RESERVED or upper.startswith(_RESERVED_PREFIXES):
        raise DeliveryError(
            f"credential {ref.name!r}: env_var {name!r} is reserved (it could change how "
            "programs start); choose another name"
        )


def check(refs: Sequence[pb.CredentialRef]) -> None:
    """Check what can be checked without the values (names, variables, deliveries).

    Raises :class:`DeliveryError`. The daemon may call this on receipt, before Accepted;
    :func:`prepare` calls it again.
    """
    targets: dict[str, str] = {}
    git_helpers = 0
    for ref in refs:
        if not ref.name:
            raise DeliveryError("a credential reference has no name")
        if ref.delivery in (pb.CredentialRef.DELIVERY_ENV, pb.CredentialRef.DELIVERY_FILE):
            _check_env_name(ref)
            earlier = targets.get(ref.env_var.upper())
            if earlier is not None:
                raise DeliveryError(
                    f"credentials {earlier!r} and {ref.name!r} both target env_var {ref.env_var!r}"
                )
            targets[ref.env_var.upper()] = ref.name
        elif ref.delivery == pb.CredentialRef.DELIVERY_GIT_HELPER:
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
                "(expected env, file or git helper)"
            )


def _plain_line(value: bytes) -> bool:
    return not any(c in value for c in (b"\n", b"\r", b"\0"))


class GitCredential:
    """What the git helper serves for one command (the password is a secret)."""

    __slots__ = ("password", "socket_path", "username")

    def __init__(self, socket_path: str, username: str, password: bytes) -> None:
        self.socket_path = socket_path
        self.username = username
        self.password = password

    def __repr__(self) -> str:
        return f"GitCredential(socket_path={self.socket_path!r}, username={self.username!r})"


class Prepared:
    """One command's delivered credentials: what to add to its environment, what to remove
    once it ends, and the git helper to serve meanwhile.

    ``repr`` names credentials only. Lifecycle: :func:`prepare` → :meth:`start` (serves the
    git helper, if any) → the command runs (:func:`endpointd.executor.exec_spec` takes this
    object) → :meth:`close` when it ends (also fine if the command never started).
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
        self._file_dir: str | None = None
        self._socket_dir: str | None = None
        self._server: GitHelperServer | None = None

    def __repr__(self) -> str:
        return f"Prepared(credentials={self.names!r})"

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
        """Serve the git helper, if this command has one (before the command starts).

        Raises :class:`DeliveryError` if it cannot be served.
        """
        if self.git is None or self._server is not None:
            return
        server = GitHelperServer()
        try:
            await server.start(self.git.socket_path, self.git.username, self.git.password)
        except OSError as exc:
            server.close()
            raise DeliveryError(
                f"the git credential helper cannot be served: {exc.strerror or exc}"
            ) from None
        self._server = server

    def close(self) -> None:
        """Stop the git helper and delete what :func:`prepare` made. Idempotent."""
        if self._server is not None:
            self._server.close()
            self._server = None
        if self._file_dir is not None:
            shutil.rmtree(self._file_dir, ignore_errors=True)
        if self._socket_dir is not None:
            shutil.rmtree(self._socket_dir, ignore_errors=True)


def credentials_dir(spool: Path) -> Path:
    return spool / CREDENTIALS_DIR


def remove(spool: Path) -> None:
    """Delete a command's DELIVERY_FILE files, whoever started it (see the module doc).

    For the daemon, whenever it records an exec's end (also the "outcome unknown" end after
    a restart): normally the supervisor has deleted them already.
    """
    shutil.rmtree(credentials_dir(spool), ignore_errors=True)


def prepare(spool: Path, refs: Sequence[pb.CredentialRef], values: Mapping[str, bytes]) -> Prepared:
    """Lay out the delivery of ``refs`` (values by credential name) for a command.

    Writes the DELIVERY_FILE files and picks the git helper's socket path; nothing is served
    until :meth:`Prepared.start`. Raises :class:`DeliveryError` (nothing is left behind).
    """
    check(refs)
    for ref in refs:
        if ref.name not in values:
            raise DeliveryError(f"credential {ref.name!r} is not available on this device")
    prepared = Prepared()
    try:
        for index, ref in enumerate(refs):
            value = values[ref.name]
            if ref.delivery == pb.CredentialRef.DELIVERY_ENV:
                prepared.env[ref.env_var] = _env_value(ref, value)
            elif ref.delivery == pb.CredentialRef.DELIVERY_FILE:
                path = _write_file(prepared, spool, index, ref, value)
                prepared.env[ref.env_var] = path
            else:
                _prepare_git(prepared, ref, value)
            prepared.names.append(ref.name)
    except BaseException:
        prepared.close()
        raise
    if prepared._file_dir is not None:
        prepared.remove_after.append(prepared._file_dir)
    if prepared._socket_dir is not None:
        assert prepared.git is not None
        prepared.remove_after += [prepared.git.socket_path, prepared._socket_dir]
    return prepared


def _env_value(ref: pb.CredentialRef, value: bytes) -> str:
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
    prepared: Prepared, spool: Path, index: int, ref: pb.CredentialRef, value: bytes
) -> str:
    if prepared._file_dir is None:
        directory = credentials_dir(spool.absolute())
        # A leftover from an earlier attempt at this command holds nothing anyone needs.
        shutil.rmtree(directory, ignore_errors=True)
        spool.mkdir(parents=True, exist_ok=True, mode=0o700)
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


def _prepare_git(prepared: Prepared, ref: pb.CredentialRef, value: bytes) -> None:
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
    prepared.git = GitCredential(socket_path, ref.env_var or GIT_USERNAME_DEFAULT, value)
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
    a connecting process of another user is turned away as well (SO_PEERCRED). ``get`` is
    answered with the username and password; ``store`` and ``erase`` are acknowledged and
    ignored (the keyring is the only store).
    """

    def __init__(self) -> None:
        self._server: asyncio.Server | None = None
        self._path: str | None = None
        self._answer = b""

    async def start(self, path: str, username: str, password: bytes) -> None:
        if not _plain_line(username.encode()) or not _plain_line(password):
            raise DeliveryError("a git username and password must be single lines without NUL")
        self._answer = b"username=" + username.encode() + b"\npassword=" + password + b"\n\n"
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
            request = await asyncio.wait_for(_read_request(reader), _REQUEST_TIMEOUT)
            action = request.split(b"\n", 1)[0].strip()
            if action == b"get" and self._server is not None:
                writer.write(self._answer)
                await writer.drain()
        except (TimeoutError, OSError, ValueError):
            pass  # the client gets nothing and git carries on without a credential
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

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
    return bool(uid == os.geteuid())
