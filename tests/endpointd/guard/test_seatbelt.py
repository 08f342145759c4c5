"""The macOS Seatbelt profile, as generated text (this is Linux: nothing here runs it).

Each profile is read back with a small SBPL reader below, which refuses unbalanced
parentheses and malformed string literals; the assertions then look at the rules it found
(their order, operations and path filters) rather than at substrings.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TypeAlias

import pytest

from endpointd.guard import seatbelt
from endpointd.guard.confinement import DEVICE_FILES, Confinement

# ---------------------------------------------------------------------------- the reader


@dataclass(frozen=True)
class Str:
    """A string literal: ``"..."``, or ``#"..."`` (raw, for regular expressions)."""

    value: str
    raw: bool = False


Node: TypeAlias = "str | Str | list[Node]"


class Malformed(ValueError):
    pass


def _tokens(text: str) -> list[str | Str]:
    out: list[str | Str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch in " \t\n":
            i += 1
        elif ch == ";":
            end = text.find("\n", i)
            i = len(text) if end < 0 else end
        elif ch in "()":
            out.append(ch)
            i += 1
        elif ch == '"' or text.startswith('#"', i):
            raw = ch == "#"
            i += 2 if raw else 1
            value: list[str] = []
            while True:
                if i >= len(text):
                    raise Malformed("unterminated string literal")
                c = text[i]
                if ord(c) < 0x20 or ord(c) == 0x7F:
                    raise Malformed(f"control character {c!r} in a string literal")
                if c == '"':
                    i += 1
                    break
                if c == "\\" and not raw:
                    # The only escapes the generator may write: \\ and \".
                    if i + 1 >= len(text) or text[i + 1] not in '\\"':
                        raise Malformed(f"unknown escape at {i}: {text[i : i + 2]!r}")
                    value.append(text[i + 1])
                    i += 2
                    continue
                value.append(c)
                i += 1
            if i < len(text) and text[i] not in " \t\n()":
                raise Malformed(f"string literal glued to {text[i]!r}")
            out.append(Str("".join(value), raw))
        else:
            start = i
            while i < len(text) and text[i] not in ' \t\n();"':
                i += 1
            symbol = text[start:i]
            if not all(c.isalnum() or c in "*-_." for c in symbol):
                raise Malformed(f"odd symbol {symbol!r}")
            out.append(symbol)
    return out


def parse(text: str) -> list[Node]:
    """The top-level forms of ``text``; :class:`Malformed` unless it is well formed."""
    stack: list[list[Node]] = [[]]
    for token in _tokens(text):
        if token == "(":
            stack.append([])
        elif token == ")":
            if len(stack) == 1:
                raise Malformed("unbalanced ')'")
            done = stack.pop()
            stack[-1].append(done)
        else:
            stack[-1].append(token)
    if len(stack) != 1:
        raise Malformed("unbalanced '('")
    return stack[0]


@dataclass(frozen=True)
class Rule:
    index: int
    action: str
    ops: tuple[str, ...]
    filters: tuple[Node, ...]


def rules(text: str) -> list[Rule]:
    out = []
    for index, form in enumerate(parse(text)):
        assert isinstance(form, list), form
        assert form, form
        head = form[0]
        if head not in ("allow", "deny"):
            continue
        ops = tuple(x for x in form[1:] if isinstance(x, str))
        filters = tuple(x for x in form[1:] if not isinstance(x, str))
        assert ops, form
        assert form[1 : 1 + len(ops)] == list(ops), f"operations must come first: {form}"
        out.append(Rule(index, str(head), ops, filters))
    return out


def paths(node: Node, kinds: tuple[str, ...] = ("subpath", "literal")) -> list[str]:
    """The paths a filter matches positively (what a ``require-not`` excludes is left out)."""
    if not isinstance(node, list) or not node:
        return []
    if node[0] == "require-not":
        return []
    if len(node) == 2 and node[0] in kinds and isinstance(node[1], Str):
        return [node[1].value]
    return [p for child in node[1:] for p in paths(child, kinds)]


def rule_paths(rule: Rule, kinds: tuple[str, ...] = ("subpath", "literal")) -> list[str]:
    return [p for f in rule.filters for p in paths(f, kinds)]


def strings(node: Node) -> list[Str]:
    if isinstance(node, Str):
        return [node]
    if isinstance(node, list):
        return [s for child in node for s in strings(child)]
    return []


def unix(node: Node) -> bool:
    """Is ``node`` a ``(remote|local unix-socket ...)`` filter?"""
    return isinstance(node, list) and len(node) >= 2 and node[1] == "unix-socket"


def denials(found: list[Rule]) -> list[Rule]:
    """The rules that deny reading and writing paths (not the terminal regex)."""
    return [
        r
        for r in found
        if r.action == "deny" and r.ops == ("file-read*", "file-write*") and rule_paths(r)
    ]


def writes(rule: Rule) -> bool:
    return any(op.startswith("file-write") for op in rule.ops)


# Every operation and filter the generator may use: a typo would make sandbox-exec refuse
# the whole profile on a Mac, and CI here would never know.
OPERATIONS = {
    "default",
    "process-fork",
    "process-exec",
    "signal",
    "process-info*",
    "sysctl-read",
    "sysctl-write",
    "mach-host*",
    "mach-lookup",
    "user-preference-read",
    "ipc-posix-sem",
    "ipc-posix-shm",
    "pseudo-tty",
    "file-ioctl",
    "file-read*",
    "file-read-metadata",
    "file-write*",
    "file-write-data",
    "file-write-unlink",
    "file-link",
    "network*",
    "network-outbound",
    "network-bind",
    "system-socket",
}
FILTERS = {
    "target",
    "sysctl-name",
    "sysctl-name-prefix",
    "global-name",
    "local-name",
    "literal",
    "subpath",
    "regex",
    "require-all",
    "require-not",
    "extension",
    "remote",
    "local",
    "socket-domain",
}

HOME = "/Users/me"
WORKSPACE = f"{HOME}/src/app"
STATE = "/private/var/folders/ab/xyz/T/endpointd-state"
TMPDIR = f"{STATE}/spool/42/tmp"


def confinement(network: str = "deny", proxy_port: int | None = None, **kw: object) -> Confinement:
    """A realistic confinement: what ``sandbox.plan`` makes of a workspace on a Mac."""
    fields: dict[str, object] = {
        "denied": (f"{HOME}/.ssh", f"{HOME}/.aws", STATE),
        "write": (WORKSPACE, TMPDIR),
        "write_files": DEVICE_FILES,
        "protected": (f"{WORKSPACE}/.git/hooks", f"{WORKSPACE}/.git/config"),
        "network": network,
        "proxy_port": proxy_port,
        "mechanism": "seatbelt",
    }
    fields.update(kw)
    return Confinement(**fields)  # type: ignore[arg-type]


MODES = [("allow", None), ("deny", None), ("proxy", 8123)]


# ---------------------------------------------------------------------------- the reader, checked


def test_reader_refuses_what_it_should() -> None:
    for bad in ['(a "b)', "(a))", "((a)", '(a "x\\n")', '(a "x"y)', "(a $b)", '(a "\n")']:
        with pytest.raises(Malformed):
            parse(bad)
    assert parse('(a "q\\"b\\\\" #"^x$") ; (\n(b)') == [
        ["a", Str('q"b\\'), Str("^x$", raw=True)],
        ["b"],
    ]


# ---------------------------------------------------------------------------- structure


@pytest.mark.parametrize(("network", "port"), MODES)
def test_well_formed_closed_by_default_and_known_words(network: str, port: int | None) -> None:
    text = seatbelt.profile(confinement(network, port))
    forms = parse(text)
    assert forms[0] == ["version", "1"]
    assert forms[1] == ["deny", "default"]
    found = rules(text)
    assert not any(r.action == "allow" and r.ops == ("default",) for r in found)
    for r in found:
        assert set(r.ops) <= OPERATIONS, r
        for f in r.filters:
            assert isinstance(f, list), r
            assert f[0] in FILTERS, r


def test_minimal_confinement_is_well_formed() -> None:
    text = seatbelt.profile(Confinement())  # network "allow", nothing else
    assert parse(text)[:2] == [["version", "1"], ["deny", "default"]]
    found = rules(text)
    assert {p for r in found if r.action == "allow" and writes(r) for p in rule_paths(r)} == {
        "/dev/null",
        "/dev/zero",
        "/dev/tty",
        "/dev/fd",
        "/dev/ptmx",
    }
    assert not any(r.action == "deny" and "file-read*" in r.ops and rule_paths(r) for r in found)
    assert seatbelt.profile(Confinement()) == text  # deterministic


def test_processes_reach_only_their_own_sandbox() -> None:
    found = rules(seatbelt.profile(confinement()))
    same = ["target", "same-sandbox"]
    signal = [r for r in found if "signal" in r.ops]
    info = [r for r in found if any(op.startswith("process-info") for op in r.ops)]
    assert [(r.action, r.filters) for r in signal] == [("allow", (same,))]
    assert [(r.action, r.filters) for r in info] == [("allow", (same,))]
    lookups = [r for r in found if r.action == "allow" and "mach-lookup" in r.ops]
    assert lookups
    assert all(r.filters for r in lookups), "no unfiltered mach-lookup"
    services = {s.value for r in lookups for f in r.filters for s in strings(f)}
    for forbidden in (
        "com.apple.SecurityServer",  # the keychain
        "com.apple.securityd.xpc",
        "com.apple.pasteboard.1",
        "com.apple.coreservices.launchservicesd",  # open(1): starting apps outside
    ):
        assert forbidden not in services
    text = seatbelt.profile(confinement())
    assert "procargs" not in text
    assert "kern.proc.all" not in text
    assert not any(
        r.action == "allow" and set(r.ops) & {"appleevent-send", "lsopen", "user-preference-write"}
        for r in found
    )


# ---------------------------------------------------------------------------- files


@pytest.mark.parametrize(("network", "port"), MODES)
def test_denied_paths_are_taken_back_after_the_read_allowance(
    network: str, port: int | None
) -> None:
    found = rules(seatbelt.profile(confinement(network, port)))
    read_all = [r for r in found if r.action == "allow" and r.ops == ("file-read*",)]
    assert [r.filters for r in read_all] == [()]
    for denied in (f"{HOME}/.ssh", f"{HOME}/.aws", STATE):
        denials = [
            r
            for r in found
            if r.action == "deny" and {"file-read*", "file-write*"} <= set(r.ops)
            if denied in rule_paths(r, ("subpath",))
        ]
        assert len(denials) == 1, denied
        # After the read allowance, and after every allowance of reads or writes.
        last_allow = max(
            r.index
            for r in found
            if r.action == "allow" and ({"file-read*"} & set(r.ops) or writes(r))
        )
        assert denials[0].index > read_all[0].index
        assert denials[0].index > last_allow


def test_writes_only_beneath_the_given_roots_and_files() -> None:
    c = confinement()
    found = rules(seatbelt.profile(c))
    allowed = {p for r in found if r.action == "allow" and writes(r) for p in rule_paths(r)}
    roots = {p for w in c.write for p in seatbelt._spellings(w)}
    files = {p for f in c.write_files for p in seatbelt._spellings(f)}
    base = {"/dev/null", "/dev/zero", "/dev/tty", "/dev/fd", "/dev/ptmx"}
    assert roots | files <= allowed
    assert allowed <= roots | files | base
    subpaths = {
        p for r in found if r.action == "allow" and writes(r) for p in rule_paths(r, ("subpath",))
    }
    assert subpaths == roots | {"/dev/fd"}, "write_files are single files (literal)"
    # With no writable root, nothing but devices.
    found = rules(seatbelt.profile(Confinement(write_files=("/dev/null",))))
    allowed = {p for r in found if r.action == "allow" and writes(r) for p in rule_paths(r)}
    assert allowed <= base


def test_protected_paths_are_denied_after_every_write_allowance() -> None:
    found = rules(seatbelt.profile(confinement()))
    last_write_allow = max(r.index for r in found if r.action == "allow" and writes(r))
    for protected in (f"{WORKSPACE}/.git/hooks", f"{WORKSPACE}/.git/config"):
        denials = [
            r
            for r in found
            if r.action == "deny" and "file-write*" in r.ops and protected in rule_paths(r)
        ]
        assert len(denials) == 1
        assert "file-read*" not in denials[0].ops, "protected paths stay readable"
        assert denials[0].index > last_write_allow


def test_directories_above_protected_and_denied_paths_cannot_be_renamed() -> None:
    found = rules(seatbelt.profile(confinement()))
    (unlink,) = [r for r in found if r.ops == ("file-write-unlink",)]
    assert unlink.action == "deny"
    names = rule_paths(unlink, ("literal",))
    assert {f"{WORKSPACE}/.git", WORKSPACE} <= set(names)
    assert f"/System/Volumes/Data{WORKSPACE}" in names
    # Directories the command cannot write anyway need no rule.
    assert not {HOME, "/Users", STATE} & set(names)


def test_no_hard_links() -> None:
    found = rules(seatbelt.profile(confinement("allow")))
    assert [(r.action, r.filters) for r in found if "file-link" in r.ops] == [("deny", ())]


def test_a_writable_root_inside_a_denied_path_stays_usable() -> None:
    inner = f"{TMPDIR}/secret"
    text = seatbelt.profile(confinement(denied=(STATE, inner)))
    found = rules(text)
    (deny,) = denials(found)
    assert [
        "require-all",
        ["subpath", Str(STATE)],
        ["require-not", ["subpath", Str(TMPDIR)]],
    ] in deny.filters
    assert inner in rule_paths(deny), "a denied path inside the writable root stays denied"
    # Unix sockets: denied beneath the state dir, reopened beneath the TMPDIR, closed
    # again beneath the denied path inside it; in that order.
    outbound = [r for r in found if r.ops == ("network-outbound",) and rule_paths(r)]
    sequence = [
        (r.action, STATE in rule_paths(r), TMPDIR in rule_paths(r), inner in rule_paths(r))
        for r in outbound
    ]
    at = sequence.index(("deny", True, False, True))
    assert sequence[at + 1 :] == [("allow", False, True, False), ("deny", False, False, True)]


# ---------------------------------------------------------------------------- network


def test_network_allow() -> None:
    c = confinement("allow", 8123)  # a stray port is ignored outside proxy mode
    text = seatbelt.profile(c)
    found = rules(text)
    assert any(r.action == "allow" and r.ops == ("network*",) and not r.filters for r in found)
    assert "8123" not in text
    assert "mDNSResponder" not in text
    assert "com.apple.trustd" in text


@pytest.mark.parametrize(("network", "port"), [("deny", None), ("deny", 8123), ("proxy", 8123)])
def test_network_deny_and_proxy(network: str, port: int) -> None:
    text = seatbelt.profile(confinement(network, port))
    found = rules(text)
    assert not any(r.action == "allow" and "network*" in r.ops for r in found)
    outbound = [r for r in found if r.action == "allow" and "network-outbound" in r.ops]
    assert (["remote", "unix-socket"],) in [r.filters for r in outbound]
    ip = [r for r in outbound if not all(unix(f) for f in r.filters)]
    if network == "proxy":
        assert [r.filters for r in ip] == [(["remote", "tcp", Str("localhost:8123")],)]
        assert text.count("8123") == 1
        assert "com.apple.trustd" in text
    else:
        assert ip == []
        assert "8123" not in text
        assert "localhost" not in text
        assert "com.apple.trustd" not in text
    # DNS through mDNSResponder's socket is closed, after the Unix socket allowance.
    (dns,) = [
        r for r in found if r.action == "deny" and "/private/var/run/mDNSResponder" in rule_paths(r)
    ]
    assert "/var/run/mDNSResponder" in rule_paths(dns)
    assert dns.index > min(r.index for r in outbound)
    # Sockets are bound only beneath writable roots.
    binds = [r for r in found if r.action == "allow" and r.ops == ("network-bind",)]
    assert {p for r in binds for p in rule_paths(r)} <= {
        p for w in (WORKSPACE, TMPDIR) for p in seatbelt._spellings(w)
    }


def test_unix_sockets_beneath_denied_paths_are_closed() -> None:
    found = rules(seatbelt.profile(confinement("allow")))
    denied_out = {
        p
        for r in found
        if r.action == "deny" and r.ops == ("network-outbound",)
        for p in rule_paths(r)
    }
    assert f"{HOME}/.ssh" in denied_out
    closed = [r for r in found if r.filters == (["local", "unix-socket"],)]
    assert [(r.action, r.ops) for r in closed] == [("deny", ("network-bind",))]
    reopened = [r for r in found if r.action == "allow" and r.ops == ("network-bind",)]
    assert reopened
    assert all(r.index > closed[0].index for r in reopened)
    assert WORKSPACE in rule_paths(reopened[0])


@pytest.mark.parametrize("port", [None, 0, 65536, -1, True])
def test_proxy_needs_a_port(port: object) -> None:
    with pytest.raises(ValueError, match="port"):
        seatbelt.profile(Confinement(network="proxy", proxy_port=port))  # type: ignore[arg-type]


def test_unknown_network_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="network"):
        seatbelt.profile(Confinement(network="open"))


# ---------------------------------------------------------------------------- paths


def test_quotes_and_backslashes_are_escaped() -> None:
    odd = f'{HOME}/we"ird\\dir (x); #"y'
    text = seatbelt.profile(confinement(denied=(odd,), write=(f"{odd}/w",)))
    assert '"/Users/me/we\\"ird\\\\dir (x); #\\"y"' in text
    found = rules(text)  # the reader would have choked on a bad literal
    assert any(r.action == "deny" and odd in rule_paths(r) for r in found)
    assert any(r.action == "allow" and writes(r) and f"{odd}/w" in rule_paths(r) for r in found)


@pytest.mark.parametrize("field", ["denied", "write", "write_files", "protected"])
@pytest.mark.parametrize(
    "path",
    ["/a\x00b", "/a\nb", "/a\rb", "/a\tb", "relative/x", "", "/a/../b", "/a/./b", "//a", "/a//b"],
)
def test_paths_sbpl_cannot_carry_or_that_are_not_canonical_are_refused(
    field: str, path: str
) -> None:
    with pytest.raises(ValueError, match="sandbox path"):
        seatbelt.profile(Confinement(**{field: ("/ok", path)}))  # type: ignore[arg-type]


@pytest.mark.parametrize("field", ["read", "read_extra", "never", "homes", "read_files"])
@pytest.mark.parametrize("path", ["/a\nb", "relative/x", "/a/../b", "//a"])
def test_listed_reads_refuse_paths_sbpl_cannot_carry(field: str, path: str) -> None:
    c = Confinement(reads_listed=True, **{field: ("/ok", path)})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="sandbox path"):
        seatbelt.profile(c)


def test_anycase_matches_every_case_and_only_more() -> None:
    (form,) = parse(seatbelt._anycase('/Users/Jos\u00e9/.cargo/cred"s-1_x.toml'))
    assert isinstance(form, list)
    assert form[0] == "regex"
    rx = form[1]
    assert isinstance(rx, Str)
    assert rx.raw
    for path in (
        '/Users/Jos\u00e9/.cargo/cred"s-1_x.toml',
        '/users/JOSE\u0301/.CARGO/CRED"S-1_X.TOML/inner',  # another normalisation
    ):
        assert re.search(rx.value, path), path
    for path in (
        '/Users/Bob/.cargo/cred"s-1_x.toml',  # another directory
        '/Users/Jos\u00e9/.cargo/cred"s-2_x.toml',  # another digit
        '/Users/Jos\u00e9/.cargo/cred"s-1_x.tomlx',  # a longer name: not beneath it
    ):
        assert not re.search(rx.value, path), path


@pytest.mark.parametrize(
    ("given", "also"),
    [  # The /tmp paths are text in a profile, not files used here (S108).
        ("/tmp/x", ["/private/tmp/x", "/System/Volumes/Data/private/tmp/x"]),  # noqa: S108
        ("/tmp", ["/private/tmp"]),  # noqa: S108
        ("/var/folders/ab/T", ["/private/var/folders/ab/T"]),
        ("/etc/ssl", ["/private/etc/ssl"]),
        ("/private/var/folders/ab/T", ["/var/folders/ab/T"]),
        ("/private/tmp/", ["/tmp"]),  # noqa: S108
        ("/Users/me/.ssh", ["/System/Volumes/Data/Users/me/.ssh"]),
        ("/System/Volumes/Data/Users/me/.aws", ["/Users/me/.aws"]),
        ("/tmpfoo/x", []),  # noqa: S108
        ("/variable", []),
        ("/usr/bin", []),
    ],
)
def test_every_spelling_of_a_path_is_written(given: str, also: list[str]) -> None:
    text = seatbelt.profile(Confinement(denied=(given,)))
    (deny,) = denials(rules(text))
    written = rule_paths(deny)
    assert written[0] == given.rstrip("/")
    assert set(also) <= set(written)
    if not also:
        assert written == [given]


# ---------------------------------------------------------------------------- argv


def test_argv() -> None:
    c = confinement("proxy", 8123)
    command = ["sh", "-c", 'echo "$HOME" ; exit 3', "--", "(x)"]
    out = seatbelt.argv(c, command)
    assert out == ["/usr/bin/sandbox-exec", "-p", seatbelt.profile(c), "--", *command]
    with pytest.raises(ValueError, match="no command"):
        seatbelt.argv(c, [])


# ---------------------------------------------------------------------------- reads: an allow-list


def _op_matches(rule_op: str, op: str) -> bool:
    """Does an operation named in a rule cover ``op``? (``file-read*`` covers
    ``file-read-data`` and ``file-read-metadata``; ``default`` is the fallback, no match.)"""
    if rule_op.endswith("*"):
        return op.startswith(rule_op[:-1])
    return rule_op == op


def _matches(node: Node, path: str) -> bool:
    """Does a path filter match ``path``? Filters about anything else (an extension the
    command does not hold, sockets, processes) do not."""
    if not isinstance(node, list) or not node:
        return False
    head, args = node[0], node[1:]
    if head == "require-all":
        return all(_matches(a, path) for a in args)
    if head == "require-any":
        return any(_matches(a, path) for a in args)
    if head == "require-not":
        return not _matches(args[0], path)
    if len(args) != 1 or not isinstance(args[0], Str):
        return False
    value = args[0].value
    if head == "literal":
        return path == value
    if head == "subpath":
        return value == "/" or path == value or path.startswith(value.rstrip("/") + "/")
    if head == "regex":
        return re.search(value, path) is not None
    return False


def allowed(text: str, op: str, path: str) -> bool:
    """What the profile decides for ``op`` on ``path``, as the kernel would: the last
    matching rule wins, and with none ``(deny default)`` does."""
    decision = False
    for r in rules(text):
        if not any(_op_matches(o, op) for o in r.ops):
            continue
        if r.filters and not any(_matches(f, path) for f in r.filters):
            continue
        decision = r.action == "allow"
    return decision


def test_the_evaluator_follows_the_last_matching_rule() -> None:
    text = (
        '(version 1)\n(deny default)\n(allow file-read* (subpath "/a"))\n'
        '(deny file-read* (require-all (subpath "/a/b") (require-not (subpath "/a/b/c"))))\n'
        '(allow file-read-metadata (literal "/x"))\n'
    )
    assert allowed(text, "file-read-data", "/a/z")
    assert not allowed(text, "file-read-data", "/a/b/z")
    assert allowed(text, "file-read-data", "/a/b/c/z")
    assert not allowed(text, "file-read-data", "/ab")
    assert allowed(text, "file-read-metadata", "/x")
    assert not allowed(text, "file-read-data", "/x")
    assert not allowed(text, "file-write-data", "/a/z")


@dataclass(frozen=True)
class Mac:
    """A macOS-shaped machine (this is Linux: the paths live under ``tmp_path``)."""

    home: Path
    work: Path
    tmpdir: Path
    state: Path  # endpointd's own (denied)
    control: Path  # the control plane's (SUPERAGENT_STATE_DIR)
    clone_git: Path
    text: str


@pytest.fixture
def mac(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Mac:
    """A profile made by ``sandbox.plan`` as on a Mac: Seatbelt, the default grants."""
    return planned(tmp_path, monkeypatch)


def planned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, policy: str = "") -> Mac:
    """A profile made by ``sandbox.plan`` as on a Mac, under ``policy`` (more lines)."""
    from endpointd.guard import sandbox
    from endpointd.rules.parser import parse_policy
    from endpointd.rules.tables import DEFAULT_DENIED_PATHS

    root = Path(os.path.realpath(tmp_path))
    home = root / "Users" / "me"
    for name in (
        ".bashrc",
        ".npmrc",
        ".gitconfig",
        ".ssh/id_rsa",
        "Library/Keychains/x",
        "other-project/secret.txt",
        ".cargo/credentials.toml",
        ".cargo/registry/x",
        "Library/Caches/pip/http/x",
        "Library/Caches/com.apple.Safari/x",
        ".config/git/ignore",
    ):
        (home / name).parent.mkdir(parents=True, exist_ok=True)
        (home / name).write_text("x")
    work = home / "src" / "app"
    state = root / "endpointd-state"
    tmpdir = state / "spool" / "42" / "tmp"
    control = root / "superagent-state"
    clone_git = home / "clones" / "app" / ".git"
    for d in (work, tmpdir, control, clone_git / "objects"):
        d.mkdir(parents=True)
    (control / "admin-token").write_text("x")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("SUPERAGENT_STATE_DIR", str(control))
    monkeypatch.setattr(sandbox, "support", lambda: sandbox.Support("seatbelt"))
    rules_ = parse_policy(f'allowed_roots = ["{work}"]\n{policy}', Path("/p"), home)
    denied = [p.replace("~", str(home), 1) for p in DEFAULT_DENIED_PATHS] + [str(state)]
    c = sandbox.plan(
        rules_,
        denied=denied,
        workspace=str(work),
        tmpdir=str(tmpdir),
        extra_read=[str(clone_git)],
    )
    assert c.mechanism == "seatbelt"
    return Mac(home, work, tmpdir, state, control, clone_git, seatbelt.profile(c))


def test_a_planned_profile_hides_the_home_but_for_grants(mac: Mac) -> None:
    home = mac.home
    for refused in (
        home / ".bashrc",
        home / ".npmrc",
        home / ".ssh" / "id_rsa",
        home / "Library" / "Keychains" / "x",
        home / "other-project" / "secret.txt",
        home / ".cargo" / "credentials.toml",  # though ~/.cargo/registry is granted
        home / "Library" / "Caches" / "com.apple.Safari" / "x",
        mac.control / "admin-token",
        mac.control,
        mac.state / "spool" / "41" / "tmp" / "x",  # another command's TMPDIR
    ):
        for spelling in seatbelt._spellings(str(refused)):
            assert not allowed(mac.text, "file-read-data", spelling), spelling
    for granted in (
        "/usr/bin/git",
        "/System/Library/x",
        str(mac.work / "main.py"),
        str(mac.tmpdir / "x"),
        str(home / ".cargo" / "registry" / "x"),
        str(home / ".gitconfig"),  # a default grant
        str(home / "Library" / "Caches" / "pip" / "http" / "x"),  # pip's cache on macOS
        str(home / ".config" / "git" / "ignore"),  # what the owner ignores everywhere
        str(mac.clone_git / "objects" / "ab"),  # the clone's git dir, given as extra_read
    ):
        for spelling in seatbelt._spellings(granted):
            assert allowed(mac.text, "file-read-data", spelling), spelling


def test_a_planned_profile_reads_nothing_unlisted(mac: Mac) -> None:
    found = rules(mac.text)
    unfiltered = [r for r in found if r.action == "allow" and not r.filters]
    assert not [r for r in unfiltered if any(_op_matches(o, "file-read-data") for o in r.ops)]
    assert not [r for r in unfiltered if any(_op_matches(o, "file-read-metadata") for o in r.ops)]
    for refused in (
        "/Users/someone-else/notes.txt",
        "/Volumes/USB/x",  # removable and network volumes
        "/private/var/db/SystemKey",  # the System keychain's key
        "/Library/Keychains/System.keychain",
        "/private/var/folders/ab/cd/T/x",  # other programs' temporary files and caches
        "/private/tmp/x",
        "/dev/rdisk0",  # the raw disk
        # Time Machine's local snapshots: yesterday's copy of the home directory.
        f"/Volumes/com.apple.TimeMachine.localsnapshots/Backups.backupdb/Mac/1/Data{mac.home}"
        "/.ssh/id_rsa",
        "/cores/core.123",  # another program's memory
        "/private/var/vm/sleepimage",  # all of memory, at the last sleep
        "/private/etc/sudoers",
        "/private/etc/kcpassword",  # the automatic login's password
        "/opt/homebrew/var/postgresql@16/base/1",  # Homebrew services' data
        f"/System/Volumes/Data{mac.home}/.bashrc",  # the data volume's spelling
    ):
        assert not allowed(mac.text, "file-read-data", refused), refused
    for granted in (
        "/bin/sh",
        "/private/etc/hosts",
        "/etc/ssl/cert.pem",
        "/opt/homebrew/bin/python3",
        "/Library/Developer/CommandLineTools/usr/bin/clang",
        "/Applications/Xcode.app/Contents/Developer/usr/bin/xcodebuild",
        "/dev/null",
        "/dev/urandom",
        "/",
    ):
        assert allowed(mac.text, "file-read-data", granted), granted
    # The directories on the way to a grant may be stat'ed (realpath), not listed.
    for above in (str(mac.home), str(mac.home.parent), str(mac.home / ".cargo")):
        assert allowed(mac.text, "file-read-metadata", above), above
        assert not allowed(mac.text, "file-read-data", above), above


def test_what_is_masked_is_denied_after_every_read_allowance(mac: Mac) -> None:
    found = rules(mac.text)
    reads = [
        r for r in found if r.action == "allow" and any(o.startswith("file-read") for o in r.ops)
    ]
    (deny,) = denials(found)
    hidden = set(rule_paths(deny))
    for masked in (
        mac.home / ".npmrc",
        mac.home / ".cargo" / "credentials.toml",
        mac.home / "Library" / "Keychains",
        mac.control,
        mac.state,
    ):
        assert set(seatbelt._spellings(str(masked))) <= hidden, masked
    # Only a harness run's login files may come after (none here).
    assert all(r.index < deny.index for r in reads)


def test_listed_reads_with_no_grant_allow_no_read_without_a_filter() -> None:
    text = seatbelt.profile(Confinement(reads_listed=True, mechanism="seatbelt"))
    found = rules(text)
    assert not [r for r in found if r.action == "allow" and not r.filters and "file-read*" in r.ops]
    assert not allowed(text, "file-read-data", "/Users/me/.bashrc")
    assert allowed(text, "file-read-data", "/usr/lib/libSystem.B.dylib")


def test_a_harness_login_stays_readable_among_listed_reads() -> None:
    login = f"{HOME}/.claude/.credentials.json"
    c = confinement(
        denied=(f"{HOME}/.claude",),
        never=(f"{HOME}/.claude",),
        homes=(HOME,),
        read_files=(login,),
        reads_listed=True,
    )
    text = seatbelt.profile(c)
    assert allowed(text, "file-read-data", login)
    assert not allowed(text, "file-write-data", login)
    assert not allowed(text, "file-read-data", f"{HOME}/.claude/settings.json")


def test_no_case_variant_reaches_what_a_grant_leaves_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """APFS is case-insensitive: ~/.cargo/CREDENTIALS.toml opens ~/.cargo/credentials.toml.
    Grants match the case they are written in (a variant of one is refused, which is
    safe); what is taken out of a grant must be refused in every case."""
    mac = planned(tmp_path, monkeypatch, 'readable_paths = ["~/.cargo", "~/Library"]\n')
    home = str(mac.home)
    assert allowed(mac.text, "file-read-data", f"{home}/.cargo/registry/x")
    assert allowed(mac.text, "file-read-data", f"{home}/Library/Fonts/x.ttf")
    for refused in (
        f"{home}/.cargo/credentials.toml",
        f"{home}/.cargo/CREDENTIALS.toml",
        f"{home}/.cargo/Credentials.Toml",
        f"{home}/.cargo/credential\u017f.toml",  # a long s, which APFS folds to s
        f"{home}/Library/\u212aeychains/login.keychain-db",  # the Kelvin sign: k
        f"{home}/Library/keychains/login.keychain-db",
        f"{home}/Library/KEYCHAINS/login.keychain-db",
        f"{home}/Library/cookies/x",
        f"/System/VOLUMES/Data{home}/.bashrc",
        f"/System/volumes/data{home}/.ssh/id_rsa",
        "/usr/LOCAL/var/postgres/base/1",
        "/usr/local/VAR/postgres/base/1",
        "/opt/Homebrew/var/redis/dump.rdb",
        "/private/etc/SUDOERS",
        "/etc/Sudoers",
        "/private/etc/KCPassword",
    ):
        assert not allowed(mac.text, "file-read-data", refused), refused


def test_a_planned_profile_runs_no_program_it_cannot_read(mac: Mac) -> None:
    """As in the Linux view, where a hidden program is not there to run: a binary in the
    home directory (one with a token built in, say) cannot be started."""
    for hidden in (
        f"{mac.home}/bin/deploy",
        f"{mac.home}/other-project/.venv/bin/python",
        f"{mac.control}/bin/tool",
        "/Volumes/USB/run",
    ):
        assert not allowed(mac.text, "process-exec", hidden), hidden
    for program in ("/bin/sh", "/usr/bin/git", f"{mac.work}/build/app", f"{mac.tmpdir}/a.out"):
        assert allowed(mac.text, "process-exec", program), program
