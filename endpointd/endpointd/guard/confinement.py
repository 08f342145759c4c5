"""What one command may touch, in terms every OS sandbox can enforce.

The daemon builds a :class:`Confinement` per command from the local policy (see
:func:`endpointd.guard.sandbox.plan`); the supervisor applies it to the command's process
between fork and exec (Landlock on Linux, :mod:`endpointd.guard.landlock`) or hands it to
``sandbox-exec`` as a generated profile (macOS, :mod:`endpointd.guard.seatbelt`). It is
plain data; the daemon turns it into what the supervisor's JSON spec carries.

The model, whatever the OS:

* **reads**: with ``reads_listed``, only what is listed: the system's directories (each
  mechanism knows its own), ``read``, ``read_extra``, the writable roots, less ``never`` and
  ``denied``; without it (older callers), everything except ``denied`` (and what lies
  beneath them); either way plus the single files in ``read_files`` even there (a
  harness's login, for that harness's runs only);
* **writes**: only beneath ``write`` (the command's workspace, its private TMPDIR, the
  owner's ``writable_paths``) and the device files in ``write_files``, except beneath
  ``protected`` (``.git/hooks``, ``.git/config`` inside the workspace), which stay
  read-only; denied paths are never writable either;
* **processes**: no signals, ptrace or abstract Unix sockets beyond its own process tree;
* **network**: ``allow`` (anything), ``deny`` (no IP sockets at all) or ``proxy`` (TCP only
  to ``proxy_port`` on loopback, where endpointd's egress proxy enforces the host list).

Standard library only: the supervisor imports this in a bare interpreter.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Confinement:
    denied: tuple[str, ...] = ()
    write: tuple[str, ...] = ()
    write_files: tuple[str, ...] = ()
    protected: tuple[str, ...] = ()
    network: str = "allow"  # "allow" | "deny" | "proxy"
    proxy_port: int | None = None
    # "landlock" or "seatbelt": which mechanism enforces it; "" when nothing does (off).
    mechanism: str = ""
    # Under "best-effort": what the OS could not enforce, said once in the command's log.
    unenforced: tuple[str, ...] = ()
    # Other programs' Unix sockets, hidden by path (Linux: mounts in the command's mount
    # namespace; Landlock cannot stop a connect() by path): directories and single files.
    hidden_dirs: tuple[str, ...] = ()
    hidden_files: tuple[str, ...] = ()
    # Linux with namespaces: the command sees an allow-listed view of the machine
    # (endpointd.guard.view): ``read`` (read-only roots beyond the workspace and the
    # writable ones), ``read_extra`` (this command's own: its clone's git directory),
    # ``never`` (masked wherever in view), ``homes`` (empty in view, but for grants).
    view: bool = False
    # Reads are an allow-list (the fields above, on Linux in a view; on macOS in the
    # Seatbelt profile): True wherever the daemon planned ``read`` .. ``homes``.
    reads_listed: bool = False
    read: tuple[str, ...] = ()
    read_extra: tuple[str, ...] = ()
    never: tuple[str, ...] = ()
    homes: tuple[str, ...] = ()
    # Single files readable (never writable) though denied: a harness run's login files
    # (endpointd.harness.stores).
    read_files: tuple[str, ...] = ()


# Character devices every command may write to (and read), whatever its workspace.
DEVICE_FILES = (
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/tty",
    "/dev/random",
    "/dev/urandom",
    "/dev/ptmx",
    "/dev/pts",
    "/dev/shm",  # noqa: S108 (POSIX shared memory: semaphores of multiprocessing and the like)
    "/dev/fd",
    "/proc/self/fd",
)
