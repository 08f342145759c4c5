"""The seccomp network filter for real: what a confined process can still open, and reach.

Each case runs a fresh bare interpreter (``python -I -S``, as the daemon runs its helpers,
so the module is shown to need nothing but the standard library) that installs the filter
and then tries what a hostile command would; the kernel answers, not our code. A control
run without the filter shows that each refusal below is the filter's doing.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import endpointd
from endpointd.guard.seccomp import SeccompError, supported

needs_seccomp = pytest.mark.skipif(not supported(), reason="no seccomp filters here")
x86_64_only = pytest.mark.skipif(
    not supported() or os.uname().machine != "x86_64", reason="x86_64's foreign ABIs"
)

# How the children name EOPNOTSUPP (errno.errorcode knows it by its alias ENOTSUP).
EOPNOTSUPP = errno.errorcode[errno.EOPNOTSUPP]

# The directory holding the `endpointd` package, as the daemon puts it on a bare sys.path.
ENDPOINTD_DIR = str(Path(endpointd.__file__).resolve().parent.parent)

PREAMBLE = """
import ctypes, errno, json, os, resource, socket, subprocess, sys, threading
sys.path.append(ENDPOINTD_DIR)
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a killed child leaves no core file
from endpointd.guard import seccomp
ARCH = seccomp._ARCHES[os.uname().machine]
libc = ctypes.CDLL(None, use_errno=True)
result = {}

def trying(name, action):
    try:
        action()
        result[name] = "ok"
    except OSError as exc:
        result[name] = errno.errorcode.get(exc.errno, str(exc.errno))

def opening(*args):
    return lambda: socket.socket(*args).close()

def raw_syscall(number, *args):
    fd = libc.syscall(ctypes.c_long(number), *(ctypes.c_ulong(a) for a in args))
    if fd < 0:
        raise OSError(ctypes.get_errno(), "syscall failed")
    os.close(fd)

def unix_pair():
    a, b = socket.socketpair(socket.AF_UNIX)
    with a, b:
        a.sendall(b"x")
        assert b.recv(1) == b"x"

def io_uring_setup():
    params = ctypes.create_string_buffer(120)  # struct io_uring_params, zeroed
    raw_syscall(425, 1, ctypes.addressof(params))

if NETWORK is not None:
    seccomp.install(NETWORK)
"""


def _run(network: str | None, attempt: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run ``attempt`` (Python) in a fresh interpreter filtered for ``network``."""
    code = (
        f"ENDPOINTD_DIR = {ENDPOINTD_DIR!r}\nNETWORK = {network!r}\n"
        + PREAMBLE
        + textwrap.dedent(attempt)
    )
    return subprocess.run(
        [sys.executable, "-I", "-S", "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
    )


def _confined(network: str | None, attempt: str, cwd: Path) -> dict[str, Any]:
    """Run ``attempt`` (sets entries of ``result``) and return ``result``."""
    done = _run(network, textwrap.dedent(attempt) + "\nprint(json.dumps(result))\n", cwd)
    assert done.returncode == 0, done.stderr
    parsed: dict[str, Any] = json.loads(done.stdout)
    return parsed


@pytest.fixture
def server() -> Iterator[socket.socket]:
    """A TCP server listening on 127.0.0.1 (connections queue; nothing accepts them)."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        yield listener


def _pending(listener: socket.socket) -> bytes | None:
    """What the first queued connection sent, or None when nobody connected."""
    listener.setblocking(False)
    try:
        conn, _ = listener.accept()
    except BlockingIOError:
        return None
    with conn:
        conn.settimeout(10)
        return conn.recv(100)


# Every socket a hostile command might want, by the name the results use.
ATTEMPTS = """
trying("udp", opening(socket.AF_INET, socket.SOCK_DGRAM))
trying("tcp", opening(socket.AF_INET, socket.SOCK_STREAM))
trying("tcp6", opening(socket.AF_INET6, socket.SOCK_STREAM | socket.SOCK_NONBLOCK))
trying("udp6", opening(socket.AF_INET6, socket.SOCK_DGRAM))
trying("raw ip", opening(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP))
trying("sctp stream", opening(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_SCTP))
trying("netlink", opening(socket.AF_NETLINK, socket.SOCK_RAW, 0))
trying("packet", opening(socket.AF_PACKET, socket.SOCK_DGRAM, 0))
trying("unix socketpair", unix_pair)
trying("unix datagram", opening(socket.AF_UNIX, socket.SOCK_DGRAM))
trying("inet socketpair", lambda: socket.socketpair(socket.AF_INET))
# The high halves of the 64-bit arguments are garbage: the kernel ignores them (the
# control run creates a UDP socket), so the filter's 32-bit look must see through them.
HIGH = 1 << 32
trying("udp, high words set", lambda: raw_syscall(
    ARCH.socket, socket.AF_INET | HIGH, socket.SOCK_DGRAM | HIGH, HIGH))
trying("io_uring_setup", io_uring_setup)
"""


def _io_uring_enabled() -> bool:
    try:
        return Path("/proc/sys/kernel/io_uring_disabled").read_text().strip() == "0"
    except FileNotFoundError:
        return True


@needs_seccomp
def test_without_the_filter_the_kernel_permits_every_attempt(tmp_path: Path) -> None:
    result = _confined(None, ATTEMPTS, tmp_path)
    expected_ok = set(result) - {"inet socketpair", "io_uring_setup", "sctp stream"}
    assert {name: result[name] for name in expected_ok} == dict.fromkeys(expected_ok, "ok")
    assert result["inet socketpair"] == EOPNOTSUPP  # the kernel's own answer, not EPERM
    assert result["sctp stream"] in {"ok", "EPROTONOSUPPORT"}  # SCTP may not be built
    if _io_uring_enabled():
        assert result["io_uring_setup"] == "ok"


@needs_seccomp
def test_deny_leaves_only_unix_sockets(tmp_path: Path) -> None:
    assert _confined("deny", ATTEMPTS, tmp_path) == {
        "udp": "EPERM",
        "tcp": "EPERM",
        "tcp6": "EPERM",
        "udp6": "EPERM",
        "raw ip": "EPERM",
        "sctp stream": "EPERM",
        "netlink": "EPERM",
        "packet": "EPERM",
        "unix socketpair": "ok",
        "unix datagram": "ok",
        "inet socketpair": "EPERM",  # socketpair() is checked like socket()
        "udp, high words set": "EPERM",
        "io_uring_setup": "EPERM",
    }


@needs_seccomp
def test_proxy_leaves_tcp_over_ip_and_unix_sockets(tmp_path: Path) -> None:
    assert _confined("proxy", ATTEMPTS, tmp_path) == {
        "udp": "EPERM",
        "tcp": "ok",
        "tcp6": "ok",  # SOCK_NONBLOCK is masked off before the type is compared
        "udp6": "EPERM",
        "raw ip": "EPERM",
        "sctp stream": "EPERM",  # a stream socket, but not TCP: Landlock would not see it
        "netlink": "EPERM",
        "packet": "EPERM",
        "unix socketpair": "ok",
        "unix datagram": "ok",
        "inet socketpair": EOPNOTSUPP,  # let through, and refused by the kernel itself
        "udp, high words set": "EPERM",
        "io_uring_setup": "EPERM",
    }


@needs_seccomp
def test_deny_reaches_no_local_server(tmp_path: Path, server: socket.socket) -> None:
    port = server.getsockname()[1]
    result = _confined(
        "deny",
        f"""
        def connect():
            with socket.create_connection(("127.0.0.1", {port}), timeout=10) as conn:
                conn.sendall(b"through")
        trying("connect", connect)
        """,
        tmp_path,
    )
    assert result == {"connect": "EPERM"}
    assert _pending(server) is None


@needs_seccomp
def test_proxy_connects_to_a_local_server(tmp_path: Path, server: socket.socket) -> None:
    port = server.getsockname()[1]
    result = _confined(
        "proxy",
        f"""
        def connect():
            with socket.create_connection(("127.0.0.1", {port}), timeout=10) as conn:
                conn.sendall(b"through")
        trying("connect", connect)
        trying("udp", opening(socket.AF_INET, socket.SOCK_DGRAM))
        """,
        tmp_path,
    )
    assert result == {"connect": "ok", "udp": "EPERM"}
    assert _pending(server) == b"through"


@needs_seccomp
def test_programs_started_after_install_stay_confined(
    tmp_path: Path, server: socket.socket
) -> None:
    port = server.getsockname()[1]
    grandchild = textwrap.dedent(
        f"""
        import errno, json, socket
        result = {{}}
        status = open("/proc/self/status").read().splitlines()
        result["seccomp"] = [line.split()[1] for line in status if line.startswith("Seccomp:")]
        for name, action in [
            ("udp", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).close()),
            ("connect", lambda: socket.create_connection(("127.0.0.1", {port}), timeout=10)),
        ]:
            try:
                action()
                result[name] = "ok"
            except OSError as exc:
                result[name] = errno.errorcode[exc.errno]
        print(json.dumps(result))
        """
    )
    result = _confined(
        "deny",
        f"""
        done = subprocess.run(
            [sys.executable, "-I", "-S", "-c", {grandchild!r}],
            capture_output=True, text=True, check=True,
        )
        result["grandchild"] = json.loads(done.stdout)
        """,
        tmp_path,
    )
    # Seccomp: 2 is SECCOMP_MODE_FILTER, inherited across fork and execve.
    assert result == {"grandchild": {"seccomp": ["2"], "udp": "EPERM", "connect": "EPERM"}}
    assert _pending(server) is None


@needs_seccomp
def test_threads_started_before_install_are_confined_too(tmp_path: Path) -> None:
    result = _confined(
        None,
        """
        go, went = threading.Event(), threading.Event()
        def helper():
            go.wait()
            trying("udp from an older thread", opening(socket.AF_INET, socket.SOCK_DGRAM))
            went.set()
        threading.Thread(target=helper).start()
        seccomp.install("deny")
        go.set()
        went.wait(10)
        trying("udp from the installing thread", opening(socket.AF_INET, socket.SOCK_DGRAM))
        """,
        tmp_path,
    )
    assert result == {
        "udp from an older thread": "EPERM",
        "udp from the installing thread": "EPERM",
    }


@needs_seccomp
def test_an_unknown_mode_is_refused_and_nothing_is_installed(tmp_path: Path) -> None:
    result = _confined(
        None,
        """
        try:
            seccomp.install("allow")
        except seccomp.SeccompError as exc:
            result["error"] = errno.errorcode[exc.errno]
        status = open("/proc/self/status").read().splitlines()
        result["seccomp"] = [line.split()[1] for line in status if line.startswith("Seccomp:")]
        trying("udp", opening(socket.AF_INET, socket.SOCK_DGRAM))
        """,
        tmp_path,
    )
    assert result == {"error": "EINVAL", "seccomp": ["0"], "udp": "ok"}
    assert issubclass(SeccompError, OSError)


# Machine code, called as `int f(void)`: i386 socket(AF_INET, SOCK_DGRAM, 0) by `int 0x80`.
# i386 numbers its calls differently (359 is socket there, and 41 is dup): the filter's
# number checks mean nothing for it, so the arch check must come first.
I386_SOCKET = "53 b8 67 01 00 00 bb 02 00 00 00 b9 02 00 00 00 31 d2 cd 80 5b c3"


def _foreign_call(network: str | None, call: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return _run(
        network,
        f"""
        import mmap
        code = bytes.fromhex({I386_SOCKET!r})
        page = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
        page.write(code)
        entry = ctypes.addressof(ctypes.c_char.from_buffer(page))
        i386_socket = ctypes.CFUNCTYPE(ctypes.c_int)(entry)
        x32_socket = lambda: libc.syscall(ctypes.c_long(ARCH.socket | 0x40000000), 2, 2, 0)
        print("calling", flush=True)
        fd = {call}()
        print("returned", fd, ctypes.get_errno(), flush=True)
        """,
        cwd,
    )


@x86_64_only
def test_i386_system_calls_are_killed(tmp_path: Path) -> None:
    unconfined = _foreign_call(None, "i386_socket", tmp_path)
    assert unconfined.returncode == 0, unconfined.stderr
    fd = int(unconfined.stdout.split()[2])
    assert fd >= 0  # without the filter, this really opens a UDP socket
    for network in ("deny", "proxy"):
        confined = _foreign_call(network, "i386_socket", tmp_path)
        assert confined.returncode == -signal.SIGSYS
        assert confined.stdout == "calling\n"  # killed in the call: no socket came back


@x86_64_only
def test_x32_system_call_numbers_are_killed(tmp_path: Path) -> None:
    # Without the filter the kernel answers (ENOSYS where x32 is not built in).
    unconfined = _foreign_call(None, "x32_socket", tmp_path)
    assert unconfined.returncode == 0, unconfined.stderr
    for network in ("deny", "proxy"):
        confined = _foreign_call(network, "x32_socket", tmp_path)
        assert confined.returncode == -signal.SIGSYS
        assert confined.stdout == "calling\n"  # killed in the call: no socket came back
