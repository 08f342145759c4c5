"""The environment a command starts with: minimal, and nothing in it steers how it starts.

A command never inherits the daemon's environment (under a login shell's unit that holds
``AWS_SECRET_ACCESS_KEY`` and friends): it starts from :data:`BASE` taken from the daemon's
environment, plus the names the owner passes (``[env] pass``), plus the command's own
``exec.env``, plus its TMPDIR and delivered credentials.

``exec.env`` comes from the control plane, and almost any variable can make some program
load or run code of the caller's choosing: ``MAKEFILES``, ``GOFLAGS=-toolexec=…``,
``RUSTC_WRAPPER``, ``npm_config_*``, ``DOTNET_STARTUP_HOOKS``, ``LUA_INIT``, ``PHPRC``,
``KUBECONFIG``'s exec plugins, ``AWS_CONFIG_FILE``'s ``credential_process``, ``CC``,
``OPENSSL_CONF``'s engines, … No list of such names is ever complete, so ``exec.env`` is
an **allow-list** (:func:`refused_names`): only :data:`SETTABLE` (names that change how a
program presents its output or which locale or time zone it uses, never what it loads)
and the names the owner lists in ``[env] allow``. The control plane's own worker sets
none.

:data:`RESERVED` (and :data:`RESERVED_PREFIXES`) is the other direction: the names a
delivered credential may not be put in (``env_var``, a harness's ``credential_env``), since
a value there would steer how programs start. It lists the code-loading names known here;
being a deny-list it only has to keep a credential's value out of the obvious ones.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

# What every command gets from the daemon's environment (when set there).
BASE = ("PATH", "HOME", "USER", "LANG", "TERM", "SHELL")

# What exec.env may set without the owner's say: presentation, locale and time zone only.
SETTABLE = frozenset(
    {
        "CI",
        "NO_COLOR",
        "FORCE_COLOR",
        "CLICOLOR",
        "CLICOLOR_FORCE",
        "COLUMNS",
        "LINES",
        "TERM",
        "TZ",
        "LANG",
        "LANGUAGE",
        "LC_ALL",
        "LC_COLLATE",
        "LC_CTYPE",
        "LC_MESSAGES",
        "LC_MONETARY",
        "LC_NUMERIC",
        "LC_TIME",
        "DEBIAN_FRONTEND",
    }
)

RESERVED = frozenset(
    {
        # The shells and the dynamic loader.
        "PATH",
        "HOME",
        "SHELL",
        "USER",
        "LOGNAME",
        "IFS",
        "ENV",
        "BASH_ENV",
        "CDPATH",
        "PS0",
        "PS1",
        "PS2",
        "PS3",
        "PS4",
        "PROMPT_COMMAND",
        "SHELLOPTS",
        "BASHOPTS",
        "GLOBIGNORE",
        "ZDOTDIR",
        "INPUTRC",
        "TMPDIR",
        "GCONV_PATH",
        "GLIBC_TUNABLES",
        "LOCPATH",
        "NLSPATH",
        "HOSTALIASES",
        "RES_OPTIONS",
        "LOCALDOMAIN",
        "TERMINFO",
        "TERMINFO_DIRS",
        # Programs that run another program, or read start-up code.
        "EDITOR",
        "VISUAL",
        "PAGER",
        "MANPAGER",
        "MANOPT",
        "BROWSER",
        "SYSTEMD_PAGER",
        "SYSTEMD_EDITOR",
        "LESS",
        "LESSKEY",
        "LESSKEYIN",
        "LESSOPEN",
        "LESSCLOSE",
        "VIMINIT",
        "EXINIT",
        "MYVIMRC",
        "VIMRUNTIME",
        "EMACSLOADPATH",
        "SSH_ASKPASS",
        "SUDO_ASKPASS",
        "SSH_AUTH_SOCK",
        "GNUPGHOME",
        "HGRCPATH",
        "WGETRC",
        "CURL_HOME",
        # Build tools: make, compilers, Go, Rust, CMake, pkg-config.
        "MAKEFILES",
        "MAKEFLAGS",
        "MFLAGS",
        "GNUMAKEFLAGS",
        "MAKE",
        "CC",
        "CXX",
        "CPP",
        "LD",
        "AR",
        "AS",
        "NM",
        "RANLIB",
        "STRIP",
        "OBJCOPY",
        "FC",
        "F77",
        "CFLAGS",
        "CXXFLAGS",
        "CPPFLAGS",
        "LDFLAGS",
        "LDLIBS",
        "PKG_CONFIG_PATH",
        "PKG_CONFIG_LIBDIR",
        "GOFLAGS",
        "GOENV",
        "GOTOOLCHAIN",
        "GOROOT",
        "GOPATH",
        "GOBIN",
        "GOWORK",
        "GOPROXY",
        "GOSUMDB",
        "GONOSUMDB",
        "GONOSUMCHECK",
        "GOINSECURE",
        "GOPRIVATE",
        "GONOPROXY",
        "GOEXPERIMENT",
        "GODEBUG",
        "RUSTC",
        "RUSTC_WRAPPER",
        "RUSTC_WORKSPACE_WRAPPER",
        "RUSTDOC",
        "RUSTFLAGS",
        "RUSTDOCFLAGS",
        # Interpreters and runtimes.
        "NODE_OPTIONS",
        "NODE_PATH",
        "JAVA_TOOL_OPTIONS",
        "_JAVA_OPTIONS",
        "JDK_JAVA_OPTIONS",
        "JAVA_OPTS",
        "JAVA_HOME",
        "CLASSPATH",
        "MAVEN_OPTS",
        "MAVEN_ARGS",
        "GRADLE_OPTS",
        "GRADLE_USER_HOME",
        "ANT_OPTS",
        "SBT_OPTS",
        "PHPRC",
        "PHP_INI_SCAN_DIR",
        "TCLLIBPATH",
        "R_PROFILE",
        "R_PROFILE_USER",
        "R_ENVIRON",
        "R_ENVIRON_USER",
        "R_LIBS",
        "R_LIBS_USER",
        "ERL_AFLAGS",
        "ERL_ZFLAGS",
        "ERL_FLAGS",
        "ERL_LIBS",
        "ELIXIR_ERL_OPTIONS",
        "JULIA_LOAD_PATH",
        "JULIA_DEPOT_PATH",
        "PERLLIB",
        "CONDARC",
        # Configuration that names programs to run (credential helpers, exec plugins).
        "KUBECONFIG",
        "AWS_CONFIG_FILE",
        "AWS_SHARED_CREDENTIALS_FILE",
        "DOCKER_CONFIG",
        "DOCKER_HOST",
        "AZURE_CONFIG_DIR",
        "OPENSSL_CONF",
        "OPENSSL_ENGINES",
        "OPENSSL_MODULES",
        "SSLKEYLOGFILE",
        # Where traffic goes and what it trusts.
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
    "GEM_",
    "BUNDLE_",
    "PIP_",
    "UV_",
    "NPM_CONFIG_",  # npm_config_* too: names are compared in upper case
    "YARN_",
    "COREPACK_",
    "CARGO_",
    "RUSTUP_",
    "DOTNET_",
    "CORECLR_",
    "COMPLUS_",
    "LUA_INIT",
    "LUA_PATH",
    "LUA_CPATH",
    "CLOUDSDK_",
    "CMAKE_",
    "BASH_FUNC_",
    "ENDPOINTD_",
    "XDG_",
)


def reserved(name: str) -> bool:
    """Could a variable of this name change how a program starts or where it connects?"""
    upper = name.upper()
    return upper in RESERVED or upper.startswith(RESERVED_PREFIXES)


def refused_names(env: Mapping[str, str], allowed: Iterable[str]) -> list[str]:
    """The names in a command's ``exec.env`` that it may not set: every name that is
    neither in :data:`SETTABLE` nor allowed by the owner (``[env] allow``, by exact name)."""
    ok = set(allowed)
    return sorted(name for name in env if name not in SETTABLE and name not in ok)


def minimal(
    daemon_env: Mapping[str, str], passed: Iterable[str], extra: Mapping[str, str]
) -> dict[str, str]:
    """The command's environment before credentials: BASE and ``passed`` from the daemon's,
    then ``extra`` (already judged) on top."""
    env = {name: daemon_env[name] for name in (*BASE, *passed) if name in daemon_env}
    env.update(extra)
    return env
