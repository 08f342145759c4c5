"""Who may connect to the embedded Postgres, and as whom: the roles, passwords and pg_hba.

A command on this machine runs as the owner's user and can find the server's socket, so
nothing here relies on the socket being hidden or on the OS user (``peer`` would admit
that command too). Instead:

* the application connects as ``superagent``, an ordinary role that owns the application's
  database (enough for its migrations) and nothing else: no superuser, no
  ``pg_execute_server_program`` or ``pg_read_server_files``, so no ``COPY … PROGRAM``, no
  server files, no untrusted language or extension;
* it proves itself with a random password (``scram-sha-256``), kept in
  ``<state>/postgres-password`` (0600); the server is given only its SCRAM verifier, over
  stdin, so the password is in no argv, log or SQL text;
* the superuser ``postgres`` has no password at all and ``pg_hba.conf`` admits nobody but
  the application's role to the application's database, so no one connects as the
  superuser over the socket. The one superuser session is the single-user mode this
  module's :func:`provisioning` runs in, while the server is stopped.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
from pathlib import Path

APP_ROLE = "superagent"
APP_DATABASE = "superagent"
SUPERUSER = "postgres"  # the bootstrap superuser: no password, no pg_hba line
# In the data directory once provisioning succeeded; its text is the scheme's version.
MARKER = "superagent-access"
VERSION = "1"
PASSWORD_FILE = "postgres-password"  # noqa: S105 - a file name
_SCRAM_ITERATIONS = 4096  # Postgres's own default (scram_iterations)

HBA = f"""\
# Written by superagent at every start of the embedded Postgres; edits are replaced.
# Only the application's role, with its password, to its own database, over the socket.
# Nobody connects as the superuser: it has no password and no line here.
local  {APP_DATABASE}  {APP_ROLE}  scram-sha-256
"""


def scram_verifier(password: str, salt: bytes | None = None) -> str:
    """What Postgres stores for ``password`` (``SCRAM-SHA-256$iter:salt$StoredKey:ServerKey``,
    RFC 5802/7677): computed here, so the server is never sent the password itself."""
    salt = salt if salt is not None else secrets.token_bytes(16)
    # The password is ASCII (hex): SASLprep leaves it as it is.
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, _SCRAM_ITERATIONS)
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    stored_key = hashlib.sha256(client_key).digest()
    server_key = hmac.new(salted, b"Server Key", hashlib.sha256).digest()

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    return f"SCRAM-SHA-256${_SCRAM_ITERATIONS}:{b64(salt)}${b64(stored_key)}:{b64(server_key)}"


def read_password(state_dir: Path) -> str | None:
    """The application role's password, or None when there is none yet."""
    path = state_dir / PASSWORD_FILE
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return None
    return text or None


def new_password(state_dir: Path) -> str:
    """A new random password for the application role, written 0600 (replacing any)."""
    password = secrets.token_hex(32)
    path = state_dir / PASSWORD_FILE
    partial = path.with_name(path.name + ".new")
    partial.unlink(missing_ok=True)
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(password + "\n")
    partial.replace(path)
    return password


def provisioning(verifier: str) -> list[tuple[str, str]]:
    """(database, SQL) for single-user mode, in order, each SQL's statements ending in a
    semicolon and a blank line (``postgres --single -j``). Idempotent: it serves a new
    data directory, one from a release whose application connected as the superuser to
    the ``postgres`` database (that database becomes the application's, its objects the
    application role's), and one whose provisioning stopped half way."""
    role, database = APP_ROLE, APP_DATABASE
    in_template1 = f"""\
DO $$ BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{role}') THEN
    CREATE ROLE {role};
  END IF;
END $$;

ALTER ROLE {role} WITH LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS
  PASSWORD '{verifier}';

ALTER ROLE {SUPERUSER} WITH PASSWORD NULL;

DO $$ BEGIN
  IF NOT EXISTS (SELECT FROM pg_database WHERE datname = '{database}') THEN
    ALTER DATABASE postgres RENAME TO {database};
  END IF;
END $$;

ALTER DATABASE {database} OWNER TO {role};

REVOKE ALL ON DATABASE {database} FROM PUBLIC;

"""
    # Everything the application made in its schema becomes its role's (an older release
    # made it as the superuser). Sequences and types that belong to a table or to an
    # extension follow their owner and are left alone.
    in_app_database = f"""\
ALTER SCHEMA public OWNER TO {role};

DO $$ DECLARE r record; BEGIN
  FOR r IN
    SELECT c.oid::regclass AS name FROM pg_class c
    JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p', 'v', 'm', 'f')
      AND NOT EXISTS (SELECT FROM pg_depend d WHERE d.classid = 'pg_class'::regclass
                      AND d.objid = c.oid AND d.deptype = 'e')
  LOOP
    EXECUTE format('ALTER TABLE %s OWNER TO {role}', r.name);
  END LOOP;
  FOR r IN
    SELECT c.oid::regclass AS name FROM pg_class c
    JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname = 'public' AND c.relkind = 'S'
      AND NOT EXISTS (SELECT FROM pg_depend d WHERE d.classid = 'pg_class'::regclass
                      AND d.objid = c.oid AND d.deptype IN ('a', 'i', 'e'))
  LOOP
    EXECUTE format('ALTER SEQUENCE %s OWNER TO {role}', r.name);
  END LOOP;
  FOR r IN
    SELECT t.oid::regtype AS name, t.typtype FROM pg_type t
    JOIN pg_namespace n ON n.oid = t.typnamespace
    WHERE n.nspname = 'public' AND t.typtype IN ('e', 'd', 'r', 'm', 'c')
      AND (t.typrelid = 0 OR (SELECT relkind FROM pg_class WHERE oid = t.typrelid) = 'c')
      AND NOT EXISTS (SELECT FROM pg_depend d WHERE d.classid = 'pg_type'::regclass
                      AND d.objid = t.oid AND d.deptype = 'e')
  LOOP
    EXECUTE format(CASE WHEN r.typtype = 'd' THEN 'ALTER DOMAIN %s OWNER TO {role}'
                   ELSE 'ALTER TYPE %s OWNER TO {role}' END, r.name);
  END LOOP;
  FOR r IN
    SELECT p.oid::regprocedure AS name FROM pg_proc p
    JOIN pg_namespace n ON n.oid = p.pronamespace
    WHERE n.nspname = 'public'
      AND NOT EXISTS (SELECT FROM pg_depend d WHERE d.classid = 'pg_proc'::regclass
                      AND d.objid = p.oid AND d.deptype = 'e')
  LOOP
    EXECUTE format('ALTER ROUTINE %s OWNER TO {role}', r.name);
  END LOOP;
END $$;

"""
    return [("template1", in_template1), (database, in_app_database)]
