"""Matching lines with ripgrep, over files the walk already opened and judged.

ripgrep is fast at matching, but left to walk a tree itself it would open paths by name:
whatever a racing process swapped in between our check and its open, and whatever the
local policy denies that its own rules do not know of. So it never walks and never opens
a name we have not opened first. :mod:`endpointd.commands.tree` opens each file
(``O_NOFOLLOW``, relative to its directory's descriptor) and judges it on that descriptor;
ripgrep gets those descriptors (``pass_fds``) and, as the only paths on its command line,
their ``/proc/self/fd/N`` (``/dev/fd/N`` on macOS) names, which reopen the very file we
judged, not whatever a path names now. ``--no-config`` keeps ``RIPGREP_CONFIG_PATH`` out,
``--no-ignore`` stops it reading ignore files (the walk did that), its environment is
empty, and it is never started without a path (with none, it would search its working
directory). What is left for it to read is what we handed it.

One ripgrep per batch of files (bounded, so a huge tree never holds too many descriptors),
single-threaded so its answer comes in the order given.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass

from endpointd.guard import daemon_programs

BATCH_FILES = 256
BATCH_BYTES = 64 * 1024 * 1024
_BASE_ARGS = ("--no-config", "--json", "--no-ignore", "--threads", "1", "--no-messages")


class PatternError(Exception):
    """ripgrep refused the pattern; the message is its first lines."""


@dataclass(frozen=True)
class Opened:
    """A file the walk opened and judged: its descriptor and its path in the answer."""

    rel: str
    fd: int
    size: int


def _reopen_template() -> str | None:
    if sys.platform.startswith("linux") and os.path.isdir("/proc/self/fd"):
        return "/proc/self/fd/{}"
    if sys.platform == "darwin" and os.path.isdir("/dev/fd"):
        return "/dev/fd/{}"
    return None


def find() -> str | None:
    """The ``rg`` found at the daemon's start in a directory no command can write
    (:mod:`endpointd.guard.daemon_programs`), if this system can hand it descriptors by
    name."""
    if _reopen_template() is None:
        return None
    return daemon_programs.which("rg")


def batches(files: Iterator[Opened]) -> Iterator[list[Opened]]:
    batch: list[Opened] = []
    size = 0
    for opened in files:
        batch.append(opened)
        size += opened.size
        if len(batch) >= BATCH_FILES or size >= BATCH_BYTES:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def _text(lines: dict[str, str]) -> str:
    if "text" in lines:
        return lines["text"]
    return base64.b64decode(lines.get("bytes", "")).decode("utf-8", errors="replace")


def search(
    rg: str, batch: Sequence[Opened], pattern: str, *, literal: bool, ignore_case: bool
) -> Generator[tuple[Opened, int, str]]:
    """(file, line number, line) for each matching line of ``batch``, in order. The
    caller owns the descriptors; closing this generator early stops ripgrep."""
    template = _reopen_template()
    if not batch or template is None:
        return
    by_name = {template.format(o.fd): o for o in batch}
    args = [rg, *_BASE_ARGS, *(("-F",) if literal else ()), *(("-i",) if ignore_case else ())]
    args += ["-e", pattern, "--", *by_name]
    with tempfile.TemporaryFile() as errors:
        proc = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=errors,
            pass_fds=[o.fd for o in batch],
            env={},
            cwd="/",
        )
        try:
            assert proc.stdout is not None
            for raw in proc.stdout:
                event = json.loads(raw)
                if event.get("type") != "match":
                    continue
                data = event["data"]
                opened = by_name.get(_text(data["path"]))
                if opened is not None:
                    yield opened, int(data["line_number"]), _text(data["lines"])
            if proc.wait() == 2:
                errors.seek(0)
                message = errors.read(2000).decode("utf-8", errors="replace").strip()
                if message:
                    raise PatternError(" ".join(message.split()))
        finally:
            if proc.poll() is None:
                proc.kill()
            with contextlib.suppress(OSError):
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
