"""Seatbelt, macOS's sandbox: a :class:`Confinement` as an SBPL profile for ``sandbox-exec``.

On macOS the supervisor runs each command as ``/usr/bin/sandbox-exec -p PROFILE -- argv``
(:func:`argv`); the kernel's Sandbox extension then enforces :func:`profile` on the command
and everything it starts, and nothing the command does can loosen it. ``sandbox-exec`` is
taken from ``/usr/bin`` only: one found on ``PATH`` could be anything.

The profile is written in SBPL, Apple's Scheme-like profile language. Its rules that matter
here:

* ``(deny default)`` first: an operation no rule allows is refused;
* when several rules match one operation, the **last** one wins; so every allowance comes
  first and the denials for ``denied`` and ``protected`` paths close the profile, where no
  later rule can reopen them (but for the Unix sockets of a writable root nested in a
  denied path, see :func:`_last_word`);
* a path filter matches the path the kernel resolved (symbolic links followed): the caller
  passes canonical paths (``os.path.realpath``), and each is written in every spelling the
  kernel may use (see :func:`_spellings`);
* ``(subpath P)`` matches ``P`` itself and everything beneath it; since whether a denied
  path is a file or a directory cannot be known without a ``stat`` at generation time,
  every path rule uses ``subpath`` except the ``write_files`` (single device files).

Paths are written inline as SBPL string literals, escaped (:func:`_string`), so the profile
is self-contained and can be logged and replayed as is (``sandbox-exec -D NAME=VALUE``
parameters would avoid the escaping but split the policy across argv). A path SBPL cannot
carry faithfully (a control character) or that is not absolute and normalised raises
:class:`ValueError`: a rule that silently matches nothing would leave a denied path open.

Reads are an allow-list when the confinement's are listed (``reads_listed``, which
:func:`endpointd.guard.sandbox.plan` sets on macOS): the system's directories
(:mod:`endpointd.guard.macos_reads`), the command's grants (``read``, ``read_extra``), its
writable roots, and a stat of each directory on the way to them; the home directory is
unreadable but for the owner's grants, and ``never`` (credentials, histories, the control
plane's state) is denied with ``denied`` in the last word, so no grant reopens it. Without
a list (older callers) it reads everything except ``denied``.

Written after reading the profiles of OpenAI's Codex CLI, Anthropic's sandbox-runtime and
Chromium (whose ``common.sb`` both derive from); each allowance below says why it exists.
This module only generates text: it runs on any OS, and is exercised on Linux CI by
``tests/endpointd/guard/test_seatbelt.py``; whether macOS enforces it as intended can only be
checked on a Mac.

Standard library only: the supervisor imports this in a bare interpreter.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Sequence

from endpointd.guard import macos_reads
from endpointd.guard.confinement import Confinement

SANDBOX_EXEC = "/usr/bin/sandbox-exec"

# /tmp, /var and /etc are symbolic links into /private, which is what the kernel reports.
_PRIVATE = "/private"
_PRIVATE_ALIASES = ("/tmp", "/var", "/etc")  # noqa: S108 (names, not files we use)
# Since Catalina the writable data volume is mounted at /System/Volumes/Data and "firmlinked"
# into the read-only system volume at these points; a file there has two spellings.
_DATA_VOLUME = "/System/Volumes/Data"
_FIRMLINKED = ("/Users", "/private", "/opt", "/usr/local", "/Applications", "/Library", "/Volumes")

# getaddrinfo() asks mDNSResponder over this Unix socket: DNS resolution for the sandbox.
_DNS_SOCKET = "/private/var/run/mDNSResponder"

# sysctl names a command may read. Hardware and OS identification, limits, and a process's
# own kinfo_proc (kern.proc.pid.N: name, parent, state; no arguments, no environment).
# Deliberately absent: kern.procargs2 (another process's argv and environment) and
# kern.proc.all (the list of every process).
_SYSCTL_NAMES = (
    "kern.argmax",  # how much argv + environment exec accepts (xargs, shells, build tools)
    "kern.boottime",  # uptime
    "kern.hostname",
    "kern.maxfiles",
    "kern.maxfilesperproc",  # how many descriptors to use (ulimit, node, java)
    "kern.maxproc",
    "kern.ngroups",
    "kern.osproductversion",  # uname, platform.mac_ver(), toolchains choosing an SDK
    "kern.osrelease",
    "kern.ostype",
    "kern.osvariant_status",
    "kern.osversion",
    "kern.secure_kernel",
    "kern.usrstack64",
    "kern.version",
    "sysctl.proc_cputype",  # the architecture this process runs as
    "sysctl.proc_translated",  # under Rosetta? (installers, Homebrew, node, rustup)
    "vm.loadavg",  # load average (uptime, make -l, parallel test runners)
)
_SYSCTL_PREFIXES = (
    "hw.",  # CPU count and features, memory size, page size, cache sizes
    "machdep.cpu.",  # CPU brand and features (compilers tuning for the host)
    "machdep.ptrauth_enabled",  # arm64e pointer authentication (runtimes and JITs)
    "kern.proc.pid.",  # a process's kinfo_proc: getppid-like checks, debugger detection
    "kern.proc.pgrp.",  # the members of a process group (shells' job control)
    "net.routetable.",  # getifaddrs(): the machine's interfaces and addresses
)

# Mach services every command may look up (the bootstrap namespace is otherwise closed, so
# no pasteboard, keychain (securityd), launchd job creation, AppleEvents, Finder, ...).
_MACH_SERVICES = (
    "com.apple.system.opendirectoryd.libinfo",  # getpwuid/getgrgid: whoami, ~ expansion, ssh
    "com.apple.system.opendirectoryd.membership",  # group membership (access checks)
    "com.apple.bsd.dirhelper",  # the per-user temporary and cache directories (confstr)
    "com.apple.system.notification_center",  # notify(3): libSystem's change notifications
    "com.apple.cfprefsd.daemon",  # CoreFoundation preferences, read only: see
    "com.apple.cfprefsd.agent",  # user-preference-read below (cfprefsd checks writes)
    "com.apple.logd",  # os_log, which system libraries use for their own messages
    "com.apple.system.logger",  # asl, the older logging API
)
# TLS certificate evaluation through Security.framework (Go, Swift, Apple's curl and git).
# Only when the command may reach the network: trustd itself fetches intermediates and
# revocation data, so with network "deny" it would be a way out.
_TRUST_SERVICES = ("com.apple.trustd", "com.apple.trustd.agent")
# Network configuration and DNS settings, for network "allow" only.
_NETWORK_SERVICES = (
    "com.apple.SystemConfiguration.configd",
    "com.apple.SystemConfiguration.DNSConfiguration",
    "com.apple.networkd",
)


def profile(c: Confinement) -> str:
    """The SBPL profile that confines one command as ``c`` says.

    Raises :class:`ValueError` for a path that is not absolute and normalised or that holds
    a control character, for an unknown network mode, and for network ``"proxy"`` without a
    valid port.
    """
    hidden = [*c.denied]
    if c.reads_listed:
        # What stays unreadable beneath a grant: the masked credentials, histories and
        # the control plane's state (c.never, which holds c.denied), the Mac's secrets.
        home_secrets = [f"{h}/{s}" for h in c.homes for s in macos_reads.HOME_SECRETS]
        hidden += [*c.never, *macos_reads.SECRETS, *home_secrets]
    denied = _flat(_spellings(p) for p in hidden)
    protected = _flat(_spellings(p) for p in c.protected)
    write = _flat(_spellings(p) for p in c.write)
    write_files = _flat(_spellings(p) for p in c.write_files)
    network = _network(c, write)
    system, granted = _readable(c, write, write_files)
    reads = (
        _listed_reads(c, system, granted, write, write_files) if c.reads_listed else _all_reads()
    )
    # What the reads above cover beyond single files: a path taken back beneath one of
    # these must be refused in any letter case too (see _anycase).
    covered = _covered(c, write) if c.reads_listed else []

    out = [
        "(version 1)",
        "; Generated by endpointd (endpointd.guard.seatbelt) for one command.",
        "; In SBPL the LAST matching rule wins: allowances come first, and the denials",
        "; for denied and protected paths close the profile so nothing can reopen them.",
        "(deny default)",
        "",
        "; Processes. Children inherit this sandbox, so the command may start anything",
        "; it may read (with listed reads: no program hidden in the home directory);",
        "; it may signal and inspect only processes in this same sandbox (its own tree),",
        "; never the daemon, the supervisor or other commands (whose arguments and",
        "; environment therefore stay out of reach).",
        "(allow process-fork)",
        *(
            _allow(["process-exec"], [*system, *granted])
            if c.reads_listed
            else ["(allow process-exec)"]
        ),
        "(allow signal (target same-sandbox))",
        "(allow process-info* (target same-sandbox))",
        "",
        "; System information ordinary programs ask for (see _SYSCTL_NAMES).",
        _rule(
            "allow",
            ["sysctl-read"],
            [f"(sysctl-name {_string(n)})" for n in _SYSCTL_NAMES]
            + [f"(sysctl-name-prefix {_string(p)})" for p in _SYSCTL_PREFIXES],
        ),
        "; The JVM reads the CPU type through a sysctl the kernel counts as a write.",
        '(allow sysctl-write (sysctl-name "kern.grade_cputype"))',
        "; host_processor_info() and host_statistics(): CPU list and load (Node's os.cpus(),",
        "; which build tools use to size their worker pools).",
        "(allow mach-host*)",
        "",
        "; Mach services (see _MACH_SERVICES): lookups of anything else fail.",
        _rule("allow", ["mach-lookup"], _global_names(*_MACH_SERVICES)),
        '(allow mach-lookup (local-name "com.apple.cfprefsd.agent"))',
        "; Reading preferences only: cfprefsd refuses writes to a sandbox without",
        "; user-preference-write, so `defaults write` cannot plant settings elsewhere.",
        "(allow user-preference-read)",
        "; POSIX semaphores and shared memory: Python's multiprocessing and",
        "; shared_memory, OpenMP runtimes, and CoreFoundation's preferences cache.",
        "(allow ipc-posix-sem)",
        "(allow ipc-posix-shm)",
        "",
        "; Terminals. ioctl on the terminal the command was given (isatty, window size,",
        "; raw mode) and new pseudo-terminals of its own (script, expect, pty tests).",
        "(allow pseudo-tty)",
        _rule(
            "allow",
            ["file-ioctl"],
            ['(literal "/dev/tty")', '(literal "/dev/ptmx")', '(regex #"^/dev/ttys[0-9]+$")'],
        ),
        "",
        *reads,
        "; Terminals other than those the command opens itself (whatever the reads above):",
        "; a same-user process may otherwise open the owner's",
        "; Terminal windows and read their keystrokes. Terminals the command opens itself",
        "; (through /dev/ptmx) carry the com.apple.sandbox.pty extension and stay usable;",
        "; endpointd gives commands no terminal of their own to reopen.",
        '(deny file-read* file-write* (regex #"^/dev/ttys[0-9]+$"))',
        _rule(
            "allow",
            ["file-read*", "file-write*"],
            [
                '(require-all (regex #"^/dev/ttys[0-9]+$") (extension "com.apple.sandbox.pty"))',
            ],
        ),
        '(allow file-read* file-write* (literal "/dev/ptmx"))',
        "",
        "; Files: write only beneath the writable roots and to the listed files.",
    ]
    if write:
        out.append(_rule("allow", ["file-write*"], _filters("subpath", write)))
    if write_files:
        out.append(_rule("allow", ["file-write*"], _filters("literal", write_files)))
    out += [
        "; The devices every program writes to, whatever write_files says.",
        _rule(
            "allow",
            ["file-write-data"],
            [
                '(literal "/dev/null")',
                '(literal "/dev/zero")',
                '(literal "/dev/tty")',
                '(subpath "/dev/fd")',
            ],
        ),
        "; No hard links at all. A link checks the path it is made from or the one it makes",
        "; (Apple does not say which), and either way a writable root could gain a second",
        "; name for a denied or protected file, writable or readable through it. Tools that",
        "; link (git, cargo, uv, cp -l) fall back to copying or renaming.",
        "(deny file-link)",
        "",
        *network,
        "",
        *_last_word(denied, protected, write, write_files, covered),
    ]
    read_files = _flat(_spellings(p) for p in c.read_files)
    if read_files:
        # After the last word, for reading only: a harness run's own login files.
        out += [
            "; Readable though denied, and only readable: this harness run's login files.",
            _rule("allow", ["file-read*"], _filters("literal", read_files)),
        ]
    return "\n".join(out) + "\n"


def _all_reads() -> list[str]:
    """Reads without a list (older callers): everything, less what the last word denies."""
    return [
        "; Files: read everything (denied paths are taken back at the end).",
        "(allow file-read*)",
    ]


def _readable(
    c: Confinement, write: Sequence[str], write_files: Sequence[str]
) -> tuple[list[str], list[str]]:
    """The filters of listed reads: the system's (:mod:`endpointd.guard.macos_reads`), and
    the command's grants with its writable roots and files."""
    system: list[str] = []
    for root in macos_reads.SYSTEM:
        for spelling in _spellings(root.path):
            if not root.tree:
                system.append(f"(literal {_string(spelling)})")
            elif not root.unless:
                system.append(f"(subpath {_string(spelling)})")
            else:
                nots = " ".join(
                    f"(require-not {_anycase(u)})" for out in root.unless for u in _spellings(out)
                )
                system.append(f"(require-all (subpath {_string(spelling)}) {nots})")
    granted = _flat(_spellings(p) for p in (*c.read, *c.read_extra))
    grants = _filters("subpath", _unique([*granted, *write])) + _filters("literal", write_files)
    return system, grants


def _listed_reads(
    c: Confinement,
    system: Sequence[str],
    grants: Sequence[str],
    write: Sequence[str],
    write_files: Sequence[str],
) -> list[str]:
    """Reads as an allow-list: the system's, the command's grants and writable roots
    (:func:`_readable`); the directories on the way to them stat-able."""
    granted = _flat(_spellings(p) for p in (*c.read, *c.read_extra))
    homes = _flat(_spellings(h) for h in c.homes)
    read_files = _flat(_spellings(p) for p in c.read_files)
    roots = [p for r in macos_reads.SYSTEM for p in _spellings(r.path)]
    ways = _unique(
        [*_ancestors([*roots, *granted, *write, *write_files, *read_files, *homes]), *homes]
    )
    links = _flat(_spellings(p) for p in macos_reads.METADATA_LITERALS)
    return [
        "; Files: read only what is listed, as in the Linux view: the system's programs,",
        "; libraries and configuration, this command's grants, its writable roots. The",
        "; home directory is therefore unreadable but for what the owner grants.",
        "; The root directory itself: dyld opens it, and getcwd() and realpath() start",
        "; there (a listing shows the names in / only).",
        '(allow file-read* (literal "/"))',
        "; The system's (endpointd.guard.macos_reads says why each is here).",
        *_allow(["file-read*"], system),
        "; This command's grants: toolchains and what the owner lists (readable_paths),",
        "; its clone's git directory, and where it may write.",
        *_allow(["file-read*"], grants),
        "; Stat, without reading or listing, each directory on the way to a grant and the",
        "; home directory: realpath(), git's repository discovery and `cd` lstat every",
        "; component and fail on a refusal. Their names are known already; nothing beside",
        "; them is revealed, and a directory inside a denied path stays denied (below).",
        *_allow(["file-read-metadata"], _filters("literal", ways)),
        "; Stat the links into /private (resolving /tmp/x reads the link /tmp) and device",
        "; nodes (test -t, tty): no content.",
        *_allow(
            ["file-read-metadata"],
            _filters("literal", links) + _filters("subpath", macos_reads.METADATA_TREES),
        ),
    ]


Covered = Sequence[tuple[str, Sequence[str]]]


def _covered(c: Confinement, write: Sequence[str]) -> Covered:
    """The directories listed reads cover (all spellings), each with what it leaves out:
    the system's, the grants and the writable roots."""
    out = [
        (p, _flat(_spellings(u) for u in r.unless))
        for r in macos_reads.SYSTEM
        if r.tree
        for p in _spellings(r.path)
    ]
    granted = _flat(_spellings(p) for p in (*c.read, *c.read_extra))
    return [*out, *((p, ()) for p in _unique([*granted, *write]))]


def _inside(path: str, covered: Covered) -> bool:
    return any(
        _within(path, root) and not any(_within(path, u) for u in unless)
        for root, unless in covered
    )


def _anycase(path: str, tree: bool = True) -> str:
    """A regex filter matching ``path`` (and, with ``tree``, what lies beneath it) in any
    letter case. APFS and HFS+ are case-insensitive by default, so ~/.cargo/CREDENTIALS.toml
    opens ~/.cargo/credentials.toml, and a rule written in one case is not known to match
    the path as the command spelled it. Grants are written as given (a variant of one is
    refused: safe); what is taken out of a grant is written in every case with this. Any
    character but a letter, a digit, ``/``, ``_`` and ``-`` is matched by ``.`` (no
    escaping to get wrong; matching more only refuses more), a run of non-ASCII ones by
    ``[^/]*`` (which also covers their other Unicode normalisations). The two letters
    outside ASCII that Unicode case folding turns into ASCII ones are matched too: the
    Kelvin sign for k and the long s for s (an alternation, not a bracket: a byte-wise
    matcher would take a bracketed multi-byte letter apart)."""
    out: list[str] = []
    for ch in path:
        if ch.isascii() and ch.isalpha():
            low = ch.lower()
            out.append(
                f"({ch.upper()}|{low}|{_FOLDS[low]})" if low in _FOLDS else f"[{ch.upper()}{low}]"
            )
        elif ch.isascii() and (ch.isdigit() or ch in "/_-"):
            out.append(ch)
        elif ch.isascii():
            out.append(".")
        elif not out or out[-1] != "[^/]*":
            out.append("[^/]*")
    end = "(/|$)" if tree else "$"
    return f'(regex #"^{"".join(out)}{end}")'


# Letters outside ASCII that case-insensitive APFS folds to an ASCII one (CaseFolding.txt).
_FOLDS = {"k": "\u212a", "s": "\u017f"}


def _allow(operations: Sequence[str], filters: Sequence[str]) -> list[str]:
    """An allowance for ``filters``, or none at all: a rule without a filter allows all."""
    return [_rule("allow", operations, filters)] if filters else []


def _last_word(
    denied: Sequence[str],
    protected: Sequence[str],
    write: Sequence[str],
    files: Sequence[str],
    covered: Covered = (),
) -> list[str]:
    """The closing denials for denied and protected paths (all spellings already); those
    inside a directory ``covered`` by the reads, and every protected path (always inside
    a writable root), also in any letter case (:func:`_anycase`)."""
    out = [
        "; The last word: denied paths are neither readable nor writable, protected paths",
        "; are not writable, and no Unix socket beneath either may be bound (nor reached,",
        "; beneath a denied path: denying ~/.docker closes Docker's socket too). A writable",
        "; root inside a denied path stays usable, as with Landlock: that is the command's",
        "; own TMPDIR, which lives in endpointd's (denied) state directory.",
    ]
    if denied:
        out.append(_rule("deny", ["file-read*", "file-write*"], _carved(denied, write, covered)))
    if protected:
        anycase = [_anycase(p) for p in protected]
        out.append(_rule("deny", ["file-write*"], _filters("subpath", protected) + anycase))
    if denied or protected:
        out.append(_rule("deny", ["network-bind"], _sockets("local", [*denied, *protected])))
    if denied:
        out.append(_rule("deny", ["network-outbound"], _sockets("remote", denied)))
    # Socket filters hold one path each, so the carve-out is by order instead: reopen the
    # nested writable roots, then close again what is denied or protected inside them.
    nested = [w for w in write if any(w != d and _within(w, d) for d in denied)]
    if nested:
        out.append(_rule("allow", ["network-bind"], _sockets("local", nested)))
        out.append(_rule("allow", ["network-outbound"], _sockets("remote", nested)))
        inner_denied = [d for d in denied if any(d != w and _within(d, w) for w in nested)]
        inner = [*inner_denied, *(p for p in protected if any(_within(p, w) for w in nested))]
        if inner:
            out.append(_rule("deny", ["network-bind"], _sockets("local", inner)))
        if inner_denied:
            out.append(_rule("deny", ["network-outbound"], _sockets("remote", inner_denied)))
    # Only a directory the command may write can be renamed: the others need no rule.
    ancestors = [
        a for a in _ancestors([*denied, *protected]) if any(_within(a, w) for w in (*write, *files))
    ]
    if ancestors:
        out += [
            "; Nor may a writable directory above one be removed or renamed (a rename is",
            "; checked as an unlink of its source): moving it away would leave the path",
            "; without its rules, and moving it back would bring in what was written meanwhile.",
            _rule(
                "deny",
                ["file-write-unlink"],
                _filters("literal", ancestors) + [_anycase(a, tree=False) for a in ancestors],
            ),
        ]
    return out


def _carved(denied: Sequence[str], write: Sequence[str], covered: Covered = ()) -> list[str]:
    """Filters for beneath ``denied``, less the writable roots strictly inside them; in
    any letter case too for those inside a ``covered`` directory."""
    out = []
    for d in denied:
        matches = [f"(subpath {_string(d)})"]
        if _inside(d, covered):
            matches.append(_anycase(d))
        inside = [w for w in write if w != d and _within(w, d)]
        if not inside:
            out += matches
            continue
        nots = " ".join(f"(require-not (subpath {_string(w)}))" for w in inside)
        out += [f"(require-all {m} {nots})" for m in matches]
    return out


def argv(c: Confinement, command_argv: Sequence[str]) -> list[str]:
    """The argv that runs ``command_argv`` under :func:`profile` of ``c``."""
    if not command_argv:
        raise ValueError("no command to run under sandbox-exec")
    return [SANDBOX_EXEC, "-p", profile(c), "--", *command_argv]


def _network(c: Confinement, write: Sequence[str]) -> list[str]:
    """The network section of the profile."""
    if c.network not in ("allow", "deny", "proxy"):
        raise ValueError(f"unknown network mode {c.network!r}")
    if c.network == "proxy":
        port = c.proxy_port
        if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
            raise ValueError(f'network "proxy" needs the proxy\'s TCP port, not {port!r}')
    # A Unix socket bound is a new file: only where the command may write, in every mode.
    bind = [_rule("allow", ["network-bind"], _sockets("local", write))] if write else []
    if c.network == "allow":
        return [
            "; Network: anything (TCP, UDP, listening, Unix sockets), with the services",
            "; resolving names and verifying certificates need; but a Unix socket, being a",
            "; new file, may be bound only where the command may write.",
            "(allow network*)",
            "(allow system-socket)",
            _rule("allow", ["mach-lookup"], _global_names(*_NETWORK_SERVICES, *_TRUST_SERVICES)),
            "(deny network-bind (local unix-socket))",
            *bind,
        ]
    out = [
        "; Network: no IP at all, but local Unix sockets, as on Linux: the git credential",
        "; helper's socket, ssh-agent and other local services the owner runs. New sockets",
        "; may be bound only where the command may write.",
        "(allow system-socket (socket-domain AF_UNIX))",
        "(allow network-outbound (remote unix-socket))",
        *bind,
        "; Except DNS: with no network of its own the command has nothing to resolve (the",
        "; egress proxy, addressed as 127.0.0.1, resolves the names it is asked for), and a",
        "; lookup of a name of the command's choosing would carry data out through the",
        "; resolver.",
        _rule("deny", ["network-outbound"], _sockets("remote", _spellings(_DNS_SOCKET))),
    ]
    if c.network == "proxy":
        out += [
            "; Proxy: TCP to endpointd's egress proxy on loopback, which enforces the host",
            "; list; TLS clients built on Security.framework verify certificates through",
            "; trustd (which may itself fetch intermediates and revocation data).",
            f'(allow network-outbound (remote tcp "localhost:{c.proxy_port}"))',
            _rule("allow", ["mach-lookup"], _global_names(*_TRUST_SERVICES)),
        ]
    return out


def _global_names(*services: str) -> list[str]:
    return [f"(global-name {_string(s)})" for s in services]


def _rule(action: str, operations: Sequence[str], filters: Sequence[str]) -> str:
    """``(action op... filter...)``: the filters are alternatives (any one matches)."""
    head = f"({action} {' '.join(operations)}"
    if len(filters) <= 1:
        return f"{head}{''.join(' ' + f for f in filters)})"
    return head + "".join(f"\n  {f}" for f in filters) + ")"


def _filters(kind: str, paths: Iterable[str]) -> list[str]:
    return [f"({kind} {_string(p)})" for p in paths]


def _sockets(end: str, paths: Iterable[str]) -> list[str]:
    """Filters for the Unix sockets at or beneath ``paths`` (``end``: local or remote)."""
    return [f"({end} unix-socket {f})" for f in _filters("subpath", paths)]


def _flat(groups: Iterable[Sequence[str]]) -> list[str]:
    return _unique(p for group in groups for p in group)


def _unique(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))


def _string(text: str) -> str:
    """``text`` as an SBPL string literal."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _checked(path: str) -> str:
    """``path`` if SBPL can carry it and it names one place; trailing slashes dropped."""
    if not isinstance(path, str):
        raise ValueError(f"sandbox path must be a string, not {path!r}")
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in path):
        # NUL would end the string early, a newline or other control character is not
        # something the SBPL reader is documented to keep as is: refuse rather than guess.
        raise ValueError(f"sandbox path {path!r} contains a control character")
    if not path.startswith("/"):
        raise ValueError(f"sandbox path {path!r} is not absolute")
    trimmed = path.rstrip("/") or "/"
    if posixpath.normpath(trimmed) != trimmed or trimmed.startswith("//"):
        raise ValueError(f"sandbox path {path!r} is not normalised (canonicalise it first)")
    return trimmed


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _spellings(path: str) -> list[str]:
    """Every way the kernel may spell ``path``, the given one first.

    ``/tmp``, ``/var`` and ``/etc`` are symbolic links to their ``/private`` counterparts,
    which are what the kernel reports (so a rule on ``/tmp/x`` alone would match nothing):
    both spellings are written, whichever was given. And the firmlinked directories (user
    homes, ``/private``, ``/opt``, ...) are also reachable through ``/System/Volumes/Data``;
    a rule for one spelling is not known to cover the other, so both are written too.
    Extra spellings name the same files, so they never widen what a rule grants.
    """
    given = _checked(path)
    base = given
    if _within(given, _DATA_VOLUME):
        rest = given[len(_DATA_VOLUME) :]
        if any(_within(rest, f) for f in _FIRMLINKED):
            base = rest
    short = private = None
    for alias in _PRIVATE_ALIASES:
        if _within(base, alias):
            short, private = base, _PRIVATE + base
        elif _within(base, _PRIVATE + alias):
            short, private = base[len(_PRIVATE) :], base
    forms = [given, base]
    if short is not None and private is not None:
        forms += [short, private]
    forms += [_DATA_VOLUME + f for f in forms if any(_within(f, d) for d in _FIRMLINKED)]
    return _unique(forms)


def _ancestors(paths: Iterable[str]) -> list[str]:
    """The directories above ``paths`` (not ``/``), nearest first, without repeats."""
    out: list[str] = []
    for path in paths:
        parent = posixpath.dirname(path)
        while parent != "/":
            out.append(parent)
            parent = posixpath.dirname(parent)
    return _unique(out)
