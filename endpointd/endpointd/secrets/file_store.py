"""Credential values in files, for machines without an OS keyring (SSH servers, containers, WSL).

Chosen only explicitly (``endpointd creds add --store file`` or ``credential_store = "file"``
in policy.toml; see :mod:`endpointd.secrets.store`). Each value is one file
``<config dir>/credentials/<name>``, mode 0600, in a directory of mode 0700, both owned by
the user endpointd runs as. Nothing encrypts them: on such a machine the file permissions
are the boundary, and that is what `endpointd status` and the docs say. Commands never read
them: the config dir, and this directory by name, are among the sandbox's denied paths.

This module owns the files, and only the files: names are validated by the caller's rules
(:func:`endpointd.secrets.store.check_name`) and checked again here, so that no name can
leave the directory. Every access goes through a file descriptor of the directory opened
with ``O_NOFOLLOW`` and checked (type, owner, mode) before use, so a symlink or a loosened
directory swapped in between the check and the use is never followed. Writes are atomic
(0600 temp file, fsync, rename, fsync of the directory) and refuse a loose directory rather
than fixing it silently: whoever loosened it may already have read what was inside.

Error messages name paths and the fix, never a value.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path

from endpointd.errors import EndpointdError
from endpointd.rules.credentials import FILES_DIRECTORY as DIRECTORY

__all__ = ["BOUNDARY", "DIRECTORY", "FileStore", "FileStoreError"]

# What `creds add`, `status` and the docs say about this store, word for word.
BOUNDARY = (
    "values are plain files readable only by your user (0600 in a 0700 directory): on this"
    " machine the file permissions are the boundary"
)
# The credential name rule again (rules.credentials.NAME_RE), kept here so this module can never be
# handed a name that is a path: no '/', no leading '.', so no '..' and no hidden temp name.
_SAFE_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _NOFOLLOW | os.O_CLOEXEC
_TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | os.O_CLOEXEC
MAX_VALUE_BYTES = 1024 * 1024


class FileStoreError(EndpointdError):
    """A credential file or its directory cannot be used; the message names the path and fix."""


class FileStore:
    """One 0600 file per credential in the 0700 directory ``directory``."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def path(self, name: str) -> Path:
        return self.directory / _checked(name)

    # ------------------------------------------------------------------ public

    def check_writable(self) -> None:
        """Create the directory (0700) if needed, or FileStoreError if it cannot be used."""
        with self._dir(create=True):
            pass

    def write(self, name: str, text: str) -> None:
        """Store ``text`` as ``name``'s value, atomically; never readable by others."""
        name = _checked(name)
        data = text.encode("utf-8")
        with self._dir(create=True) as dfd:
            tmp = ""
            fd = -1
            for _ in range(100):
                tmp = f".{name}.{os.urandom(6).hex()}.tmp"
                try:
                    # 0600 from the first moment (the umask can only narrow it), never a
                    # wider mode while the value is being written.
                    fd = os.open(tmp, _TEMP_FLAGS, 0o600, dir_fd=dfd)
                    break
                except FileExistsError:
                    continue
            if fd < 0:
                raise FileStoreError(f"no usable temporary file name in {self.directory}")
            try:
                os.fchmod(fd, 0o600)
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
                os.close(fd)
                fd = -1
                os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
            except OSError as exc:
                if fd >= 0:
                    os.close(fd)
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=dfd)
                raise FileStoreError(
                    f"cannot write {self.directory / name}: {exc.strerror or exc}"
                ) from None
            os.fsync(dfd)

    def read(self, name: str) -> str | None:
        """The value of ``name``, None when there is no such file, or FileStoreError when
        the file or its directory is not private to this user."""
        name = _checked(name)
        path = self.directory / name
        with self._dir(create=False) as dfd:
            if dfd < 0:
                return None
            try:
                fd = os.open(name, os.O_RDONLY | _NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
            except FileNotFoundError:
                return None
            except OSError as exc:
                raise FileStoreError(_symlink_or(path, exc)) from None
            try:
                _check_private(path, os.fstat(fd), 0o600, "chmod 600")
                data = os.read(fd, MAX_VALUE_BYTES + 1)
            finally:
                os.close(fd)
        if len(data) > MAX_VALUE_BYTES:
            raise FileStoreError(f"{path} is larger than a credential can be (1 MiB)")
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise FileStoreError(
                f"{path} is not UTF-8 text; store it again with `endpointd creds add"
                f" {name} --store file --replace`"
            ) from None

    def delete(self, name: str) -> bool:
        """Remove ``name``'s file; False when there was none."""
        name = _checked(name)
        with self._dir(create=False) as dfd:
            if dfd < 0:
                return False
            try:
                os.unlink(name, dir_fd=dfd)
            except FileNotFoundError:
                return False
            except OSError as exc:
                raise FileStoreError(
                    f"cannot delete {self.directory / name}: {exc.strerror or exc}"
                ) from None
            os.fsync(dfd)
            return True

    # ------------------------------------------------------------------ the directory

    @contextlib.contextmanager
    def _dir(self, *, create: bool) -> Iterator[int]:
        """A checked descriptor of the directory (-1 when it is missing and not created)."""
        if os.name != "posix":
            raise FileStoreError(
                "the credential file store needs POSIX file permissions; use the OS keyring"
            )
        if create:
            # The parent (the config dir) is endpointd's own, made 0700 as everywhere else.
            self.directory.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            try:
                os.mkdir(self.directory, 0o700)
            except FileExistsError:
                pass
            except OSError as exc:
                raise FileStoreError(
                    f"cannot create {self.directory}: {exc.strerror or exc}"
                ) from None
        try:
            dfd = os.open(self.directory, _DIR_FLAGS)
        except FileNotFoundError:
            if create:
                raise FileStoreError(f"{self.directory} vanished while in use") from None
            yield -1
            return
        except OSError as exc:
            raise FileStoreError(_symlink_or(self.directory, exc, directory=True)) from None
        try:
            _check_private(self.directory, os.fstat(dfd), 0o700, "chmod 700")
            yield dfd
        finally:
            os.close(dfd)


def _checked(name: str) -> str:
    if _SAFE_NAME.fullmatch(name) is None:
        raise FileStoreError(f"invalid credential name {name!r}")
    return name


def _check_private(path: Path, st: os.stat_result, mode: int, fix: str) -> None:
    kind = stat.S_ISDIR if mode == 0o700 else stat.S_ISREG
    what = "a directory" if mode == 0o700 else "a regular file"
    if not kind(st.st_mode):
        raise FileStoreError(f"{path} is not {what}; remove it and add the credentials again")
    if st.st_uid != os.geteuid():
        raise FileStoreError(
            f"{path} is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()}), so"
            f" its content cannot be trusted; check who changed it, then `chown {os.geteuid()}"
            f" {path}` or remove it"
        )
    loose = stat.S_IMODE(st.st_mode) & ~mode & 0o777
    if loose:
        raise FileStoreError(
            f"{path} has mode {stat.S_IMODE(st.st_mode):o}, readable or writable by others;"
            f" run `{fix} {path}` (and consider the values in it exposed)"
        )


def _symlink_or(path: Path, exc: OSError, *, directory: bool = False) -> str:
    import errno

    if exc.errno in (errno.ELOOP, errno.ENOTDIR) or os.path.islink(path):
        return (
            f"{path} is a symbolic link or not a {'directory' if directory else 'file'};"
            " endpointd does not follow links there: remove it and add the credentials again"
        )
    return f"cannot open {path}: {exc.strerror or exc}"
