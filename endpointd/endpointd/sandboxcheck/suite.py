"""The escape-probe suite of `endpointd sandbox check`: each class, its probes, its fix.

This table is the one place that says what the check tries. A class is judged
``contained`` when none of its probes succeeded inside the sandbox, ``escaped`` when one
did. Each probe names an *action* the confined probe program performs
(:mod:`endpointd.sandboxcheck.program`) and a *target* the check plants first
(:mod:`endpointd.sandboxcheck.scene`): its own canary files, sockets, listeners, a pty and
a scratch checkout with two ticket worktrees. No probe ever touches anything of the
owner's but the names the scene made for it.

Actions (what "succeeded" means):

* ``read``: opened the target and read the canary's token;
* ``append``: opened an existing file for writing (nothing is written);
* ``create``: made a new file (the probe deletes it at once; the check again after);
* ``unix`` / ``tcp``: a connection to a listener the check started was accepted;
* ``udp``: a datagram to a listener the check started was sent (not refused);
* ``signal``: signal 0 reached a process outside the sandbox;
* ``tty``: opened a terminal (a pty the check opened, standing for one of the owner's);
* ``caps``: the command holds an effective capability;
* ``uid``: the command runs as root (any of its user ids is 0);
* ``nnp``: ``no_new_privs`` is not set, so a setuid program could raise its privileges;
* ``mknod``: made a device node in its workspace.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Probe:
    what: str  # shown to the owner: what the probe tried
    action: str  # see the module doc
    target: str = ""  # a key into the scene's targets; "" for actions without one


@dataclass(frozen=True)
class ProbeClass:
    name: str
    about: str  # one line: what an escape here would let a command do
    fix: str  # what closes it: the policy key, or the kernel or endpointd feature it needs
    probes: tuple[Probe, ...]


SUITE: tuple[ProbeClass, ...] = (
    ProbeClass(
        "persistence",
        "plant code that runs later outside the sandbox",
        "commands may write only their own workspace: take start-up, autostart and checkout"
        " directories out of writable_paths and allowed_roots (prefer a root such as ~/src"
        ' to ~), and keep sandbox = "required" on a kernel with Landlock',
        (
            Probe("append to a shell start-up file (~/.bashrc)", "append", "bashrc"),
            Probe("create a file in the home directory (~/.bash_login)", "create", "home_new"),
            Probe("create an autostart entry (~/.config/autostart)", "create", "autostart"),
            Probe("create a git hook in the owner's checkout", "create", "checkout_hook"),
            Probe("append to the owner's checkout's .git/config", "append", "checkout_config"),
            Probe("create .envrc in the owner's checkout", "create", "checkout_envrc"),
            Probe("create a systemd user unit", "create", "systemd_unit"),
            Probe("create a program in ~/.local/bin (on PATH)", "create", "local_bin"),
            Probe("create a Claude Code shell snapshot (sourced by it)", "create", "harness_store"),
        ),
    ),
    ProbeClass(
        "sockets",
        "talk to a local service (an agent, a database, a container engine) outside the grants",
        "a command reaches a pathname Unix socket only where its view holds it (its"
        " workspace, writable_paths, readable_paths, the toolchain directories): keep agent"
        ' and service sockets out of those, and keep sandbox = "required" on a kernel with'
        " user namespaces (without them there is no view, and Landlock cannot refuse a"
        " connect() to a named socket)",
        (
            Probe("connect to a socket in the home directory", "unix", "home_socket"),
            Probe("connect to a socket in /tmp", "unix", "tmp_socket"),
            Probe("connect to an ssh-agent socket (/tmp/ssh-*/agent.*)", "unix", "agent_socket"),
            Probe("connect to a socket in the runtime dir (/run/user/UID)", "unix", "run_socket"),
            Probe(
                "connect to a socket in the control plane's state directory",
                "unix",
                "controlplane_socket",
            ),
            Probe("connect to a socket beneath a denied path (~/.gnupg)", "unix", "denied_socket"),
            Probe("connect to an abstract Unix socket", "unix", "abstract_socket"),
        ),
    ),
    ProbeClass(
        "egress",
        "reach the network beyond the policy's network mode",
        'network = "deny" and "proxy" need the kernel to hold them: Landlock ABI 4 or'
        " later with seccomp (a network namespace once endpointd has one); with"
        ' network = "proxy" only endpointd\'s proxy may be reachable, at any address',
        (
            Probe("TCP to a listener on loopback", "tcp", "loopback"),
            Probe("TCP to a listener on IPv6 loopback", "tcp", "loopback6"),
            Probe("UDP to a listener on loopback", "udp", "udp"),
            Probe("TCP to this machine's non-loopback address", "tcp", "outside"),
            Probe("TCP to another address on the proxy's port", "tcp", "proxy_port"),
            Probe("TCP to IPv6 loopback on the proxy's port", "tcp", "proxy_port6"),
        ),
    ),
    ProbeClass(
        "reads",
        "read credentials and the daemon's or the control plane's state",
        "take the location out of readable_paths, writable_paths and allowed_roots, or add it"
        ' to denied_paths in policy.toml; keep sandbox = "required" on a kernel with'
        " Landlock and user namespaces (the view shows of the home directory only what"
        " readable_paths grants)",
        (
            Probe("read a file in ~/.ssh", "read", "ssh"),
            Probe("read a file in ~/.aws", "read", "aws"),
            Probe("read a file in ~/.config/gh", "read", "gh"),
            Probe("read a file in ~/.config/github-copilot", "read", "copilot"),
            Probe("read a file in ~/.cargo", "read", "cargo"),
            Probe("read ~/.npmrc (planted only where there is none)", "read", "npmrc"),
            Probe("read a dotfile in the home directory (like ~/.npmrc)", "read", "dotfile"),
            Probe("read the control plane's state directory", "read", "controlplane"),
            Probe("read endpointd's state directory", "read", "endpointd_state"),
            Probe("read endpointd's config directory", "read", "endpointd_config"),
        ),
    ),
    ProbeClass(
        "cross-workspace",
        "read or change another ticket's work, or the owner's terminal",
        "other tickets' workspaces and the owner's terminals are out of a ticket's view, and"
        " only the ticket's own branch folder (superagent/<ticket>/) of its clone is"
        ' writable: keep sandbox = "required" on a kernel with Landlock and user namespaces',
        (
            Probe("read another ticket's workspace", "read", "other_file"),
            Probe("create a file in another ticket's workspace", "create", "other_new"),
            Probe("move another ticket's branch", "append", "other_ref"),
            Probe("plant a branch beside the ticket's own folder", "create", "planted_ref"),
            Probe("move the owner's branch (main)", "append", "owner_ref"),
            Probe("open a terminal of the owner's (/dev/pts)", "tty", "pty"),
        ),
    ),
    ProbeClass(
        "processes",
        "see, signal or read the environment of a process outside the sandbox",
        "needs the sandbox's private PID namespace and /proc (user namespaces) and Landlock"
        ' ABI 6 signal scoping: keep sandbox = "required" on such a kernel',
        (
            Probe("signal a process of the owner's (signal 0)", "signal", "process"),
            Probe("read a process's environment (/proc/PID/environ)", "read", "environ"),
        ),
    ),
    ProbeClass(
        "privileges",
        "hold capabilities or root's identity, or gain them through a setuid program",
        'keep sandbox = "required" on a kernel with Landlock, user namespaces and id-mapped'
        " mounts (a root daemon's commands then run as nobody, without capabilities, and it"
        " sets no_new_privs); better, run endpointd as your own user",
        (
            Probe("hold an effective capability", "caps", "proc_status"),
            Probe("run as root (uid 0), which owns most of the machine", "uid", "proc_status"),
            Probe("gain privileges through setuid (no_new_privs unset)", "nnp", "proc_status"),
            Probe("make a device node in the workspace", "mknod", "mknod"),
        ),
    ),
)

CLASS_NAMES = tuple(c.name for c in SUITE)
