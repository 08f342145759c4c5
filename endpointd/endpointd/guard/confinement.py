"""What one command may touch, in terms every OS sandbox can enforce.

The daemon builds a :class:`Confinement` per command from the local policy (see
:func:`endpointd.guard.sandbox.plan`); the supervisor applies it to the command's process
between fork and exec (Landlock on Linux, :mod:`endpointd.guard.landlock`) or hands it to
``sandbox-exec`` as a generated profile (macOS, :mod:`endpointd.guard.seatbelt`). It is
plain data so that it travels in the supervisor's JSON spec.

The model, whatever the OS:

* **reads**: everything except ``denied`` (and what lies beneath them);
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

from dataclasses import asdict, dataclass

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


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

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Confinement:
        return cls(
            denied=tuple(raw.get("denied") or ()),
            write=tuple(raw.get("write") or ()),
            write_files=tuple(raw.get("write_files") or ()),
            protected=tuple(raw.get("protected") or ()),
            network=str(raw.get("network") or "allow"),
            proxy_port=raw.get("proxy_port"),
            mechanism=str(raw.get("mechanism") or ""),
            unenforced=tuple(raw.get("unenforced") or ()),
            hidden_dirs=tuple(raw.get("hidden_dirs") or ()),
            hidden_files=tuple(raw.get("hidden_files") or ()),
        )


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
