"""A real language model for the real-model tier: llama.cpp's `llama-server` on loopback.

`scripts/real_model` fetches the model (Qwen2.5-Coder-1.5B-Instruct, a 1.1 GB GGUF) and
builds the server into a cache outside the repository; this module only finds them there
(through `scripts/real_model check --json`, the one place that knows the cache's layout)
and runs the server for a test session: on a free loopback port, ready once `/health`
answers, stopped after. With an empty cache it fails in one line naming the script.

The server offers each of its two slots (the router's session and one worker's) an
8,192-token window, the small window the product is meant to work in, on 2 threads.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.support.helpers import free_port

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "real_model"
# What the product is told the model is called (llama-server answers to any name).
ALIAS = "qwen2.5-coder-1.5b-instruct"
SLOTS = 2  # the router and one worker, each with a window of its own
WINDOW = 8192  # tokens per slot
READY_SECONDS = 300  # loading 1.1 GB from a cold disk cache on a busy machine


@dataclass(frozen=True)
class Cached:
    model: Path
    server: Path


@dataclass
class LlamaServer:
    url: str  # the OpenAI-compatible base URL, …/v1
    process: subprocess.Popen[bytes]
    log: Path
    window: int = WINDOW

    def alive(self) -> bool:
        return self.process.poll() is None

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def cached() -> Cached:
    """The model and the server from the cache, or a one-line failure saying what to run."""
    found = subprocess.run(
        [sys.executable, str(SCRIPT.with_suffix(".py")), "check", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    try:
        paths = json.loads(found.stdout)
    except ValueError:
        pytest.fail(f"`{SCRIPT} check --json` failed: {found.stderr.strip()}", pytrace=False)
    if paths["missing"]:
        pytest.fail(
            f"the real model is not cached ({' and '.join(paths['missing'])}): run "
            f"scripts/real_model (about 1.1 GB to download and a 15-minute build; "
            f"docs/testing.md)",
            pytrace=False,
        )
    return Cached(model=Path(paths["model"]), server=Path(paths["server"]))


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=5).status_code == 200
    except httpx.TransportError:
        return False


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


def start(log: Path, found: Cached | None = None) -> LlamaServer:
    """llama-server on a free loopback port, once `/health` answers (the model is loaded)."""
    found = found or cached()
    port = free_port()
    command = [
        str(found.server),
        "--model",
        str(found.model),
        "--alias",
        ALIAS,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--jinja",  # the model's own chat template, with tools
        "--ctx-size",
        str(WINDOW * SLOTS),
        "--parallel",
        str(SLOTS),
        "--threads",
        str(min(2, os.cpu_count() or 1)),
    ]
    with log.open("ab") as out:
        process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
        )
    server = LlamaServer(url=f"http://127.0.0.1:{port}/v1", process=process, log=log)
    deadline = time.monotonic() + READY_SECONDS
    while not _ready(f"http://127.0.0.1:{port}"):
        if process.poll() is not None or time.monotonic() > deadline:
            _stop(process)
            tail = "\n".join(server.output().splitlines()[-30:])
            pytest.fail(
                f"llama-server did not become ready (exit {process.returncode}):\n{tail}",
                pytrace=False,
            )
        time.sleep(1)
    return server


@contextlib.contextmanager
def running(log: Path) -> Iterator[LlamaServer]:
    """llama-server with the real model from the cache, stopped after (a test session's)."""
    found = cached()
    began = time.monotonic()
    server = start(log, found)
    print(f"\nllama-server ready in {time.monotonic() - began:.1f} s at {server.url} ({log})")
    try:
        yield server
    finally:
        _stop(server.process)
