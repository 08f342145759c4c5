"""The canary: a brokered credential is used for real, and no form of it ever leaves the device.

Everything is real: Postgres, the device gateway (in process, TLS gRPC), the control plane's
command queue, an `endpointd run` process paired with it, credentials added with the real
`endpointd creds add` into a file-based keyring (keyrings.alt's PlaintextKeyring under
tmp_path), a local HTTP server that requires one of them, and the router talking to the fake
LLM about what the command printed.

One command gets three credentials (as an environment variable, as a 0600 file, and through
the git credential helper where git is installed). It proves each arrived (it authenticates
with the first, prints SHA-256 digests of all) and then prints each value in every form the
redaction covers: raw, base64 (standard and URL-safe, shifted by 0/1/2 bytes, padded and not),
URL-encoded, JSON-escaped, shell-quoted, split across two writes with a flush and a pause
between, on stderr, and inside a file (and a file *name*) that read_file and list_dir return.

Then every byte that left the device is searched: the command results, a pg_dump of the
database, the control plane's log records (all levels), endpointd's own log file (debug) and
audit log, and every request the fake LLM received. Pass: zero occurrences of any 12-byte
piece of any form of any value (also JSON-escaped once or twice, COPY-escaped and hex, as a
dump or a request body would spell them), while the text around each value is still there
with the value masked by '*'. Each search is shown to work by planting a value and finding it.
The device's own local files (spool, journal) are not searched: they never leave it.

A fourth credential goes by ``http`` delivery (the device's per-command proxy adds it to
HTTPS requests for its hosts; the command never has it): a real HTTPS server on loopback
(its own test CA, which endpointd trusts through SSL_CERT_FILE) demands it as a bearer
token, and curl, Python's urllib and ``git ls-remote`` all get through, each request
carrying ``Bearer <token>``. The Python command also prints its whole environment and
hexdumps /proc/self/environ and every file in its TMPDIR. Then the same searches (outputs,
pg_dump, every model request, which was shown all the output, the logs) find no form of
the token, and the redactor masked nothing, since the command never had it to print.
"""

from __future__ import annotations

import asyncio
import base64
import glob
import hashlib
import json
import logging
import os
import re
import secrets
import shlex
import shutil
import ssl
import subprocess
import sys
import tempfile
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from controlplane.db.urls import asyncpg_dsn
from controlplane.gateway import specs
from controlplane.gateway.queue import CommandResult
from controlplane.ingest.admission import WEB_CONSOLE_GROUP, Actor, Admission
from controlplane.ingest.intake import IncomingTrigger, Intake, ThreadRef
from controlplane.router.router import Router
from tests.fakes.endpointd_process import Endpointd, endpointd_in
from tests.fakes.https_server import HttpsServer, TestCA
from tests.fakes.openai_server import FAKE_MODEL, ChatRequest, FakeOpenAIServer, Reply, ToolCall
from tests.support.gateway_harness import Gateway, running_gateway
from tests.support.helpers import save_policy
from tests.support.router_harness import ignore_batch

pytestmark = pytest.mark.slow

PLAINTEXT_KEYRING = "keyrings.alt.file.PlaintextKeyring"
ENV_CRED, FILE_CRED, GIT_CRED = "canary-env", "canary-file", "canary-git"
DEVICE = "canary-laptop"
GIT_HOST = "canary.invalid"  # the host SCRIPT asks git for a credential for
GRAM = 12  # any piece of a form this long counts as a leak
TRIGGER_ID = re.compile(r"\[(trg_\w+)\]")

# The command the device runs. It never names a value: they come from the environment, the
# delivered file and git. argv[1] is the URL of the HTTP server; argv[2] "git" when the third
# credential comes through the git credential helper (git is installed).
SCRIPT = r"""
import base64, hashlib, json, os, shlex, stat, subprocess, sys, time
import urllib.error, urllib.parse, urllib.request


def line(label, text):
    sys.stdout.write(f"before-{label} <<{label}>>{text}<</{label}>> after-{label}\n")
    sys.stdout.flush()


def every_form(tag, value):
    raw = value.encode()
    line(tag + ".raw", value)
    for shift in (0, 1, 2):
        prefix = b"\xfa\x01"[:shift]
        for alphabet, encode in (("std", base64.b64encode), ("url", base64.urlsafe_b64encode)):
            encoded = encode(prefix + raw).decode()
            line(f"{tag}.b64{alphabet}{shift}", encoded)
            line(f"{tag}.b64{alphabet}{shift}np", encoded.rstrip("="))
    line(tag + ".url", urllib.parse.quote(value, safe=""))
    line(tag + ".json", json.dumps(value))
    line(tag + ".shell", shlex.quote(value))
    half = len(value) // 2
    sys.stdout.write(f"before-{tag}.split <<{tag}.split>>{value[:half]}")
    sys.stdout.flush()
    time.sleep(0.3)
    sys.stdout.write(f"{value[half:]}<</{tag}.split>> after-{tag}.split\n")
    sys.stdout.flush()
    time.sleep(0.05)
    sys.stderr.write(
        f"before-{tag}.stderr <<{tag}.stderr>>{value}<</{tag}.stderr>> after-{tag}.stderr\n"
    )
    sys.stderr.flush()
    time.sleep(0.05)
    print(f"<<{tag}.sha256>>{hashlib.sha256(raw).hexdigest()}<</{tag}.sha256>>", flush=True)


v1 = os.environ["CANARY"]
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
request = urllib.request.Request(sys.argv[1], headers={"Authorization": "Bearer " + v1})
try:
    with opener.open(request, timeout=10) as response:
        status = response.status
except urllib.error.HTTPError as err:
    status = err.code
print(f"AUTH={status}", flush=True)
every_form("v1", v1)

path = os.environ["CANARY_FILE"]
print(f"<<v2.mode>>{oct(stat.S_IMODE(os.stat(path).st_mode))}<</v2.mode>>", flush=True)
with open(path, encoding="utf-8") as f:
    v2 = f.read()
every_form("v2", v2)

if sys.argv[2:] == ["git"]:
    git = subprocess.run(
        ["git", "credential", "fill"],
        input="protocol=https\nhost=canary.invalid\n\n",
        capture_output=True,
        text=True,
        timeout=30,
        # Only endpointd's helper (set through GIT_CONFIG_COUNT) may answer.
        env={**os.environ, "GIT_TERMINAL_PROMPT": "0", "GIT_CONFIG_GLOBAL": os.devnull,
             "GIT_CONFIG_NOSYSTEM": "1"},
    )
    print(f"<<git.rc>>{git.returncode}<</git.rc>> git-stderr: {git.stderr.strip()!r}", flush=True)
    line("git.fill", git.stdout.replace("\n", "|"))
    answer = dict(item.split("=", 1) for item in git.stdout.splitlines() if "=" in item)
    every_form("v3", answer.get("password", ""))

with open("canary-file.txt", "w") as f:
    b64 = base64.b64encode(v1.encode()).decode()
    f.write(
        f"file-head <<file.v1>>{v1}<</file.v1>> file-mid <<file.v2>>{v2}<</file.v2>>"
        f" <<file.v1b64>>{b64}<</file.v1b64>> file-tail\n"
    )
with open(f"named-{v1}.txt", "w") as f:
    f.write("named\n")
print("DONE", flush=True)
"""


# ----------------------------------------------------------------------------- the values


def _canary_values() -> dict[str, str]:
    """Random values (so any occurrence can only come from this test), the second full of
    characters that need escaping in JSON, URLs and shells."""
    return {
        ENV_CRED: "cnry1-" + secrets.token_urlsafe(30),  # 46 characters
        FILE_CRED: secrets.token_urlsafe(9) + ' "a\\b/c+d\'e&f = g" ' + secrets.token_urlsafe(9),
        GIT_CRED: "cnry3-" + secrets.token_urlsafe(24),
    }


def _stable_b64(raw: bytes, shift: int) -> tuple[int, int]:
    """The characters of base64(prefix of ``shift`` bytes + raw) that depend on ``raw`` only."""
    return -(-8 * shift // 6), 8 * (shift + len(raw)) // 6


def leak_forms(value: str) -> dict[str, bytes]:
    """Every form of ``value`` that must never leave the device (base64: the stable part)."""
    raw = value.encode()
    forms = {
        "raw": raw,
        "url": urllib.parse.quote(value, safe="").encode(),
        "url-keep-slash": urllib.parse.quote(value).encode(),
        "json": json.dumps(value)[1:-1].encode(),
        "shell": shlex.quote(value).encode(),
    }
    for shift in (0, 1, 2):
        first, end = _stable_b64(raw, shift)
        for alphabet, encode in (("std", base64.b64encode), ("url", base64.urlsafe_b64encode)):
            forms[f"b64{alphabet}{shift}"] = encode(bytes(shift) + raw)[first:end]
    return forms


def printed_forms(tag: str, value: str) -> dict[str, tuple[str, int, int]]:
    """What SCRIPT prints for ``value``: label -> (text, start, end of the part that must be
    masked). The rest of the text may be masked too, or shown as it is."""
    raw = value.encode()
    out: dict[str, tuple[str, int, int]] = {
        f"{tag}.raw": (value, 0, len(value)),
        f"{tag}.split": (value, 0, len(value)),
        f"{tag}.stderr": (value, 0, len(value)),
    }
    quoted = urllib.parse.quote(value, safe="")
    out[f"{tag}.url"] = (quoted, 0, len(quoted))
    dumped = json.dumps(value)
    out[f"{tag}.json"] = (dumped, 1, len(dumped) - 1)  # the quotes are not the value's
    quoted = shlex.quote(value)
    out[f"{tag}.shell"] = (
        (quoted, 0, len(quoted)) if quoted == value else (quoted, 1, len(quoted) - 1)
    )
    for shift in (0, 1, 2):
        prefix = b"\xfa\x01"[:shift]
        first, end = _stable_b64(raw, shift)
        for alphabet, encode in (("std", base64.b64encode), ("url", base64.urlsafe_b64encode)):
            encoded = encode(prefix + raw).decode()
            out[f"{tag}.b64{alphabet}{shift}"] = (encoded, first, end)
            out[f"{tag}.b64{alphabet}{shift}np"] = (encoded.rstrip("="), first, end)
    return out


def _copy_escape(data: bytes) -> bytes:
    """How COPY's text format (pg_dump) spells a text value."""
    return (
        data.replace(b"\\", b"\\\\")
        .replace(b"\n", b"\\n")
        .replace(b"\r", b"\\r")
        .replace(b"\t", b"\\t")
    )


def _json_escape(data: bytes) -> bytes:
    return json.dumps(data.decode("utf-8", "surrogateescape"))[1:-1].encode()


@dataclass
class LeakFinder:
    """Finds any GRAM-byte piece of any form of any canary value in a blob of bytes.

    Each form is also looked for as the places it may end up would spell it: JSON-escaped
    (once: a JSON body; twice: JSON inside a JSON string), COPY-escaped (a text column in a
    dump, also of JSON in a jsonb column) and as lowercase hex (a bytea column in a dump).
    """

    values: dict[str, str]
    grams: dict[int, dict[bytes, str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, value in self.values.items():
            for form, data in leak_forms(value).items():
                spellings = {
                    "": data,
                    "json": _json_escape(data),
                    "json2": _json_escape(_json_escape(data)),
                    "copy": _copy_escape(data),
                    "copy-json": _copy_escape(_json_escape(data)),
                    "hex": data.hex().encode(),
                }
                for spelling, needle in spellings.items():
                    size = 2 * GRAM if spelling == "hex" else GRAM
                    size = min(size, len(needle))
                    table = self.grams.setdefault(size, {})
                    label = f"{name}:{form}" + (f"({spelling})" if spelling else "")
                    for i in range(len(needle) - size + 1):
                        table.setdefault(needle[i : i + size], label)

    def find(self, data: bytes) -> list[str]:
        """Each stretch of ``data`` made of canary pieces: which form, where, and the text
        around it (the stretch itself is not shown)."""
        spans: list[tuple[int, int, str]] = []
        for size, table in self.grams.items():
            for i in range(len(data) - size + 1):
                label = table.get(data[i : i + size])
                if label is not None:
                    spans.append((i, i + size, label))
        spans.sort()
        merged: list[tuple[int, int, set[str]]] = []
        for begin, end, label in spans:
            if merged and begin <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(end, merged[-1][1]), merged[-1][2] | {label})
            else:
                merged.append((begin, end, {label}))
        return [
            f"{', '.join(sorted(labels))}: bytes {begin}-{end}, between"
            f" {data[max(begin - 30, 0) : begin]!r} and {data[end : end + 30]!r}"
            for begin, end, labels in merged
        ]


def check_search(finder: LeakFinder, haystack: bytes, plant: bytes) -> list[str]:
    """The hits in ``haystack``, after showing that ``plant`` put into it would be found."""
    middle = len(haystack) // 2
    assert finder.find(
        haystack[max(middle - 2000, 0) : middle] + plant + haystack[middle : middle + 2000]
    )
    return finder.find(haystack)


# ----------------------------------------------------------------------------- servers


class AuthServer:
    """Loopback HTTP: 200 only for ``Authorization: Bearer <token>`` exactly, else 401."""

    def __init__(self, token: str) -> None:
        self.expected = f"Bearer {token}"
        self.right = 0
        self.wrong = 0
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                ok = self.headers.get("Authorization") == outer.expected
                with outer._lock:
                    if ok:
                        outer.right += 1
                    else:
                        outer.wrong += 1
                self.send_response(200 if ok else 401)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                pass  # never to stderr: the header holds the secret

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/canary"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> AuthServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(10)


def _status_with(url: str, authorization: str, context: ssl.SSLContext | None = None) -> int:
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context)
    )
    request = urllib.request.Request(url, headers={"Authorization": authorization})  # noqa: S310
    try:
        with opener.open(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as err:
        return err.code


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture
def control_plane_log(tmp_path: Path) -> Iterator[Path]:
    """Every log record of this process (the in-process control plane), DEBUG and up."""
    path = tmp_path / "controlplane.log"
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setLevel(logging.DEBUG)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield path
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
        handler.close()


@pytest.fixture
async def gateway(
    control_plane_log: Path,
    db: async_sessionmaker[AsyncSession],
    database_url: str,
    tmp_path: Path,
) -> AsyncIterator[Gateway]:
    async with running_gateway(database_url, db, tmp_path / "cp") as gw:
        yield gw


@pytest.fixture
def device(tmp_path: Path) -> Iterator[Endpointd]:
    with endpointd_in(tmp_path) as daemon:
        # A real file keyring (outside endpointd's dirs), shared by the CLI and the daemon.
        daemon.env["PYTHON_KEYRING_BACKEND"] = PLAINTEXT_KEYRING
        daemon.env["XDG_DATA_HOME"] = str(tmp_path / "keyring-data")
        yield daemon


# ----------------------------------------------------------------------------- steps


def _write_policy(daemon: Endpointd, work: Path) -> None:
    scope = json.dumps(glob.escape(sys.executable) + " *")
    body = ""
    for name in (ENV_CRED, FILE_CRED, GIT_CRED):
        body += f"\n[credentials.{name}]\nallow = [{scope}]\n"
        if name == GIT_CRED:
            # The git helper answers only https requests for the hosts named here.
            body += f"hosts = [{json.dumps(GIT_HOST)}]\n"
    _write_policy_file(daemon, work, body)


def _write_policy_file(daemon: Endpointd, work: Path, credentials: str) -> None:
    """The device's policy: ``work`` the allowed root, commands allowed, ``credentials``."""
    body = f'allowed_roots = [{json.dumps(str(work))}]\ndefault_action = "allow"\n'
    body += credentials
    daemon.config_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = daemon.config_dir / "policy.toml"
    path.write_text(body)
    path.chmod(0o600)


def _add_credential(daemon: Endpointd, name: str, value: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "endpointd", "creds", "add", name],
        input=(value + "\n").encode(),
        capture_output=True,
        cwd=tempfile.gettempdir(),
        env=daemon.env,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    assert f"stored credential {name}".encode() in proc.stdout


async def _pair(gateway: Gateway, daemon: Endpointd, work: Path) -> None:
    code = await gateway.pairing_code(DEVICE)
    proc = await asyncio.to_thread(
        daemon.cli,
        "pair",
        f"https://127.0.0.1:{gateway.port}",
        code,
        "--key-file",
        str(daemon.key_file),
        "--fingerprint",
        gateway.tls.fingerprint,
        "--allow-root",
        str(work),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


async def _run(
    gateway: Gateway, spec: specs.Spec, daemon: Endpointd
) -> tuple[CommandResult, bytes]:
    command_id = await gateway.queue.submit(DEVICE, spec)
    result = await gateway.queue.wait(command_id, timeout=40)
    assert result.state == "finished", (result, daemon.log()[-3000:])
    output = await gateway.queue.output(command_id, 0, 1 << 24)
    assert len(output) == result.output_size
    return result, output


def _result_bytes(result: CommandResult, output: bytes) -> bytes:
    return b"\n".join(
        [
            output,
            result.output_head,
            result.output_tail,
            (result.error or "").encode(),
            (result.refusal_reason or "").encode(),
        ]
    )


def _llm_bytes(fake_llm: FakeOpenAIServer) -> bytes:
    """Every request the fake LLM received: path, query, headers and body."""
    return b"\n".join(
        (r.path + "?" + r.query + "\n" + json.dumps(r.headers) + "\n" + r.body_text).encode()
        for r in fake_llm.requests
    )


def _read(*paths: Path) -> list[bytes]:
    """The files' bytes (b"" for one that does not exist); log handlers flushed first."""
    for handler in logging.getLogger().handlers:
        handler.flush()
    return [path.read_bytes() if path.exists() else b"" for path in paths]


def _marked(text: str) -> dict[str, str]:
    """label -> what stands between `before-L <<L>>` and `<</L>> after-L` (whole lines)."""
    found = {}
    for match in re.finditer(r"before-([\w.]+) <<\1>>(.*?)<</\1>> after-\1", text, re.DOTALL):
        found[match.group(1)] = match.group(2)
    return found


def _between(text: str, label: str) -> str:
    match = re.search(rf"<<{re.escape(label)}>>(.*?)<</{re.escape(label)}>>", text, re.DOTALL)
    assert match is not None, f"no <<{label}>> in the output"
    return match.group(1)


def assert_masked(label: str, shown: str, original: str, start: int, end: int) -> None:
    """``shown`` is ``original`` with [start, end) all '*' and nothing else changed but to '*'."""
    assert len(shown) == len(original), f"{label}: length {len(shown)}, expected {len(original)}"
    assert set(shown[start:end]) == {"*"}, f"{label}: not masked where it must be"
    for i, (seen, orig) in enumerate(zip(shown, original, strict=True)):
        assert seen in ("*", orig), f"{label}: character {i} changed to something but '*'"


def _pg_dump_binary() -> str:
    if not os.environ.get("TEST_DATABASE_URL"):
        import pgserver

        bundled = Path(pgserver.__file__).parent / "pginstall" / "bin" / "pg_dump"
        if bundled.exists():
            return str(bundled)
    found = shutil.which("pg_dump")
    assert found, "pg_dump is needed (install the PostgreSQL client tools)"
    return found


def _pg_dump(database_url: str) -> bytes:
    proc = subprocess.run(
        [_pg_dump_binary(), "--no-owner", "--no-privileges", "--dbname", asyncpg_dsn(database_url)],
        capture_output=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    assert b"COPY public.commands" in proc.stdout
    return proc.stdout


async def _router_reads(
    db: async_sessionmaker[AsyncSession],
    pool: asyncpg.Pool,
    fake_llm: FakeOpenAIServer,
    text: str,
    tag: str = "canary",
) -> list[ChatRequest]:
    """Give ``text`` to the router as web-chat messages and let the model recall each one.

    ``tag``: what the messages' ids start with (one per call in a test). Returns the
    model requests of this call."""
    before = len(fake_llm.chat_requests)
    await save_policy(db, Admission())  # the default: web-chat users are heard
    intake = Intake(pool)
    console = Actor("web:tester", "tester", groups=(WEB_CONSOLE_GROUP,))
    chunks = [text[i : i + 3500] for i in range(0, len(text), 3500)]
    for n, chunk in enumerate(chunks):
        ingested = await intake.ingest(
            IncomingTrigger(
                source="web",
                external_id=f"web:tester:{tag}-{n}",
                thread=ThreadRef("canary-conversation", title="canary"),
                actor=console,
                kind="message",
                text=chunk,
                direct=True,
            )
        )
        assert ingested.route == "router", ingested

    def respond(request: ChatRequest) -> Reply:
        if (request.last_message() or {}).get("role") == "tool":
            return ignore_batch(request)  # read; nothing to do (a turn decides each)
        ids = TRIGGER_ID.findall(request.last_user_message() or "")
        return Reply(tool_calls=[ToolCall("recall", {"id": trigger}) for trigger in ids])

    fake_llm.respond_with(respond)
    router = Router(pool, fake_llm.async_openai_client(), FAKE_MODEL, policy=intake.policy)
    assert await router.turn() == len(chunks)
    return fake_llm.chat_requests[before:]


def _last_tool_results(request: ChatRequest) -> list[dict[str, Any]]:
    """The tool results that end ``request`` (the answers to its last assistant message)."""
    found: list[dict[str, Any]] = []
    for message in reversed(request.messages):
        if message.get("role") != "tool":
            break
        found.insert(0, message)
    return found


# ----------------------------------------------------------------------------- the test


async def test_canary_credentials_never_leave_the_device(
    gateway: Gateway,
    device: Endpointd,
    control_plane_log: Path,
    database_url: str,
    db: async_sessionmaker[AsyncSession],
    pool: asyncpg.Pool,
    fake_llm: FakeOpenAIServer,
    tmp_path: Path,
) -> None:
    values = _canary_values()
    v1, v2, v3 = values[ENV_CRED], values[FILE_CRED], values[GIT_CRED]
    with_git = shutil.which("git") is not None  # without git, two deliveries are tested
    tags = {"v1": v1, "v2": v2, **({"v3": v3} if with_git else {})}
    finder = LeakFinder(values)
    work = tmp_path / "work"
    work.mkdir()

    # The device: its own policy (scopes the credentials to this Python), the values added
    # through the real CLI from stdin, paired with the real gateway, running.
    _write_policy(device, work)
    for name, value in values.items():
        _add_credential(device, name, value)
    await _pair(gateway, device, work)
    device.start()

    with AuthServer(v1) as server:
        # The server really checks: anything but the right credential gets 401.
        assert await asyncio.to_thread(_status_with, server.url, "Bearer " + v1[:-1]) == 401
        server.wrong = 0
        uses = [
            specs.credential(ENV_CRED, "env", "CANARY"),
            specs.credential(FILE_CRED, "file", "CANARY_FILE"),
        ]
        if with_git:
            uses.append(specs.credential(GIT_CRED, "git_helper"))
        argv = [sys.executable, "-c", SCRIPT, server.url, *(["git"] if with_git else [])]
        exec_spec = specs.Exec(argv=argv, cwd=str(work), credentials=uses)
        exec_result, exec_output = await _run(gateway, exec_spec, device)
        assert (server.right, server.wrong) == (1, 0)
    read_result, read_output = await _run(
        gateway, specs.ReadFile(str(work / "canary-file.txt")), device
    )
    list_result, list_output = await _run(gateway, specs.ListDir(str(work), depth=1), device)

    # --- each credential reached the command intact ...
    shown = exec_output.decode()
    assert exec_result.exit_code == 0, shown
    assert "AUTH=200" in shown, shown
    assert shown.rstrip().endswith("DONE"), shown
    assert _between(shown, "v2.mode") == "0o600"
    for tag, value in tags.items():
        digest = hashlib.sha256(value.encode()).hexdigest()
        assert _between(shown, f"{tag}.sha256") == digest, f"{tag} was not delivered intact"

    # --- ... and every form of it came back masked, the text around it intact
    expected: dict[str, tuple[str, int, int]] = {}
    for tag, value in tags.items():
        expected.update(printed_forms(tag, value))
    if with_git:
        assert _between(shown, "git.rc") == "0", shown
        fill = f"protocol=https|host=canary.invalid|username=x-access-token|password={v3}|"
        start = fill.index("password=") + len("password=")
        expected["git.fill"] = (fill, start, start + len(v3))
    marked = _marked(shown)
    assert sorted(marked) == sorted(expected), "markers missing or mangled:\n" + shown
    for label, (original, start, end) in expected.items():
        assert_masked(label, marked[label], original, start, end)

    file_text = read_output.decode()
    assert file_text.startswith("file-head <<file.v1>>"), file_text
    assert file_text.endswith(" file-tail\n"), file_text
    assert_masked("file.v1", _between(file_text, "file.v1"), v1, 0, len(v1))
    assert_masked("file.v2", _between(file_text, "file.v2"), v2, 0, len(v2))
    b64 = base64.b64encode(v1.encode()).decode()
    assert_masked(
        "file.v1b64", _between(file_text, "file.v1b64"), b64, *_stable_b64(v1.encode(), 0)
    )

    listing = list_output.decode()
    assert all(json.loads(line) for line in listing.splitlines())
    assert '"canary-file.txt"' in listing, listing
    assert f'"named-{"*" * len(v1)}.txt"' in listing, listing  # a file name is output too

    # --- nothing that left the device holds a piece of any form of any value
    leaks: dict[str, list[str]] = {}
    plant = v2.encode()
    for what, result, output in (
        ("exec result", exec_result, exec_output),
        ("read_file result", read_result, read_output),
        ("list_dir result", list_result, list_output),
    ):
        leaks[what] = check_search(finder, _result_bytes(result, output), plant)

    # The router reads all the commands returned (recalling each message in full) and
    # talks to the model about it.
    returned = f"exec output:\n{shown}\nread_file:\n{file_text}\nlist_dir:\n{listing}"
    chat = await _router_reads(db, pool, fake_llm, returned)
    assert len(chat) == 2, "expected a call, then one with the recalled messages"
    recalled = json.dumps([m.get("content") for m in chat[1].tool_results()])
    assert "<<v2.raw>>" in recalled, "the model never got the recalled output"
    assert "named-****" in recalled, "the model never got the recalled listing"
    leaks["fake LLM requests"] = check_search(finder, _llm_bytes(fake_llm), plant)
    for value in values.values():
        fake_llm.assert_never_saw(value)

    # The database: all the control plane stored (commands, output chunks, triggers, the
    # router's records and conversation), as pg_dump prints it.
    leaks["pg_dump"] = finder.find(await asyncio.to_thread(_pg_dump, database_url))

    # Logs, endpointd's once it has stopped (so all is written).
    device.stop()
    daemon_log, audit_log, cp_log = _read(
        device.log_path, device.state_dir / "audit.log", control_plane_log
    )
    assert b" DEBUG " in daemon_log, "endpointd did not log at debug level"
    assert b"finished cmd_" in daemon_log, daemon_log
    leaks["endpointd log"] = check_search(finder, daemon_log, plant)
    leaks["endpointd audit log"] = check_search(finder, audit_log, plant)
    assert b" INFO controlplane.gateway." in cp_log, "the gateway's records were not captured"
    assert b" DEBUG " in cp_log, "debug records were not captured"
    leaks["control plane log"] = check_search(finder, cp_log, plant)

    assert not any(leaks.values()), "canary values left the device:\n" + "\n".join(
        f"  {where}: {hit}" for where, hits in leaks.items() for hit in hits[:20]
    )

    # The searches are live: a value planted where the control plane stores and logs things
    # is found in a new dump (a text and a bytea column) and in the captured log.
    await pool.execute(
        "INSERT INTO blobs (id, content_type, size, data) VALUES ('blb_canary_plant', $1, 0, $2)",
        v2,
        v1.encode(),
    )
    planted = " ".join(finder.find(await asyncio.to_thread(_pg_dump, database_url)))
    assert f"{FILE_CRED}:raw(copy)" in planted, planted
    assert f"{ENV_CRED}:raw(hex)" in planted, planted
    logging.getLogger("controlplane.canary").debug("planted %s", v3)
    assert finder.find(_read(control_plane_log)[0])


# ----------------------------------------------------------------------------- http delivery

HTTP_CRED = "canary-http"
MASKED = b"*" * GRAM  # what the redactor leaves of a value it masked

# The Python command of the http test. The token is never named: urllib finds the proxy and
# the CA bundle in the environment endpointd gives the command. Then it prints all that
# environment and hexdumps /proc/self/environ and every file in its TMPDIR (the CA bundle
# is there) and the CA files it was pointed at: the token, in any of these, would show (the
# redactor masks raw text, not hex). argv[1]: the URL to fetch.
HTTP_SCRIPT = r"""
import os, sys, urllib.request


def hexdump(label, data):
    print(f"<<hex {label}>> {len(data)} bytes", flush=True)
    for i in range(0, len(data), 64):
        print(data[i : i + 64].hex())
    print(f"<</hex {label}>>", flush=True)


with urllib.request.urlopen(sys.argv[1], timeout=30) as response:
    print(f"<<urllib>>{response.status} {response.read().decode()}<</urllib>>", flush=True)
for name in sorted(os.environ):
    print(f"env {name}={os.environ[name]}")
if os.path.exists("/proc/self/environ"):  # Linux: the environment as the kernel holds it
    with open("/proc/self/environ", "rb") as f:
        hexdump("/proc/self/environ", f.read())
tmp = os.environ["TMPDIR"]
paths = [os.path.join(d, n) for d, _, names in sorted(os.walk(tmp)) for n in sorted(names)]
for var in ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NODE_EXTRA_CA_CERTS",
            "GIT_SSL_CAINFO"):
    paths.append(os.environ.get(var, ""))
dumped = set()
for path in filter(None, paths):
    if os.path.realpath(path) not in dumped:
        dumped.add(os.path.realpath(path))
        with open(path, "rb") as f:
            hexdump(path, f.read())
print(f"<<tmpdir>>{tmp}<</tmpdir>> <<dumped>>{len(dumped)}<</dumped>>", flush=True)
print("DONE", flush=True)
"""


def _hexdumped(text: str, label: str) -> bytes:
    """The bytes HTTP_SCRIPT hexdumped under ``label``."""
    match = re.search(
        rf"<<hex {re.escape(label)}>> (\d+) bytes\n(.*?)<</hex {re.escape(label)}>>",
        text,
        re.DOTALL,
    )
    assert match is not None, f"no hexdump of {label} in the output"
    data = bytes.fromhex(match.group(2).replace("\n", ""))
    assert len(data) == int(match.group(1)), f"the hexdump of {label} is not whole"
    return data


def _bare_repo(directory: Path, bare: Path) -> str:
    """A one-commit repository, cloned bare to ``bare``; its HEAD."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull, HOME=str(directory))
    source = directory / "source"
    source.mkdir(parents=True)

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=source, env=env, capture_output=True, text=True, check=True
        ).stdout

    git("init", "-q", "-b", "main")
    (source / "README").write_text("canary through the proxy\n")
    git("add", "README")
    git("-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "one")
    git("clone", "-q", "--bare", str(source), str(bare))
    return git("rev-parse", "HEAD").strip()


def _scope(program: str) -> str:
    """A credential scope glob for ``program`` (found on PATH), by its resolved path."""
    found = shutil.which(program)
    assert found, f"{program} is needed"
    return json.dumps(glob.escape(os.path.realpath(found)) + " *")


@pytest.mark.skipif(
    shutil.which("curl") is None or shutil.which("git") is None, reason="needs curl and git"
)
async def test_an_http_delivered_token_reaches_the_server_and_nothing_else(
    gateway: Gateway,
    device: Endpointd,
    control_plane_log: Path,
    database_url: str,
    db: async_sessionmaker[AsyncSession],
    pool: asyncpg.Pool,
    fake_llm: FakeOpenAIServer,
    tmp_path: Path,
) -> None:
    """The acceptance for ``http`` delivery: a real HTTPS server demands the token as a
    bearer token; curl, Python's urllib and ``git ls-remote`` reach it through endpointd's
    per-command proxy, the server gets ``Bearer <token>`` each time, and the token is in no
    output, no row of the database, no request to the model, no log, in no form the
    LeakFinder knows (raw, base64 at every shift, URL, JSON, shell; as a dump or a request
    body would spell them, hex included)."""
    token = "cnry-http-" + secrets.token_urlsafe(30)
    finder = LeakFinder({HTTP_CRED: token})
    work = tmp_path / "work"
    work.mkdir()
    ca = TestCA(tmp_path / "test-ca")
    with HttpsServer(tmp_path / "https", token, ca=ca) as server:
        head = _bare_repo(tmp_path / "git-source", server.root / "repo.git")
        authority = f"127.0.0.1:{server.port}"
        api = server.url("/api", "127.0.0.1")
        repo = server.git_url("repo", "127.0.0.1")
        # The server really checks: without the token, 401.
        trust = ssl.create_default_context(cafile=str(ca.ca_file))
        assert await asyncio.to_thread(_status_with, api + "/check", "Bearer no", trust) == 401
        assert (server.authorizations, server.denied) == ([["Bearer no"]], 1)

        # The device: the credential for curl, git and this Python, for the server only;
        # its proxy trusts the test CA for the upstream connection.
        scopes = ", ".join(_scope(p) for p in ("curl", "git", sys.executable))
        _write_policy_file(
            device,
            work,
            f"\n[credentials.{HTTP_CRED}]\nallow = [{scopes}]\nhosts = [{json.dumps(authority)}]\n",
        )
        device.env["SSL_CERT_FILE"] = str(ca.ca_file)
        _add_credential(device, HTTP_CRED, token)
        await _pair(gateway, device, work)
        device.start()

        uses = [specs.credential(HTTP_CRED, "http")]
        runs: dict[str, tuple[CommandResult, bytes]] = {}
        for what, argv in (
            ("curl", ["curl", "-sS", "--fail", f"{api}/curl"]),
            ("git", ["git", "ls-remote", repo]),
            ("urllib", [sys.executable, "-c", HTTP_SCRIPT, f"{api}/urllib"]),
        ):
            spec = specs.Exec(argv=argv, cwd=str(work), credentials=uses, timeout_seconds=120)
            runs[what] = await _run(gateway, spec, device)
        seen = server.authorizations[1:]
        denied = server.denied

    # --- each succeeded, with the server's answer in its output ...
    for what, (result, output) in runs.items():
        assert result.exit_code == 0, (what, output[-3000:], result.error)
    curl_output = runs["curl"][1].decode()
    assert json.loads(curl_output) == {
        "ok": True,
        "path": "/api/curl",
        "method": "GET",
        "received": 0,
    }, curl_output
    git_output = runs["git"][1].decode()
    assert f"{head}\trefs/heads/main" in git_output.splitlines(), git_output
    shown = runs["urllib"][1].decode()
    assert shown.rstrip().endswith("DONE"), shown[-3000:]
    status, _, body = _between(shown, "urllib").partition(" ")
    assert status == "200", shown[:3000]
    assert json.loads(body)["path"] == "/api/urllib"

    # ... through the proxy (with a CA bundle in TMPDIR, which was dumped) ...
    env = dict(line[4:].split("=", 1) for line in shown.splitlines() if line.startswith("env "))
    assert env["HTTPS_PROXY"].startswith("http://endpointd:"), env
    tmpdir = _between(shown, "tmpdir")
    assert env["TMPDIR"] == tmpdir
    assert env["SSL_CERT_FILE"].startswith(tmpdir + os.sep), env
    bundle = _hexdumped(shown, env["SSL_CERT_FILE"])
    assert b"# endpointd device CA" in bundle, "the CA bundle was not dumped"
    assert int(_between(shown, "dumped")) >= 1
    if sys.platform.startswith("linux"):
        environ = _hexdumped(shown, "/proc/self/environ").split(b"\0")
        assert f"HTTPS_PROXY={env['HTTPS_PROXY']}".encode() in environ, environ

    # ... and the server got the token from the proxy, as a bearer token, on every request
    # (curl's, the git ls-remote's, urllib's): the searches below are not vacuous.
    assert len(seen) >= 3, seen
    assert all(got == [f"Bearer {token}"] for got in seen), "unexpected Authorization headers"
    assert denied == 1  # only the check above

    # --- the token never reached the command: nothing was masked, no form of it is there
    leaks: dict[str, list[str]] = {}
    plant = token.encode()
    for what, (result, output) in runs.items():
        assert MASKED not in output, f"{what}: the redactor masked something"
        leaks[f"{what} result"] = check_search(finder, _result_bytes(result, output), plant)

    # The model: the router reads all the commands printed (recalling each message in full)
    # and talks to the model about it.
    returned = f"curl:\n{curl_output}\ngit ls-remote:\n{git_output}\nurllib:\n{shown}"
    recalled: list[dict[str, Any]] = []
    for n, start in enumerate(range(0, len(returned), 100_000)):
        # In parts, each whole in one model request (the router cuts what would not fit).
        chat = await _router_reads(db, pool, fake_llm, returned[start : start + 100_000], f"h{n}")
        assert len(chat) == 2, "expected a call, then one with the recalled messages"
        recalled += [json.loads(m["content"]) for m in _last_tool_results(chat[1])]
    # The model was shown every character the commands printed (and the searches below
    # see what it was shown).
    assert "".join(r["text"] for r in recalled) == returned, "the model was not shown it all"
    leaks["fake LLM requests"] = check_search(finder, _llm_bytes(fake_llm), plant)
    fake_llm.assert_never_saw(token)

    # The database: everything the control plane stored, as pg_dump prints it. It does
    # hold the commands (by credential name and delivery) and what they printed.
    dump = await asyncio.to_thread(_pg_dump, database_url)
    assert b'"delivery": "http"' in dump
    for printed in (f"{head}\trefs/heads/main", shown[shown.rindex("<<tmpdir>>") :]):
        assert printed.encode().hex().encode() in dump, "a command's output is not in the dump"
    leaks["pg_dump"] = check_search(finder, dump, plant)

    # The logs, endpointd's once it has stopped.
    device.stop()
    daemon_log, audit_log, cp_log = _read(
        device.log_path, device.state_dir / "audit.log", control_plane_log
    )
    assert b"finished cmd_" in daemon_log, daemon_log[-3000:]
    leaks["endpointd log"] = check_search(finder, daemon_log, plant)
    leaks["endpointd audit log"] = check_search(finder, audit_log, plant)
    leaks["control plane log"] = check_search(finder, cp_log, plant)

    assert not any(leaks.values()), "the http token left the device:\n" + "\n".join(
        f"  {where}: {hit}" for where, hits in leaks.items() for hit in hits[:20]
    )
