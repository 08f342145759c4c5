"""The embedded Postgres of ``superagent up``, played by a command on the same machine.

A confined command runs as the owner's user, and may find the server's socket (the state
directory, ``ps``): nothing may then depend on it not finding it. So, with the server
running exactly as ``up`` runs it: the socket lies in a directory only its owner can enter;
nobody gets in as the superuser (there is no password to know); the application's role,
whose password ``up`` holds, can run its migrations and no program, read or write no server
file, load no code and become no superuser; no password is in any process's argv; and no
directory above the state directory had its permissions changed.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import asyncpg
import psutil

from controlplane.db import embedded_process, migrate
from controlplane.db.database import open_database
from controlplane.db.urls import asyncpg_dsn
from controlplane.settings import Settings


def _psql() -> Path:
    return embedded_process.bin_dir() / "psql"


def _socket_dir(url: str) -> Path:
    (host,) = parse_qs(urlsplit(url).query)["host"]
    return Path(host)


def _home(tmp_path: Path) -> Path:
    """A state directory as deep as ``~/.local/share/superagent``, under private parents."""
    home = tmp_path / "home" / "owner"
    state = home / ".local" / "share" / "superagent"
    state.mkdir(parents=True)
    for private in (tmp_path / "home", home):
        private.chmod(0o700)
    return state


def _modes(state: Path, tmp_path: Path) -> dict[Path, int]:
    chain = (state.parent, *state.parent.parents)
    return {p: p.stat().st_mode for p in chain if p.is_relative_to(tmp_path)}


def _attacker_psql(
    socket_dir: Path, user: str, database: str, sql: str, password: str | None
) -> str:
    """What the finding's command ran: psql on the socket, never prompting for a password."""
    env = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "PGCONNECT_TIMEOUT": "10"}
    if password is not None:
        env["PGPASSWORD"] = password
    done = subprocess.run(
        [str(_psql()), "-w", "-h", str(socket_dir), "-U", user, "-d", database, "-c", sql],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return f"exit {done.returncode}: {done.stdout}{done.stderr}"


async def _as_the_application(url: str, canary: Path, written: Path) -> dict[str, str]:
    """Every attempt the application's role makes to act as the server's OS user, or as the
    superuser; what each one answered (one that went through answers ``done``)."""
    conn = await asyncpg.connect(asyncpg_dsn(url))
    answers: dict[str, str] = {}
    try:
        superuser = "SELECT rolsuper FROM pg_roles WHERE rolname = current_user"
        assert await conn.fetchval(superuser) is False
        for role in ("pg_execute_server_program", "pg_read_server_files", "pg_write_server_files"):
            assert not await conn.fetchval("SELECT pg_has_role(current_user, $1, 'MEMBER')", role)
        untrusted = await conn.fetch(
            "SELECT DISTINCT name FROM pg_available_extension_versions "
            "WHERE superuser AND NOT trusted AND NOT installed"
        )
        assert untrusted, "no untrusted extension to try: the test would prove nothing"
        await conn.execute("CREATE TEMP TABLE loot (line text)")
        attempts = {
            "copy to program": f"COPY (SELECT 1) TO PROGRAM 'touch {canary}'",
            "copy from program": f"COPY loot FROM PROGRAM 'touch {canary}'",
            "copy to a file": f"COPY (SELECT 1) TO '{written}'",
            "copy from a file": "COPY loot FROM '/etc/passwd'",
            "pg_read_file": "SELECT pg_read_file('/etc/passwd')",
            "pg_read_binary_file": "SELECT pg_read_binary_file('postgresql.conf')",
            "pg_ls_dir": "SELECT pg_ls_dir('.')",
            "lo_import": "SELECT lo_import('/etc/passwd')",
            "C function": (
                "CREATE FUNCTION run(cstring) RETURNS int "
                "AS 'libc.so.6', 'system' LANGUAGE c STRICT"
            ),
            "untrusted language": "CREATE LANGUAGE evil HANDLER plpgsql_call_handler",
            "load a library": "LOAD '/tmp/evil.so'",
            "alter system": f"ALTER SYSTEM SET archive_command = 'touch {canary}'",
            "preload via database": "ALTER DATABASE superagent SET session_preload_libraries = 'x'",
            "become superuser": "ALTER ROLE CURRENT_USER SUPERUSER",
            "make a superuser": "CREATE ROLE evil SUPERUSER LOGIN PASSWORD 'evil'",
            "set role postgres": "SET ROLE postgres",
            "set session authorization": "SET SESSION AUTHORIZATION postgres",
            **{f"extension {r['name']}": f'CREATE EXTENSION "{r["name"]}"' for r in untrusted},
        }
        for name, sql in attempts.items():
            try:
                await conn.execute(sql)
                answers[name] = "done"
            except asyncpg.PostgresError as exc:
                answers[name] = type(exc).__name__
    finally:
        await conn.close()
    return answers


def test_a_command_on_the_socket_cannot_run_programs_or_be_superuser(tmp_path: Path) -> None:
    state = _home(tmp_path)
    modes = _modes(state, tmp_path)
    canary, written = tmp_path / "ran-as-the-owner", tmp_path / "written-by-the-server"
    with open_database(Settings(state_dir=state, database_url=None)) as database:
        socket_dir = _socket_dir(database.url)
        info = os.lstat(socket_dir)
        assert stat.S_ISDIR(info.st_mode)
        assert stat.S_IMODE(info.st_mode) == 0o700, oct(info.st_mode)
        assert info.st_uid == os.geteuid()

        # As the superuser, with no password or with guesses: refused before any SQL runs.
        copy = f"COPY (SELECT 1) TO PROGRAM 'touch {canary}'"
        for db_name in ("postgres", "superagent", "template1"):
            for password in (None, "", "postgres"):
                answer = _attacker_psql(socket_dir, "postgres", db_name, copy, password)
                assert answer.startswith("exit 2"), answer  # psql's "could not connect"
                assert not canary.exists(), answer
        # As the application's role without its password: refused likewise.
        answer = _attacker_psql(socket_dir, "superagent", "superagent", copy, None)
        assert answer.startswith("exit 2"), answer

        # The application's own role runs the migrations, and nothing of the server's user.
        asyncio.run(migrate.upgrade(database.url))
        answers = asyncio.run(_as_the_application(database.url, canary, written))
        # Refused for want of privilege, each one (not for a typo in the attempt).
        assert set(answers.values()) == {"InsufficientPrivilegeError"}, answers
        assert not canary.exists()
        assert not written.exists()

        # The application's password is in no process's argv (ps shows argv to everyone).
        password = urlsplit(database.url).password
        assert password
        assert len(password) >= 32
        for proc in psutil.process_iter(["cmdline"]):
            assert password not in " ".join(proc.info.get("cmdline") or []), proc
    assert _modes(state, tmp_path) == modes, "a parent of the state directory was chmod-ed"


async def _owners_and_row(url: str) -> tuple[set[str], int]:
    conn = await asyncpg.connect(asyncpg_dsn(url))
    try:
        owners = {
            r[0]
            for r in await conn.fetch(
                "SELECT tableowner FROM pg_tables WHERE schemaname = 'public'"
            )
        }
        # The role owns what an older release made: it may write it, and migrate it.
        await conn.execute("UPDATE signin_throttle SET failures = failures + 1 WHERE peer = 'old'")
        failures = await conn.fetchval("SELECT failures FROM signin_throttle WHERE peer = 'old'")
        return owners, int(failures)
    finally:
        await conn.close()


def test_an_older_releases_database_is_secured_in_place_at_the_next_start(tmp_path: Path) -> None:
    """What an older release left (pgserver's trust authentication, the application as the
    superuser in the ``postgres`` database, run as root: files of pgserver's own user)
    becomes this release's on the next start, with its data."""
    from pgserver.postgres_server import get_server

    state = tmp_path / "state"
    state.mkdir()
    old = get_server(state / "postgres", cleanup_mode="stop")  # as the older release did
    try:
        old_url = old.get_uri()
        assert "postgres:@" in old_url  # the superuser, no password

        async def older_release() -> None:
            await migrate.upgrade(old_url)
            conn = await asyncpg.connect(asyncpg_dsn(old_url))
            try:
                await conn.execute(
                    "INSERT INTO signin_throttle (peer, window_start, failures) "
                    "VALUES ('old', now(), 1)"
                )
            finally:
                await conn.close()

        asyncio.run(older_release())
    finally:
        old.cleanup()

    for start in (1, 2):  # the upgrade, then an ordinary start
        with open_database(Settings(state_dir=state, database_url=None)) as database:
            assert urlsplit(database.url).username == "superagent"
            asyncio.run(migrate.upgrade(database.url))
            owners, failures = asyncio.run(_owners_and_row(database.url))
            assert owners == {"superagent"}
            assert failures == 1 + start
            answer = _attacker_psql(
                _socket_dir(database.url), "postgres", "superagent", "SELECT 1", None
            )
            assert answer.startswith("exit 2"), answer
            assert (state / "postgres").stat().st_uid == os.geteuid()


def test_processes_share_the_server_and_the_last_one_out_stops_it(tmp_path: Path) -> None:
    # A short path, so that the socket lies in the state directory itself.
    state = Path(tempfile.mkdtemp(prefix="sa-"))
    settings = Settings(state_dir=state, database_url=None)

    async def answer(url: str) -> int:
        conn = await asyncpg.connect(asyncpg_dsn(url))
        try:
            return int(await conn.fetchval("SELECT 1"))
        finally:
            await conn.close()

    with open_database(settings) as first:
        assert _socket_dir(first.url) == state / "postgres-socket"
        assert stat.S_IMODE((state / "postgres-socket").stat().st_mode) == 0o700
        with open_database(settings) as second:
            assert second.url == first.url
        assert asyncio.run(answer(first.url)) == 1  # the second's leaving stopped nothing
    running = [
        p
        for p in psutil.process_iter(["name", "cmdline"])
        if p.info["name"] == "postgres" and str(state) in " ".join(p.info["cmdline"] or [])
    ]
    assert not running, running
    shutil.rmtree(state)
