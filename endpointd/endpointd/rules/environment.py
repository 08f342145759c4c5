"""The environment a command starts with: minimal, and nothing in it steers how it starts.

A command never inherits the daemon's environment (under a login shell's unit that holds
``AWS_SECRET_ACCESS_KEY`` and friends): it starts from :data:`BASE` taken from the daemon's
environment, plus the names the owner passes (``[env] pass``), plus the command's own
``exec.env``, plus its TMPDIR and delivered credentials.

``exec.env`` comes from the control plane, so names that change what a program loads or
runs (the dynamic loader's ``LD_*``/``DYLD_*``, ``PATH``, the shells' ``BASH_ENV``/``ENV``,
git's ``GIT_*`` which includes ``GIT_CONFIG_*`` and so ``core.fsmonitor``, interpreters'
``PYTHON*``/``NODE_OPTIONS``/``PERL5*``/``RUBY*``, …) are refused unless the owner allows
them by name (``[env] allow``). The same list keeps a delivered credential out of them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

# What every command gets from the daemon's environment (when set there).
BASE = ("PATH", "HOME", "USER", "LANG", "TERM", "SHELL")

RESERVED = frozenset(
    {
        "PATH",
        "HOME",
        "SHELL",
        "USER",
        "LOGNAME",
        "IFS",
        "ENV",
        "BASH_ENV",
        "CDPATH",
        "PS4",
        "PROMPT_COMMAND",
        "SHELLOPTS",
        "BASHOPTS",
        "GLOBIGNORE",
        "ZDOTDIR",
        "TMPDIR",
        "EDITOR",
        "VISUAL",
        "PAGER",
        "LESSOPEN",
        "LESSCLOSE",
        "GCONV_PATH",
        "GLIBC_TUNABLES",
        "LOCPATH",
        "NLSPATH",
        "HOSTALIASES",
        "RES_OPTIONS",
        "LOCALDOMAIN",
        "NODE_OPTIONS",
        "NODE_PATH",
        "JAVA_TOOL_OPTIONS",
        "_JAVA_OPTIONS",
        "JDK_JAVA_OPTIONS",
        "CLASSPATH",
        "SSH_ASKPASS",
        "SUDO_ASKPASS",
        "SSH_AUTH_SOCK",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "NO_PROXY",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "REQUESTS_CA_BUNDLE",
        "CURL_CA_BUNDLE",
        "NODE_EXTRA_CA_CERTS",
        "DBUS_SESSION_BUS_ADDRESS",
        "PERLLIB",
    }
)
RESERVED_PREFIXES = (
    "LD_",
    "DYLD_",
    "PYTHON",
    "GIT_",
    "PERL5",
    "PERLLIB",
    "RUBY",
    "BASH_FUNC_",
    "ENDPOINTD_",
    "XDG_",
)


def reserved(name: str) -> bool:
    """Could a variable of this name change how a program starts or where it connects?"""
    upper = name.upper()
    return upper in RESERVED or upper.startswith(RESERVED_PREFIXES)


def refused_names(env: Mapping[str, str], allowed: Iterable[str]) -> list[str]:
    """The names in a command's ``exec.env`` that are reserved and not allowed by the owner."""
    ok = set(allowed)
    return sorted(name for name in env if reserved(name) and name not in ok)


def minimal(
    daemon_env: Mapping[str, str], passed: Iterable[str], extra: Mapping[str, str]
) -> dict[str, str]:
    """The command's environment before credentials: BASE and ``passed`` from the daemon's,
    then ``extra`` (already judged) on top."""
    env = {name: daemon_env[name] for name in (*BASE, *passed) if name in daemon_env}
    env.update(extra)
    return env
