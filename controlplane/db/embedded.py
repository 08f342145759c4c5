"""The embedded Postgres of ``superagent up``: its files in the state directory, its start,
its sharing between processes, and its stop.

In the state directory:

* ``postgres/``: the data directory (0700);
* ``postgres-socket/``: the server's Unix socket, in a directory only its owner may enter
  (0700); when that path is too long for a socket, a private directory made for it under
  ``$XDG_RUNTIME_DIR`` or the temporary directory instead (named in ``postmaster.pid``);
* ``postgres-password``: the application role's password (0600), see
  :mod:`.embedded_access` for who may connect and as whom;
* ``postgres.lock``: held while a process starts or stops the server;
* ``postgres.users``: held (shared) by every process using the server; the last one to let
  go stops it. Locks end with their process, so a crashed user never keeps it running.

It listens on its socket only (no TCP). Nothing above the state directory is ever changed.

An older release ran this server through pgserver with ``trust`` authentication, the
application connecting as the superuser to the ``postgres`` database. The first start of
this release provisions such a data directory in place, with the server stopped (single-user
mode): the application role is made, the ``postgres`` database becomes the application's
database and its objects the role's, the superuser loses any password, and ``pg_hba.conf``
is replaced. Run as root, the files pgserver gave its ``pgserver`` user become root's again.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import stat
import tempfile
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

from controlplane.db import embedded_access as access
from controlplane.db import embedded_process as process
from controlplane.errors import ConfigError

log = logging.getLogger(__name__)

SOCKET_DIR = "postgres-socket"
LOCK = "postgres.lock"
USERS = "postgres.users"
_PRIVATE_SOCKET_PREFIX = "superagent-pg-"
_SUN_PATH_MAX = 100  # bytes of a socket's path that every Unix takes (108 on Linux, 104 macOS)


class EmbeddedPostgres:
    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.data_dir = state_dir / "postgres"
        self._users: int | None = None  # our shared lock on USERS while we use the server

    def start(self) -> str:
        """Start (or join) the server and return the application's ``postgresql://`` URL."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        with _locked(self.state_dir / LOCK):
            server = process.running(self.data_dir)
            if server is None:
                log.info("starting embedded Postgres in %s", self.data_dir)
                password = self._prepare()
                process.start(self.data_dir, self._socket_dir())
                server = process.running(self.data_dir)
                if server is None:
                    raise ConfigError(
                        f"the embedded Postgres in {self.data_dir} started but is not running; "
                        f"see {self.data_dir / 'log'}"
                    )
            else:
                password = self._joined()
            self._users = _hold(self.state_dir / USERS)
        host = urllib.parse.quote(str(server.socket_dir), safe="/")
        return (
            f"postgresql://{access.APP_ROLE}:{password}@/{access.APP_DATABASE}"
            f"?host={host}&port={server.port}"
        )

    def stop(self) -> None:
        """Let go of the server; the last process to let go stops it."""
        if self._users is None:
            return
        with _locked(self.state_dir / LOCK):
            os.close(self._users)
            self._users = None
            if not _last_user(self.state_dir / USERS):
                return
            server = process.running(self.data_dir)
            if server is None:
                return
            process.stop(self.data_dir)
            if server.socket_dir.parent == _runtime_base() and server.socket_dir.name.startswith(
                _PRIVATE_SOCKET_PREFIX
            ):
                shutil.rmtree(server.socket_dir, ignore_errors=True)  # the one we made for it

    # ------------------------------------------------------------------ first start

    def _prepare(self) -> str:
        """Make, or bring up to this release, the stopped server's data directory; the
        application role's password."""
        data = self.data_dir
        if not (data / "PG_VERSION").exists():
            self._initdb()
        else:
            _take_back(data)
        password = access.read_password(self.state_dir)
        if password is None or not _provisioned(data):
            password = password or access.new_password(self.state_dir)
            log.info("setting up the embedded Postgres's roles in %s", data)
            for database, sql in access.provisioning(access.scram_verifier(password)):
                process.single_user(data, database, sql)
            (data / access.MARKER).write_text(access.VERSION + "\n")
        # Every start: the file is ours, whatever was made of it meanwhile.
        (data / "pg_hba.conf").write_text(access.HBA)
        return password

    def _initdb(self) -> None:
        # Made beside and renamed into place: a failed initdb leaves no half a directory.
        partial = self.data_dir.with_name(self.data_dir.name + ".new")
        shutil.rmtree(partial, ignore_errors=True)
        if self.data_dir.exists():
            if any(self.data_dir.iterdir()):
                raise ConfigError(
                    f"{self.data_dir} is not empty but holds no Postgres data (no PG_VERSION); "
                    "move it away, or set DATABASE_URL"
                )
            self.data_dir.rmdir()
        _private_dir(partial)
        process.initdb(partial)
        partial.rename(self.data_dir)

    def _joined(self) -> str:
        """The password for a server another process started (it provisioned it)."""
        password = access.read_password(self.state_dir)
        if not _provisioned(self.data_dir) or password is None:
            raise ConfigError(
                f"the embedded Postgres in {self.data_dir} is running as an older release set "
                "it up (trust authentication): stop every superagent process using it, then "
                "start again, and this release will secure it"
            )
        return password

    def _socket_dir(self) -> Path:
        preferred = self.state_dir / SOCKET_DIR
        if len(os.fsencode(preferred / ".s.PGSQL.5432")) <= _SUN_PATH_MAX:
            _private_dir(preferred)
            return preferred
        made = Path(tempfile.mkdtemp(prefix=_PRIVATE_SOCKET_PREFIX, dir=_runtime_base()))
        if len(os.fsencode(made / ".s.PGSQL.5432")) > _SUN_PATH_MAX:
            made.rmdir()
            raise ConfigError(
                f"no directory for the embedded Postgres's socket is short enough ({made}); "
                "set SUPERAGENT_STATE_DIR to a shorter path"
            )
        return made


def _runtime_base() -> Path:
    """Where a socket directory is made when the state directory's path is too long."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    return Path(runtime if runtime and Path(runtime).is_dir() else tempfile.gettempdir())


def _provisioned(data_dir: Path) -> bool:
    try:
        return (data_dir / access.MARKER).read_text().strip() == access.VERSION
    except FileNotFoundError:
        return False


def _private_dir(path: Path) -> None:
    """``path`` a directory of this user's, mode 0700 (made so, or set so: it is ours)."""
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
        raise ConfigError(f"{path} must be a directory of this user's, not a link or another's")
    if stat.S_IMODE(info.st_mode) != 0o700:
        os.chmod(path, 0o700)


def _take_back(data_dir: Path) -> None:
    """Run as root, an older release's data directory belongs to its ``pgserver`` user:
    give it back to root (the server now runs as root mapped to an unprivileged user)."""
    if os.geteuid() == 0 and data_dir.stat().st_uid != 0:
        log.info("taking %s back from the pgserver user", data_dir)
        for root, dirs, files in os.walk(data_dir):
            for name in (*dirs, *files):
                os.lchown(os.path.join(root, name), 0, 0)
        os.lchown(data_dir, 0, 0)
    if stat.S_IMODE(data_dir.stat().st_mode) != 0o700:
        os.chmod(data_dir, 0o700)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing lets go of the lock


def _hold(path: Path) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_SH)
    return fd


def _last_user(path: Path) -> bool:
    """Whether no process holds ``path`` any more (we hold the start/stop lock)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True
