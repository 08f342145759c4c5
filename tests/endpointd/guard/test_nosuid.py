"""The filter that keeps a command from making set-user-ID or set-group-ID files, alone,
against every system call ABI of the machine (endpointd/guard/nosuid.py).

Each case runs in a fresh interpreter that sets ``no_new_privs``, installs the filter (or,
as the control, does not) and tries to give a file of its own a set-id mode: natively, as
an i386 program would (``int 0x80``) and with x32 numbers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import endpointd
from endpointd.guard import nosuid

pytestmark = pytest.mark.skipif(nosuid.program() is None, reason="an ABI the filter lacks")
x86_64_only = pytest.mark.skipif(os.uname().machine != "x86_64", reason="x86_64's other ABIs")

ENDPOINTD_DIR = os.path.dirname(os.path.dirname(os.path.abspath(endpointd.__file__)))

# i386 chmod(path, 04755) through int 0x80, the path at offset 64 of the same page (which
# must lie below 4 GiB: the i386 ABI passes 32-bit pointers). Returns what the kernel did.
I386_CHMOD = (
    "53"  # push rbx
    "b80f000000"  # mov eax, 15 (chmod on i386)
    "bb{path}"  # mov ebx, path
    "b9ed090000"  # mov ecx, 0o4755
    "cd80"  # int 0x80
    "5b"  # pop rbx
    "c3"  # ret
)

SCRIPT = """
import ctypes, json, mmap, os, stat, sys
sys.path.append({endpointd_dir!r})
from endpointd.guard import nosuid
libc = ctypes.CDLL(None, use_errno=True)
if {filtered!r}:
    assert libc.prctl(38, 1, 0, 0, 0) == 0  # PR_SET_NO_NEW_PRIVS
    nosuid.install()
result = {{}}
def attempt(name, call):
    try:
        call()
        result[name] = "made"
    except OSError as exc:
        result[name] = exc.errno
for mode in (0o4755, 0o2755):
    open("f", "w").close()
    attempt("chmod %o" % mode, lambda: os.chmod("f", mode))
    os.unlink("f")
attempt("open", lambda: os.close(os.open("o", os.O_CREAT | os.O_WRONLY, 0o4755)))
attempt("mknod", lambda: os.mknod("m", stat.S_IFREG | 0o4755))
open("plain", "w").close()
attempt("chmod 755", lambda: os.chmod("plain", 0o755))
if os.uname().machine == "x86_64":
    path = os.path.abspath("i386").encode() + b"\\0"
    open("i386", "w").close()
    page = mmap.mmap(-1, mmap.PAGESIZE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | 0x40,
                     prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)  # MAP_32BIT
    base = ctypes.addressof(ctypes.c_char.from_buffer(page))
    assert base + 64 < 2**32
    page.write(bytes.fromhex({i386!r}.format(path=(base + 64).to_bytes(4, "little").hex())))
    page.seek(64)
    page.write(path)
    result["i386 chmod"] = ctypes.CFUNCTYPE(ctypes.c_int)(base)()
    open("x32", "w").close()
    done = libc.syscall(ctypes.c_long(90 | 0x40000000), b"x32", 0o4755)
    result["x32 chmod"] = 0 if done == 0 else ctypes.get_errno()
result["setid"] = sorted(n for n in os.listdir(".") if os.lstat(n).st_mode & 0o6000)
print(json.dumps(result))
"""


def _try(filtered: bool, cwd: Path) -> dict[str, Any]:
    script = SCRIPT.format(endpointd_dir=ENDPOINTD_DIR, filtered=filtered, i386=I386_CHMOD)
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
    )
    assert done.returncode == 0, done.stderr
    parsed: dict[str, Any] = json.loads(done.stdout)
    return parsed


def test_no_file_can_be_given_a_set_id_mode_and_ordinary_modes_still_work(
    tmp_path: Path,
) -> None:
    (tmp_path / "control").mkdir()
    control = _try(False, tmp_path / "control")
    for name in ("chmod 4755", "chmod 2755", "open", "mknod"):
        assert control[name] == "made", control  # the attempts work without the filter
    (tmp_path / "filtered").mkdir()
    filtered = _try(True, tmp_path / "filtered")
    for name in ("chmod 4755", "chmod 2755", "open", "mknod"):
        assert filtered[name] == 1, filtered  # EPERM
    assert filtered["chmod 755"] == "made"
    assert filtered["setid"] == [], filtered


@x86_64_only
def test_other_abis_cannot_set_the_bits_either(tmp_path: Path) -> None:
    (tmp_path / "control").mkdir()
    control = _try(False, tmp_path / "control")
    assert control["i386 chmod"] == 0, control  # the i386 call really chmods, unfiltered
    (tmp_path / "filtered").mkdir()
    filtered = _try(True, tmp_path / "filtered")
    assert filtered["i386 chmod"] == -1, filtered  # -EPERM
    assert filtered["x32 chmod"] == 1, filtered  # EPERM, not x32's own answer
    assert filtered["setid"] == [], filtered


def test_the_filter_reads_every_abis_numbers() -> None:
    """The program names each ABI of this machine, so a call through the other one meets
    its own numbers rather than passing unseen."""
    program = nosuid.program()
    assert program is not None
    audits = {k for code, _, _, k in program if code == 0x15}
    machine = os.uname().machine
    expected = {"x86_64": {0xC000003E, 0x40000003}, "aarch64": {0xC00000B7, 0x40000028}}
    assert expected[machine] <= audits


@pytest.mark.skipif(os.geteuid() != 0, reason="becomes another user")
def test_an_unprivileged_process_outside_a_user_namespace_still_gets_the_filter(
    tmp_path: Path,
) -> None:
    """The sandbox without namespaces (best-effort) runs the command as the daemon's user,
    which has no capability to give up nor the right to lock the bits: dropping must not
    fail there, and the filter must still come."""
    tmp_path.chmod(0o777)
    script = (
        f"import os, sys\nsys.path.append({ENDPOINTD_DIR!r})\n"
        "from endpointd.guard import capabilities\n"
        # Imports first: the interpreter's files may lie where that user cannot read.
        "os.setgroups([])\nos.setresgid(65534, 65534, 65534)\n"
        "os.setresuid(65534, 65534, 65534)\n"
        "capabilities.drop_all()\n"
        "open('f', 'w').close()\n"
        "try:\n    os.chmod('f', 0o4755)\n    print('made')\n"
        "except OSError as exc:\n    print('refused', exc.errno)\n"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["refused", "1"], done.stdout
