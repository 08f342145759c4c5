"""What every confined command may read of a Mac besides its own grants: the system's
directories and files (macOS's counterpart of :data:`endpointd.guard.view.SYSTEM`), each
with the reason it is there, and what stays unreadable even beneath them.

:mod:`endpointd.guard.seatbelt` writes these into the profile of a command whose reads are
listed (``Confinement.reads_listed``). Drawn up after reading the read grants of OpenAI
Codex's restricted-read Seatbelt policy (its "platform defaults") and Chromium's
``common.sb``, but narrower where those grant whole trees of the machine's state
(``/private/var/db``, the whole of ``/Library``): here the system's programs, libraries
and configuration only; no user's data, no other program's state, no key.

Paths are canonical (what the kernel reports: ``/private/etc``, not ``/etc``); the
generator writes their other spellings (``/System/Volumes/Data/...``) itself.

Standard library only: the supervisor imports this in a bare interpreter.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Root:
    path: str
    why: str
    # False: this one file (or device) only; True: everything beneath it too.
    tree: bool = True
    # Beneath ``path``, what this grant leaves out (a later grant may still give it).
    unless: tuple[str, ...] = ()


SYSTEM: tuple[Root, ...] = (
    Root(
        "/System",
        "the OS itself, sealed and read-only: the frameworks and libraries every program"
        " loads, CoreServices' SystemVersion.plist (sw_vers, platform.mac_ver), the"
        " system's certificates and zoneinfo",
        # The data volume and the preboot volume: another spelling of every user's files
        # (/System/Volumes/Data/Users/...) and FileVault's per-user records.
        unless=("/System/Volumes",),
    ),
    Root(
        "/System/Volumes/Preboot/Cryptexes",
        "since macOS 13 the dyld shared cache (every system library, as dyld maps it) and"
        " parts of the OS live in a cryptex mounted here (/System/Cryptexes links to it)",
    ),
    Root(
        "/usr",
        "the base system's programs, libraries, libexec helpers and shared data (man,"
        " terminfo, the /usr/bin shims for git, clang, python3 and make)",
        # Homebrew's services keep their data here on Intel Macs (databases, logs).
        unless=("/usr/local/var",),
    ),
    Root(
        "/usr/local",
        "Homebrew on Intel Macs and other installers' programs (firmlinked to the data"
        " volume, so written apart from /usr to get that spelling too)",
        unless=("/usr/local/var",),
    ),
    Root("/bin", "the shells and the base utilities"),
    Root("/sbin", "base system utilities some scripts call (ping, ifconfig, mount)"),
    Root(
        "/opt",
        "Homebrew on Apple silicon (/opt/homebrew), MacPorts (/opt/local), XQuartz:"
        " installed programs and their configuration (Homebrew's OpenSSL certificates)",
        # Their services' data: databases, caches, logs, sockets.
        unless=("/opt/homebrew/var", "/opt/local/var"),
    ),
    Root(
        "/Applications",
        "installed applications' bundles, programs and resources only (their data lives in"
        " each user's ~/Library): Xcode's SDKs and compilers that xcrun chooses, and the"
        " command-line programs apps ship (code, docker, ...)",
    ),
    Root(
        "/Library/Apple",
        "system frameworks and libraries outside /System since macOS 11 (Rosetta's too)",
    ),
    Root(
        "/Library/Developer",
        "the Command Line Tools: the compilers, git, make and python3 that /usr/bin's shims run",
    ),
    Root("/Library/Frameworks", "framework installs: python.org's Python, R, Mono"),
    Root("/Library/Java", "installed JDKs (/usr/libexec/java_home looks here)"),
    Root("/Library/Fonts", "fonts, for anything that renders text (matplotlib, LaTeX, browsers)"),
    Root(
        "/Library/Preferences",
        "system-wide preferences CoreFoundation reads in process (the locale in"
        " .GlobalPreferences.plist, os_log's configuration in Logging/)",
    ),
    Root("/Library/Perl", "the system Perl's library directories"),
    Root("/Library/Python", "the system Python's site directories"),
    Root("/Library/Ruby", "the system Ruby's gems"),
    Root("/Library/TeX", "MacTeX's links to its distribution"),
    Root(
        "/private/etc",
        "configuration: hosts, paths, shells, passwd and group, ssl/cert.pem, zsh's and"
        " bash's system start-up files (its secrets are taken back: see SECRETS and"
        " view.ETC_SECRETS)",
    ),
    Root(
        "/private/var/db/timezone",
        "the time zone database /etc/localtime points into",
    ),
    Root("/private/var/db/dyld", "the dyld shared cache before macOS 11"),
    Root(
        "/private/var/db/xcode_select_link",
        "which developer directory `xcode-select` chose, that /usr/bin's shims follow",
        tree=False,
    ),
    Root(
        "/private/var/select",
        "macOS 12+: what /bin/sh runs (select/sh) and the developer directory chosen",
    ),
    Root(
        "/private/var/db/DarwinDirectory/local/recordStore.data",
        "the local accounts and groups, which libinfo reads in process on recent releases"
        " (getpwuid: whoami, ssh, git's identity); Codex's restricted profile grants it too."
        " Its permissions keep anything secret in it from a daemon not run as root",
        tree=False,
    ),
    Root(
        "/private/var/run/resolv.conf",
        "/etc/resolv.conf, which resolvers of their own read (Go, c-ares in Node, dig)",
        tree=False,
    ),
    # Devices: these only (the disks, other terminals and the rest of /dev are not read).
    Root("/dev/null", "the null device", tree=False),
    Root("/dev/zero", "zeros", tree=False),
    Root("/dev/random", "randomness", tree=False),
    Root("/dev/urandom", "randomness", tree=False),
    Root("/dev/tty", "the controlling terminal (endpointd gives commands none)", tree=False),
    Root("/dev/stdin", "links into /dev/fd", tree=False),
    Root("/dev/stdout", "links into /dev/fd", tree=False),
    Root("/dev/stderr", "links into /dev/fd", tree=False),
    Root("/dev/fd", "the command's own open descriptors"),
    Root(
        "/dev/dtracehelper",
        "dyld and runtimes (Node, Python, the JVM) register their DTrace probes through it",
        tree=False,
    ),
    Root(
        "/dev/autofs_nowait",
        "libc opens it to walk paths without triggering automounts (getcwd, fts)",
        tree=False,
    ),
)

# Stat only (no content, no listing): the symbolic links the kernel follows to /private
# (resolving /tmp/x or /etc/hosts reads the link), and device nodes, which tools stat to
# tell a terminal or a pipe (test -t, tty).
METADATA_LITERALS = ("/tmp", "/var", "/etc")  # noqa: S108 (names in a profile)
METADATA_TREES = ("/dev",)

# Unreadable even beneath a grant above, or one the owner makes: the machine's secrets.
SECRETS = (
    "/private/etc/master.passwd",  # the accounts' password hashes (the old format)
    "/private/etc/kcpassword",  # automatic login's password, merely obfuscated
    "/private/etc/racoon",  # VPN pre-shared keys (psk.txt)
    "/Library/Keychains",  # the System keychain (Wi-Fi, VPN, 802.1X secrets)
    "/private/var/db/SystemKey",  # the key that opens it
)
# Beneath each home directory, unreadable even where the owner grants ~/Library.
HOME_SECRETS = (
    "Library/Keychains",  # the login keychain
    "Library/Cookies",  # Safari's and CFNetwork's cookies (sessions)
    "Library/HTTPStorages",  # the same for each app using URLSession
)
