"""Running the embedded Postgres's programs (``initdb``, ``pg_ctl``, single-user ``postgres``)
from the ``pgserver`` wheel, as an unprivileged user, without touching anything above the
state directory.

Postgres refuses to run as root. Run as root, these programs are started in a user
namespace of their own where they are ``nobody`` (no capabilities), mapped to root
outside: files they make are root's, and they reach the state directory as its owner
does, through its owner's permission bits. So no other system user is needed, and no
directory above the state directory has to be opened to one (``pgserver`` made its
``pgserver`` user and chmod-ed every parent ``o+rx``, ``/root`` included).

Secrets never travel here in argv: SQL goes to single-user mode over stdin.
"""

from __future__ import annotations

import importlib.util
import os
import pwd
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from controlplane.errors import ConfigError

START_TIMEOUT = 60  # seconds pg_ctl waits for the server to accept connections
_SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"  # where unshare is taken from: root's own


def bin_dir() -> Path:
    """The wheel's Postgres binaries, found without importing it (its import makes a lock
    file in the user's runtime directory and warns when there is none)."""
    spec = importlib.util.find_spec("pgserver")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(
            "the embedded database needs the 'embedded' extra, which is not installed: "
            "pip install 'superagent-server[embedded]' (or set DATABASE_URL to a Postgres "
            "server)"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


def _as_server_user() -> list[str]:
    """The prefix that runs a Postgres program as a non-root user: none unless we are root."""
    if os.geteuid() != 0:
        return []
    unshare = shutil.which("unshare", path=_SYSTEM_PATH)
    if unshare is None:
        raise ConfigError(
            "run as root, the embedded Postgres needs unshare (util-linux) to run as an "
            "unprivileged user; install it, run superagent as a normal user, or set "
            "DATABASE_URL"
        )
    try:
        nobody = pwd.getpwnam("nobody")
        uid, gid = nobody.pw_uid, nobody.pw_gid
    except KeyError:
        uid = gid = 65534
    return [unshare, "--user", f"--map-user={uid}", f"--map-group={gid}", "--"]


def _environment() -> dict[str, str]:
    # Only what the programs need: the server inherits it for as long as it runs.
    return {"PATH": _SYSTEM_PATH, "LC_ALL": "C", "TZ": "UTC"}


def run(program: str, args: Sequence[str], *, stdin: str | None = None, what: str) -> str:
    """Run one of the wheel's programs; its output, or ConfigError naming ``what`` failed.

    Output goes through a file, not a pipe: ``pg_ctl start`` leaves the server running,
    and a server holding our pipe would keep a reader waiting for ever.
    """
    argv = [*_as_server_user(), str(bin_dir() / program), *args]
    with tempfile.TemporaryFile("w+") as out:
        try:
            done = subprocess.run(
                argv,
                input=stdin,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=_environment(),
                text=True,
                start_new_session=True,  # a Ctrl-C at the terminal is not the server's
                timeout=START_TIMEOUT + 30,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ConfigError(f"the embedded Postgres: {what} failed ({exc})") from None
        out.seek(0)
        output = out.read()
    if done.returncode != 0:
        raise ConfigError(f"the embedded Postgres: {what} failed: {_tail(output)}")
    return output


def _tail(output: str) -> str:
    # A failed statement is echoed with its text, which may hold a SCRAM verifier.
    lines = [line for line in output.strip().splitlines() if "SCRAM-SHA-256$" not in line]
    return " / ".join(lines[-6:]) or "no output"


def initdb(data_dir: Path) -> None:
    run(
        "initdb",
        [
            "-D",
            str(data_dir),
            "-U",
            "postgres",
            "--encoding=UTF8",
            "--locale=C",
            # Replaced before the first start (embedded_access.HBA); nothing listens now.
            "--auth-local=reject",
            "--auth-host=reject",
        ],
        what="initdb",
    )


def single_user(data_dir: Path, database: str, sql: str) -> None:
    """Run ``sql`` as the superuser in single-user mode (the server must be stopped)."""
    run(
        "postgres",
        [
            "--single",
            "-j",
            "-D",
            str(data_dir),
            "-c",
            "exit_on_error=on",
            "-c",
            "log_min_messages=warning",
            database,
        ],
        stdin=sql,
        what=f"setting up its roles (in {database})",
    )


def start(data_dir: Path, socket_dir: Path) -> None:
    options = " ".join(
        shlex.quote(option)
        for option in (
            "-c",
            "listen_addresses=",  # no TCP: the socket only
            "-c",
            f"unix_socket_directories={socket_dir}",
            "-c",
            "unix_socket_permissions=0700",
            "-c",
            "password_encryption=scram-sha-256",
        )
    )
    run(
        "pg_ctl",
        [
            "-D",
            str(data_dir),
            "-w",
            "-t",
            str(START_TIMEOUT),
            "-l",
            str(data_dir / "log"),
            "-o",
            options,
            "start",
        ],
        what=f"starting (see {data_dir / 'log'})",
    )


def stop(data_dir: Path) -> None:
    run("pg_ctl", ["-D", str(data_dir), "-w", "-m", "fast", "stop"], what="stopping")


@dataclass(frozen=True)
class Postmaster:
    pid: int
    socket_dir: Path
    port: int


def running(data_dir: Path) -> Postmaster | None:
    """The server running on ``data_dir`` (from its ``postmaster.pid``), or None."""
    try:
        lines = (data_dir / "postmaster.pid").read_text().splitlines()
    except FileNotFoundError:
        return None
    if len(lines) < 5 or not lines[0].strip().isdigit():
        return None
    pid = int(lines[0])
    try:
        alive = psutil.Process(pid).name().startswith("postgres")
    except psutil.Error:
        alive = False
    if not alive:
        return None  # a stale file: Postgres removes it on its next start
    port = int(lines[3]) if lines[3].strip().isdigit() else 5432
    return Postmaster(pid, Path(lines[4].strip()), port)
