"""The init of a command's PID namespace, forked before the command is known.

A confined command runs in a PID and mount namespace of its own whose PID 1, its *init*,
mounts a private ``/proc``, confines itself, starts the command and reaps
(:mod:`endpointd.guard.namespaces` says why). Making one costs an ``unshare``, a fork of this
interpreter (with its copy-on-write faults) and a mount: about two milliseconds, which a
spare supervisor spends while it waits for a request (:func:`prepare`), so that a command's
path holds only what depends on the command: confining and spawning it (:meth:`Init.start`).

How: the supervisor ``unshare``s (a PID namespace for its children) and forks the init,
which takes a mount namespace of its own, mounts ``/proc``, stages the command's view
(:mod:`endpointd.guard.mountview`, where the spare was taught one) and blocks on a
socketpair. From then
on every process the supervisor starts lands in that namespace, so the daemon hands a
prepared spare confined commands only (``Zygote.launch``); one that gets an unconfined
command anyway starts it through the init too, without Landlock but still in the
namespace: more confined than asked, never less.

The request is one message: the command's fds (stdin, stdout, stderr, and the report pipe)
passed with ``SCM_RIGHTS``, then a length-prefixed JSON body (program, argv, env, cwd and
the Landlock spec). The init applies it (hidden sockets, Landlock, seccomp), ``posix_spawn``s
the command and says so on the report pipe (``ok``); what fails is written there instead,
as ``errno:step``, and EOF alone means the init died before either. From then on the init
reaps orphans until the command ends, writes its exit code to the status pipe and exits.

Standard library only, like the supervisor.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import socket
import struct

from endpointd import commanduser
from endpointd.guard import capabilities, landlock, mountview, namespaces, netns, seccomp

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, NoReturn

_LENGTH = struct.Struct(">I")
_FDS = 4  # stdin, stdout, stderr, report
# On the report pipe: the command runs. Anything else is ``errno:step``; EOF alone means the
# init died first.
STARTED = b"ok"

# What the command must have at their defaults: ignored signals survive exec (Python ignores
# SIGPIPE and SIGXFSZ; an init ignores the terminating ones).
RESET_SIGNALS = (
    signal.SIGPIPE,
    signal.SIGXFSZ,
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
)


class Init:
    """A namespace's init waiting for its command; ``status`` is the pipe on which it
    reports how the command ended."""

    __slots__ = ("_control", "pid", "status")

    def __init__(self, pid: int, control: socket.socket, status: int) -> None:
        self.pid = pid
        self._control = control
        self.status = status

    def start(
        self,
        program: str,
        argv: list[str],
        env: dict[str, str],
        fds: tuple[int, int, int, int],
        confine: dict[str, Any] | None,
    ) -> None:
        """Hand the command over (see the module doc); the report pipe, ``fds[3]``, says
        whether it started."""
        if confine and confine.get("view"):
            # The view binds directories where they really are, not the links on the way
            # (a checkout's .tools -> elsewhere): the program by its real path (argv[0]
            # stays as given).
            program = os.path.realpath(program)
        body = json.dumps(
            {"program": program, "argv": argv, "env": env, "cwd": os.getcwd(), "confine": confine}
        ).encode("utf-8")
        message = _LENGTH.pack(len(body)) + body
        try:
            sent = socket.send_fds(self._control, [message], list(fds))
            if sent < len(message):  # (not an empty send: the init may have closed by now)
                self._control.sendall(message[sent:])
        finally:
            self._control.close()

    def discard(self) -> None:
        """After a failed hand-over: the init exits on EOF."""
        self._control.close()
        os.close(self.status)


def prepare(preparation: dict[str, Any] | None = None) -> Init:
    """Move this process into a new mount namespace and its future children into a new PID
    namespace, and fork their init (see the module doc); once per process.

    OSError if the namespace cannot be made. ``preparation`` (the last confined command's
    hidden sockets and read grants) is applied ahead too; a command that differs just
    costs that work.
    """
    keep: set[int] = set()
    if commanduser.applies():
        # Before the PID namespace: the child that makes the id map must not be its init.
        with contextlib.suppress(OSError):  # (made again, and told, in the init)
            keep.add(commanduser.userns_fd())
    namespaces.enter()
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    status_r, status_w = os.pipe()
    try:
        pid = os.fork()
    except BaseException:
        for fd in (status_r, status_w):
            os.close(fd)
        ours.close()
        theirs.close()
        raise
    if pid == 0:
        try:
            _close_all_but({theirs.fileno(), status_w, *keep})
            # Forked from a supervisor that may have set its handlers and wakeup fd already.
            signal.set_wakeup_fd(-1)
            for sig in (signal.SIGCHLD, signal.SIGUSR1, signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, signal.SIG_DFL)
            _init_main(socket.socket(fileno=theirs.fileno()), status_w, preparation)
        finally:
            os._exit(1)
    theirs.close()
    os.close(status_w)
    return Init(pid, ours, status_r)


def _close_all_but(keep: set[int]) -> None:
    """The init holds nothing of the supervisor's (its socket to the daemon above all: the
    daemon waits for that socket's EOF), only what it uses and 0-2."""
    low = 3
    for fd in sorted(keep):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 65536)


def _receive(control: socket.socket) -> tuple[dict[str, Any], list[int]] | None:
    """The request and its fds; None on EOF (the command went elsewhere)."""
    head, fds, _, _ = socket.recv_fds(control, _LENGTH.size, _FDS)
    for fd in fds:
        os.set_inheritable(fd, False)  # only what posix_spawn dup2s reaches the command
    if len(head) < _LENGTH.size:
        for fd in fds:
            os.close(fd)
        return None
    (size,) = _LENGTH.unpack(head)
    chunks = []
    while size:
        chunk = control.recv(min(size, 1 << 20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        size -= len(chunk)
    if len(fds) != _FDS:
        raise ValueError(f"{len(fds)} fds with the request")
    request: dict[str, Any] = json.loads(b"".join(chunks))
    return request, fds


class _Ahead:
    """What the init did before its command was known: the sockets it hid, or the view it
    staged (:mod:`endpointd.guard.mountview`), and a ruleset (not yet enforced) holding
    the read grants."""

    __slots__ = ("hidden", "read", "ruleset", "view")

    def __init__(self, preparation: dict[str, Any]) -> None:
        self.hidden = (preparation["hidden_dirs"], preparation["hidden_files"])
        self.read = preparation["read"]
        self.view = preparation.get("view")
        if self.view:
            mountview.stage(self.view)
        else:
            namespaces.hide(*self.hidden)
        self.ruleset = landlock.create(_filesystem_rules(), _grants(self.read))


def _filesystem_rules() -> landlock.Ruleset:
    # Ports, when the network is limited, are a layer of their own (see _confine), so that
    # this one does not depend on the command.
    return landlock.Ruleset(connect_ports=None, bind_ports=None)


def _grants(pairs: list[list[Any]]) -> list[tuple[str, int]]:
    return [(str(path), int(rights)) for path, rights in pairs]


def _init_main(
    control: socket.socket, status_w: int, preparation: dict[str, Any] | None
) -> NoReturn:
    """PID 1 of the new namespace; never returns."""
    early: OSError | None = None
    ahead: _Ahead | None = None
    try:
        os.setpgid(0, 0)  # the command's process group: the supervisor signals it as a whole
        namespaces.mount_proc()
    except OSError as exc:
        early = exc  # told to the supervisor once a request brings the report pipe
    if early is None and preparation:
        with contextlib.suppress(Exception):  # what fails here is done (and told) later
            ahead = _Ahead(preparation)
        netns.prepare_ahead(preparation)
    with contextlib.suppress(OSError):  # (done again, and told, with the command)
        capabilities.prepare()
    try:
        received = _receive(control)
    except BaseException:
        os._exit(1)  # a torn request: the supervisor reads EOF on its report pipe
    if received is None:
        os._exit(0)
    request, (stdin_fd, out_w, err_w, report_w) = received
    control.close()
    step = "private /proc"
    try:
        if early is not None:
            raise early
        _confine(request["confine"], request["cwd"], ahead)
        step = "exec"
        command = spawn(request["program"], request["argv"], request["env"], stdin_fd, out_w, err_w)
    except _Failed as failed:
        _report(report_w, failed.errno, failed.step)
    except BaseException as exc:
        _report(report_w, exc.errno if isinstance(exc, OSError) else None, step)
    # The command holds the streams now; the init must not keep them open.
    for fd in (stdin_fd, out_w, err_w):
        os.close(fd)
    with contextlib.suppress(OSError):
        os.write(report_w, STARTED)
    os.close(report_w)
    reap(command, status_w)


class _Failed(Exception):
    def __init__(self, code: int | None, step: str) -> None:
        self.errno, self.step = code, step


def _report(report_w: int, code: int | None, step: str) -> NoReturn:
    with contextlib.suppress(BaseException):
        os.write(report_w, f"{code or errno.EPERM}:{step}".encode())
    os._exit(127)


def _confine(confine: dict[str, Any] | None, cwd: str, ahead: _Ahead | None) -> None:
    """Hide, move to ``cwd`` and confine this process as ``confine`` says, using what was
    done ahead only where it is exactly what the command needs; :class:`_Failed` says
    which step failed."""
    step = "private /proc"
    if confine is None:  # (an unconfined command in a prepared spare: see the module doc)
        try:
            if ahead is not None and ahead.view:
                mountview.leave()
            os.chdir(cwd)
        except OSError as exc:
            raise _Failed(exc.errno, "cwd") from None
        if ahead is not None:
            os.close(ahead.ruleset)
        return
    network = str(confine.get("seccomp") or "")
    try:
        view = confine.get("view")
        if view:
            step = "view"
            if ahead is None or ahead.view != view:
                if ahead is not None:
                    os.close(ahead.ruleset)
                ahead = None
                mountview.restage(view)  # (a view of its own: staged afresh)
            mountview.apply(confine.get("view_command") or [])
        else:
            hidden = (confine.get("hidden_dirs") or [], confine.get("hidden_files") or [])
            if ahead is None or ahead.hidden != hidden:
                namespaces.hide(*hidden)  # (over what was hidden ahead: more, never less)
        step = "landlock"
        read = confine.get("read") or []
        grants = _grants(confine.get("grants") or [])
        if view:
            grants += mountview.beside(confine.get("beside") or [], view, confine["view_command"])
        if ahead is not None and ahead.read == read:
            ruleset = ahead.ruleset
            landlock.add(ruleset, grants)
        else:
            if ahead is not None:
                os.close(ahead.ruleset)
            ruleset = landlock.create(_filesystem_rules(), [*_grants(read), *grants])
        if view:
            step = "view"
            mountview.finish()
        # After every mount (the proxy's door is an abstract socket, in the host's network
        # namespace: no path, so the view does not hide it), before Landlock (whose
        # abstract-socket scope would refuse the door) and before the capabilities go.
        step = "network namespace"
        netns.join(confine)
        step = "cwd"
        os.chdir(cwd)
        step = "landlock"
        ports = landlock.Ruleset(
            connect_ports=confine.get("connect_ports"), bind_ports=confine.get("bind_ports")
        )
        limited = ports.connect_ports is not None or ports.bind_ports is not None
        ports_layer = -1
        if limited and landlock.abi_version() >= 4:
            ports_layer = landlock.create(ports, filesystem=False)
        if view and commanduser.applies():
            # A root daemon's command runs as nobody, owning only what its view grants.
            step = "command user"
            commanduser.become()
        step = "capabilities"
        capabilities.drop_all()
        step = "landlock"
        landlock.enforce(ruleset)
        if ports_layer >= 0:
            landlock.enforce(ports_layer)
        if network:
            step = "seccomp"
            seccomp.install(network)
    except OSError as exc:
        raise _Failed(exc.errno, step) from None


def spawn(
    program: str, argv: list[str], env: dict[str, str], stdin_fd: int, out_w: int, err_w: int
) -> int:
    """``posix_spawn`` the command with the given streams, in this process's group."""
    return os.posix_spawn(
        program,
        argv,
        env,
        file_actions=[
            (os.POSIX_SPAWN_DUP2, stdin_fd, 0),
            (os.POSIX_SPAWN_DUP2, out_w, 1),
            (os.POSIX_SPAWN_DUP2, err_w, 2),
        ],
        setsigdef=RESET_SIGNALS,
        setsigmask=(),
    )


def reap(command: int, status_w: int) -> NoReturn:
    """Be the namespace's init once the command runs as ``command``; never returns.

    It reaps orphans, and when the command ends it writes how (its exit code, negative for
    a signal) to ``status_w`` and exits, whereupon the kernel kills whatever is left in the
    namespace (background jobs, `setsid` escapees included). It ignores the terminating
    signals the supervisor sends the group; the command, not being an init, gets and obeys
    them.
    """
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1):
        signal.signal(sig, signal.SIG_IGN)
    while True:
        reaped, status = os.waitpid(-1, 0)
        if reaped == command:
            with contextlib.suppress(OSError):  # a supervisor that is gone cannot be told
                os.write(status_w, str(os.waitstatus_to_exitcode(status)).encode())
            os._exit(0)
