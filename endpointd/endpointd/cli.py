"""The `endpointd` command line: one function per command, one place that prints errors.

Every expected failure is an :class:`EndpointdError`, printed as one line (``Error: ...``)
with exit status 1 and no traceback. Heavy or slow imports (gRPC, keyring probing D-Bus on
Linux) happen inside the commands that need them, so `endpointd --help` and `endpointd
version` stay instant.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import sys
from pathlib import Path
from typing import Any

import click

from endpointd import __version__
from endpointd.errors import EndpointdError
from endpointd.keys import KeyringStatus, keyring_status
from endpointd.paths import config_dir, state_dir
from superagent_shared.protocol import PROTOCOL_VERSION, PROTOCOL_VERSION_NUMBER

__all__ = ["KeyringStatus", "cli", "keyring_status", "main"]


class _Group(click.Group):
    """Turns EndpointdError into click's one-line error and exit status 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except EndpointdError as exc:
            raise click.ClickException(str(exc)) from None


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(
    __version__,
    prog_name="endpointd",
    message=f"%(prog)s %(version)s (protocol {PROTOCOL_VERSION})",
)
def cli() -> None:
    """endpointd: the super-agent device daemon.

    endpointd lets your team's coding agent work in this machine's real environment: it
    runs the commands and file operations the control plane sends, hands them credentials
    from your OS keyring without ever sending the secret values upstream, and enforces a
    local policy file that only you can change. It only ever connects out to the control
    plane, over a single TLS-protected gRPC stream; it never listens for or accepts inbound
    connections, so it needs no open ports and works behind NAT and firewalls.

    Start with `endpointd pair URL CODE`, then `endpointd run` (or `endpointd service
    install --now` to start it at every login), and check on it with `endpointd status`.
    """


@cli.command()
def version() -> None:
    """Print the daemon version and the wire protocol it speaks."""
    click.echo(f"endpointd {__version__}")
    click.echo(f"protocol {PROTOCOL_VERSION} (version {PROTOCOL_VERSION_NUMBER})")


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def info(as_json: bool) -> None:
    """Show the config and state directories and whether the OS keyring is usable.

    Pairing stores the device key in the keyring, so check this first. Set
    ENDPOINTD_CONFIG_DIR or ENDPOINTD_STATE_DIR to use different directories.
    """
    cfg = config_dir()
    state = state_dir()
    ring = keyring_status()
    report: dict[str, Any] = {
        "version": __version__,
        "protocol_version": PROTOCOL_VERSION,
        "protocol_version_number": PROTOCOL_VERSION_NUMBER,
        "config_dir": str(cfg.path),
        "config_dir_source": cfg.source,
        "config_dir_exists": cfg.path.is_dir(),
        "state_dir": str(state.path),
        "state_dir_source": state.source,
        "keyring": {
            "backend": ring.backend,
            "class": ring.backend_class,
            "usable": ring.usable,
            "detail": ring.detail,
        },
    }
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return

    exists = "exists" if report["config_dir_exists"] else "not created yet"
    click.echo(f"endpointd {__version__} (protocol {PROTOCOL_VERSION})")
    click.echo(f"config dir: {cfg.path}  [{cfg.source}; {exists}]")
    click.echo(f"state dir:  {state.path}  [{state.source}]")
    usable = "usable" if ring.usable else "NOT usable"
    where = f" ({ring.backend_class})" if ring.backend_class else ""
    click.echo(f"keyring:    {ring.backend}{where}: {usable}, {ring.detail}")
    if not ring.usable:
        # Say what to do, not just what is wrong: pairing stores the device's private key in
        # the keyring, so an unusable one blocks pairing.
        click.echo(
            "            install or unlock an OS keyring (Secret Service/KWallet on Linux,"
            " Keychain on macOS, Credential Locker on Windows) before pairing,"
            " or pair with --key-file PATH"
        )


@cli.command()
@click.argument("url")
@click.argument("code")
@click.option("--name", help="Device name shown to your team (default: this machine's hostname).")
@click.option(
    "--key-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Keep the private key in this 0600 file instead of the OS keyring.",
)
@click.option(
    "--fingerprint",
    help="Expected SHA-256 of the server certificate (hex; colons and a sha256: prefix are fine).",
)
@click.option(
    "--allow-root",
    "allow_roots",
    multiple=True,
    metavar="DIR",
    help="A directory commands and file operations may use (repeatable). Asked for"
    " interactively when omitted; required when stdin is not a terminal.",
)
def pair(
    url: str,
    code: str,
    name: str | None,
    key_file: Path | None,
    fingerprint: str | None,
    allow_roots: tuple[str, ...],
) -> None:
    """Pair this machine with a control plane, using a one-time CODE.

    URL is the device gateway, normally https://HOST:PORT (http:// is accepted for loopback
    addresses only). An admin or the owner gets the 8-character CODE from the console or
    from chat; it works once, for 10 minutes. Pairing creates an Ed25519 key whose private
    half stays in your OS keyring (or in a 0600 --key-file), registers the public half, and
    pins the server's certificate: if the server uses its own CA, that CA becomes the only
    one trusted for it, so pass --fingerprint (shown to the admin) to rule out interception
    on this first connection.

    endpointd only works inside directories you allow: pairing asks for at least one (or
    takes --allow-root DIR, repeatable) and writes them into the local policy file
    (policy.toml in the config dir, see `endpointd policy show`), unless that file already
    lists some.

    \b
    Example:
      endpointd pair https://gw.example.com:8443 K7QM2XPA --fingerprint sha256:AB:… \\
          --allow-root ~/src
    """
    from endpointd.pairing import check_not_paired
    from endpointd.pairing import pair as do_pair
    from superagent_shared.gateway_tls import format_fingerprint, parse_fingerprint

    expected: bytes | None = None
    if fingerprint is not None:
        try:
            expected = parse_fingerprint(fingerprint)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--fingerprint") from None
    cfg = config_dir().path
    check_not_paired(cfg)
    roots = _roots_for_pairing(cfg, allow_roots)
    config = do_pair(
        url=url,
        code=code,
        device_name=name,
        key_file=key_file,
        fingerprint=expected,
        config_directory=cfg,
        allowed_roots=roots,
    )
    where = "OS keyring" if config.key.storage == "keyring" else config.key.path
    click.echo(
        f"paired with {config.server_name or config.server_url} as {config.device_id}"
        f" ({config.device_name})"
    )
    if config.trust.mode == "pinned":
        leaf = format_fingerprint(bytes.fromhex(config.trust.leaf_sha256))
        click.echo(f"server certificate pinned: {leaf}")
    click.echo(f"device key: {where}")
    if roots:
        listed = ", ".join(str(r) for r in roots)
        click.echo(f"policy: {cfg / 'policy.toml'} (allowed roots: {listed})")
    else:
        click.echo(f"policy: {cfg / 'policy.toml'} (kept as it is; `endpointd policy show`)")
    click.echo("next: `endpointd run`, or `endpointd service install --now` to start at login")


def _roots_for_pairing(cfg: Path, given: tuple[str, ...]) -> list[Path] | None:
    """The roots pairing must write into the policy, or None when it already has some.

    Settled before the pairing code is spent, so a typo or a refusal costs nothing.
    """
    import os

    from endpointd.policy import POLICY_FILE, allowed_root, roots_state

    state, current = roots_state(cfg)
    roots = [allowed_root(raw) for raw in given]
    if state == "set":
        known = {os.path.realpath(p) for p in current}
        extra = [str(r) for r in roots if os.path.realpath(r) not in known]
        if extra:
            raise EndpointdError(
                f"{cfg / POLICY_FILE} already lists allowed roots"
                f" ({', '.join(str(p) for p in current)}); add {', '.join(extra)} to"
                " allowed_roots there, or pair without --allow-root"
            )
        return None
    if roots:
        return roots
    if not sys.stdin.isatty():
        raise EndpointdError(
            "endpointd needs at least one directory it may work in: pass --allow-root DIR"
            " (repeatable), e.g. `endpointd pair URL CODE --allow-root ~/src`"
        )
    click.echo(
        "endpointd runs commands and reads or writes files only inside directories you"
        " allow (kept in policy.toml; `endpointd policy show` explains it).",
        err=True,
    )
    while True:
        prompt = "Directory to allow" if not roots else "Another directory (empty to finish)"
        raw = click.prompt(prompt, default="", show_default=False, err=True)
        if not raw.strip():
            if roots:
                return roots
            click.echo("  at least one directory is needed", err=True)
            continue
        try:
            roots.append(allowed_root(raw))
        except EndpointdError as exc:
            click.echo(f"  {exc}", err=True)


@cli.command()
@click.option(
    "--max-runtime",
    type=click.IntRange(min=1),
    help="Cap on any command's run time in seconds; also the limit when a command sets none"
    " (default: the config's default_timeout_seconds, 3600).",
)
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"]),
    default="info",
    show_default=True,
)
def run(max_runtime: int | None, log_level: str) -> None:
    """Run the daemon in the foreground: connect, execute commands, reconnect forever.

    Dials the paired control plane and keeps one stream open, retrying with backoff (1 s
    growing to 2 minutes) whenever it drops. Every command is journaled before it runs, so
    a redelivery never runs twice; running commands keep going across disconnects and even
    across a restart of this daemon, and their output is resent from where the server left
    off. Stop it with Ctrl-C or SIGTERM. Logs go to stderr; `endpointd status` shows what it
    is doing.
    """
    import asyncio

    from endpointd.runner import run_daemon

    if sys.platform == "win32":
        raise EndpointdError(
            "`endpointd run` needs POSIX process groups; Windows is not supported yet"
        )
    logging.basicConfig(
        level=log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    # gRPC's own INFO chatter about reconnects would drown ours.
    logging.getLogger("grpc").setLevel(logging.WARNING)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(
            run_daemon(
                config_directory=config_dir().path,
                state_directory=state_dir().path,
                max_timeout_seconds=max_runtime,
            )
        )


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def status(as_json: bool) -> None:
    """Show where this device is paired, whether the daemon is connected, what runs, and
    how commands are sandboxed.

    Reads the config, the running daemon's status file (checking that its process is still
    alive) and the command journal; it never contacts the server, so it answers instantly
    even when the network is down. The last connection error is shown, e.g. when the server
    has revoked this device.
    """
    from endpointd.report import collect_status, print_status
    from endpointd.status import sandbox_status

    report = collect_status(config_dir().path, state_dir().path)
    report["sandbox"], report["sandbox_from"] = sandbox_status(
        config_dir().path, state_dir().path, running=report["daemon"]["running"]
    )
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        print_status(report)
        source = "" if report["sandbox_from"] == "daemon" else " (from the policy file)"
        click.echo(f"sandbox:   {report['sandbox']}{source}")


@cli.command()
@click.option("--purge", is_flag=True, help="Also delete the command journal and output spools.")
def unpair(purge: bool) -> None:
    """Forget the pairing: delete the device key and the config.

    The private key is removed from the OS keyring (or its key file deleted), so this
    machine can no longer act as the device. The command journal is kept (it is the record
    of what ran here) unless --purge is given. The server still lists the device until an
    admin revokes it. Stop the daemon first.
    """
    from endpointd.config import delete_config, load_config
    from endpointd.keys import delete_key
    from endpointd.report import daemon_alive

    cfg_dir, st_dir = config_dir().path, state_dir().path
    config = load_config(cfg_dir)
    pid = daemon_alive(st_dir)
    if pid is not None:
        raise EndpointdError(
            f"endpointd is running (pid {pid}); stop it first (e.g. `systemctl --user stop"
            " endpointd`), then unpair"
        )
    removed = delete_key(config.key)
    delete_config(cfg_dir)
    where = "OS keyring" if config.key.storage == "keyring" else config.key.path
    click.echo(f"unpaired {config.device_id} from {config.server_name or config.server_url}")
    click.echo(f"device key {'deleted from' if removed else 'was already gone from'} {where}")
    if purge:
        shutil.rmtree(st_dir, ignore_errors=True)
        click.echo(f"journal and spools deleted ({st_dir})")
    click.echo("the server still lists this device until an admin revokes it")


@cli.group()
def service() -> None:
    """Install endpointd as a per-user service that starts at login.

    On Linux this writes a systemd user unit (~/.config/systemd/user/endpointd.service), on
    macOS a launchd agent (~/Library/LaunchAgents/dev.superagent.endpointd.plist), both
    running `endpointd run` with this Python and restarting it if it exits. The follow-up
    command is printed rather than run, unless you pass --now. ENDPOINTD_SERVICE_DIR
    overrides the target directory.
    """


@service.command("install")
@click.option("--now", is_flag=True, help="Also enable and start it right away.")
def service_install(now: bool) -> None:
    """Write the service file (and with --now enable and start it)."""
    from endpointd.service import install

    installed = install(now=now)
    click.echo(f"wrote {installed.path}")
    if now:
        click.echo("started: " + " ".join(installed.enable))
    else:
        click.echo("start it now and at every login with: " + " ".join(installed.enable))


@service.command("uninstall")
@click.option("--now", is_flag=True, help="Also stop and disable it first.")
def service_uninstall(now: bool) -> None:
    """Remove the service file (and with --now stop and disable it first)."""
    from endpointd.service import uninstall

    removed, existed = uninstall(now=now)
    if not existed:
        click.echo(f"nothing to remove: {removed.path} does not exist")
        return
    click.echo(f"removed {removed.path}")
    if not now:
        click.echo("if it is running, stop it with: " + " ".join(removed.disable))


# ---------------------------------------------------------------------------- credentials


@cli.group()
def creds() -> None:
    """Store credentials the agent may use without ever seeing them.

    Values live in your OS keyring (service superagent-endpointd); endpointd hands a value
    to a command only when the command's line matches the credential's scope in the local
    policy ([credentials.NAME] allow = [...] in policy.toml), and masks it, with its common
    encodings, in everything that leaves this machine. The control plane only ever knows
    the names.

    \b
    Examples:
      endpointd creds add github-token          # asks for the value, twice, hidden
      gh auth token | endpointd creds add github-token
      endpointd creds list
      endpointd creds rm github-token
    """


@creds.command("add")
@click.argument("name")
@click.option("--replace", is_flag=True, help="Overwrite an existing credential of this name.")
def creds_add(name: str, replace: bool) -> None:
    """Store a credential; its value is read from a hidden prompt or from stdin.

    In a terminal you are asked for the value twice, without echo; otherwise the value is
    read from stdin (one trailing newline removed). It is never taken from the command
    line, where other local users and shell history could see it. NAME is 1-64 lowercase
    letters, digits, '.', '_' or '-'. Values shorter than 8 characters and structured
    values (JSON, YAML) are refused: store each secret field as its own credential. Then
    allow commands to receive it in policy.toml, e.g. [credentials.github-token] allow =
    ["git *", "gh *"].
    """
    import getpass

    from endpointd.credentials import CredentialError, CredentialStore, check_name

    check_name(name)
    store = CredentialStore(config_dir().path)
    store.require_keyring()
    if sys.stdin.isatty():
        try:
            first = getpass.getpass(f"Value for {name} (hidden): ", stream=sys.stderr)
            second = getpass.getpass("Again, to confirm: ", stream=sys.stderr)
        except EOFError:
            raise CredentialError("no value entered; nothing stored") from None
        if first != second:
            raise CredentialError("the two values differ; nothing stored")
        value = first.encode("utf-8")
    else:
        value = sys.stdin.buffer.read()
        if value.endswith(b"\r\n"):
            value = value[:-2]
        elif value.endswith(b"\n"):
            value = value[:-1]
        if not value:
            raise CredentialError(
                "no value on stdin: pipe it in (e.g. `gh auth token | endpointd creds add"
                f" {name}`) or run this in a terminal to be asked; values are never taken"
                " from the command line"
            )
    store.add(name, value, replace=replace)
    click.echo(f"stored credential {name} in the OS keyring")
    scopes = _scopes()
    if scopes is not None and name not in scopes:
        click.echo(
            f"no command may receive it yet: add [credentials.{name}] with"
            f' allow = ["<command glob>"] to {config_dir().path / "policy.toml"}'
        )


def _scopes() -> dict[str, tuple[str, ...]] | None:
    """The policy's credential scopes, or None (with a warning) when it is unusable."""
    from endpointd.policy import load_policy

    policy = load_policy(config_dir().path, state_directory=state_dir().path)
    if policy.rules is None:
        click.echo(f"warning: {policy.error}", err=True)
        return None
    return {name: scope.allow for name, scope in policy.rules.credentials.items()}


@creds.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def creds_list(as_json: bool) -> None:
    """Show stored credentials: names, scopes and last use, never values.

    The scope is the list of command globs that may receive the credential, from the
    policy file's [credentials.NAME] table; a credential without one cannot be delivered
    to any command. Names with a scope but no stored value are listed too, as not stored.
    This reads only endpointd's own files, never the keyring.
    """
    from endpointd.credentials import CredentialStore

    infos = {i.name: i for i in CredentialStore(config_dir().path).info()}
    scopes = _scopes()
    names = sorted(set(infos) | set(scopes or {}))
    rows: list[dict[str, Any]] = []
    for name in names:
        info = infos.get(name)
        rows.append(
            {
                "name": name,
                "stored": info is not None,
                "scope": list(scopes[name]) if scopes is not None and name in scopes else None,
                "added_at": info.added_at if info else None,
                "last_used_at": info.last_used_at if info else None,
            }
        )
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        click.echo("no credentials stored; add one with `endpointd creds add NAME`")
        return
    for row in rows:
        if scopes is None:
            scope = "? (the policy file is unusable)"
        elif row["scope"] is None:
            scope = "none: not delivered to any command"
        else:
            scope = ", ".join(row["scope"]) or "none (empty allow list)"
        if not row["stored"]:
            used = "NOT STORED (`endpointd creds add` it)"
        else:
            used = f"added {row['added_at']}, last used {row['last_used_at'] or 'never'}"
        click.echo(f"{row['name']}\n  scope: {scope}\n  {used}")


@creds.command("rm")
@click.argument("name")
def creds_rm(name: str) -> None:
    """Delete a credential from the OS keyring and from endpointd's list.

    Commands already running keep what they were given; new commands naming it are
    refused. Its [credentials.NAME] scope in policy.toml, if any, stays until you remove
    it, so adding the credential again restores the same access.
    """
    from endpointd.credentials import CredentialStore

    CredentialStore(config_dir().path).remove(name)
    click.echo(f"removed credential {name}")


# ---------------------------------------------------------------------------- policy


@cli.group("policy")
def policy_group() -> None:
    """Inspect the local policy: where the agent may work and what it may run.

    The policy file is policy.toml in the config dir (`endpointd info` shows where). It is
    yours: the control plane cannot change it, it only sees its hash. It lists allowed
    roots, denied paths, allow/deny/ask command rules, which commands may receive each
    credential, and limits; the shipped example documents every key. Edits apply at once.

    \b
    Examples:
      endpointd policy check "git push --force origin main"
      endpointd policy check --cwd ~/src/app --credential github-token git fetch
      endpointd policy check --path ~/.ssh/id_ed25519
      endpointd policy show
      endpointd policy init --allow-root ~/src
    """


_EXIT_CODES = {"allow": 0, "ask": 3, "deny": 4}


@policy_group.command("check")
@click.argument("command", nargs=-1)
@click.option("--cwd", metavar="DIR", help="Working directory (default: the first allowed root).")
@click.option(
    "--credential",
    "credentials",
    multiple=True,
    metavar="NAME",
    help="A credential the command asks for (repeatable).",
)
@click.option("--path", metavar="PATH", help="Check a file read, write or listing of PATH instead.")
@click.option(
    "--op",
    type=click.Choice(["read", "write", "list"]),
    default="read",
    show_default=True,
    help="With --path: which file operation (read_file, write_file, list_dir).",
)
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
@click.pass_context
def policy_check(
    ctx: click.Context,
    command: tuple[str, ...],
    cwd: str | None,
    credentials: tuple[str, ...],
    path: str | None,
    op: str,
    as_json: bool,
) -> None:
    """Explain which rule applies to a command and what it decides.

    COMMAND is one quoted command line (split like a shell would) or the argv words
    themselves (put `--` before words that start with a dash). Every step is shown: the
    working directory against the allowed roots and denied paths, the first matching
    command rule (or default_action), then each credential's scope. The exit status is the
    decision, for scripts: 0 allow, 3 ask (held for `endpointd approve`), 4 deny; 1 and 2
    are errors as for every command. With --path, the steps are the file operation's
    (--op): allowed roots and denied paths, the first matching [[files]] rule, the
    built-in protected paths (writes), then default_action.
    """
    import os
    import shlex

    from endpointd.policy import FileOp, expand_path, load_policy
    from superagent_proto.v1 import endpoint_pb2 as pb

    if bool(path) == bool(command):
        raise click.UsageError("give either a COMMAND or --path PATH")
    policy = load_policy(config_dir().path, state_directory=state_dir().path)
    if path is not None:
        target = os.path.abspath(expand_path(path))
        file_op: FileOp = "write" if op == "write" else "list" if op == "list" else "read"
        decision = policy.check_path(target, file_op)
        explanation = policy.explain_path(target, file_op)
    else:
        try:
            argv = shlex.split(command[0]) if len(command) == 1 else list(command)
        except ValueError as exc:
            raise click.BadParameter(f"cannot split the command: {exc}") from None
        if not argv:
            raise click.BadParameter("the command is empty")
        where = os.path.abspath(expand_path(cwd)) if cwd else ""
        decision = policy.check(
            pb.Command(
                exec=pb.ExecCommand(argv=argv, cwd=where),
                credentials=[pb.CredentialRef(name=n) for n in credentials],
            )
        )
        explanation = policy.explain(argv, where or None, list(credentials))
    if as_json:
        report = {
            "action": decision.action,
            "rule": decision.rule,
            "message": decision.message,
            "explanation": explanation.splitlines(),
        }
        click.echo(json.dumps(report, indent=2))
    else:
        click.echo(explanation)
    ctx.exit(_EXIT_CODES[decision.action])


@policy_group.command("show")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def policy_show(as_json: bool) -> None:
    """Print the policy file's path, its hash, the sandbox and the rules in effect.

    The hash is what this device reports to the control plane, so an admin can match it.
    It covers the file and the sandbox mode in effect on this machine (the same file hashes
    differently where the sandbox cannot be enforced).
    Defaults are included: denied paths built into endpointd are marked (default) and
    apply whatever the file says. If the file is missing or broken, that is said (and the
    exit status is 1): endpointd then refuses every command until it is fixed.
    """
    from endpointd.policy import load_policy

    policy = load_policy(config_dir().path, state_directory=state_dir().path)
    rules = policy.rules
    report: dict[str, Any] = {
        "path": str(policy.path),
        "sha256": policy.hash().hex(),
        "error": policy.error,
        "sandbox": policy.sandbox_summary,
        "allowed_roots": [str(p) for p in policy.allowed_roots],
        "default_root": str(policy.default_root) if policy.allowed_roots else None,
        "denied_paths": [
            {"path": str(d.path), "label": d.label, "default": d.default}
            for d in policy.denied_paths
        ],
        "commands": [
            {"rule": c.rule, "action": c.action, "match": c.match, "name": c.name}
            for c in (rules.commands if rules else ())
        ],
        "default_action": rules.default_action if rules else None,
        "credentials": {
            k: {"allow": list(v.allow), "hosts": list(v.hosts), "header": v.header}
            for k, v in (rules.credentials if rules else {}).items()
        },
        "limits": {
            "max_runtime_seconds": policy.limits.max_runtime_seconds,
            "max_output_bytes": policy.limits.max_output_bytes,
            "ask_timeout_seconds": policy.limits.ask_timeout_seconds,
        },
    }
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        _print_policy(report)
    if policy.error is not None:
        raise EndpointdError(f"{policy.error} (every command is refused until this is fixed)")


def _print_policy(report: dict[str, Any]) -> None:
    click.echo(f"policy file: {report['path']}")
    click.echo(f"sha256:      {report['sha256']} (of the file and the sandbox mode in effect)")
    click.echo(f"sandbox:     {report['sandbox']}")
    if report["error"] is not None:
        return
    click.echo("allowed roots:")
    for root in report["allowed_roots"] or ["(none: every command is refused)"]:
        click.echo(f"  {root}")
    if report["default_root"]:
        click.echo(f"  (commands without a working directory run in {report['default_root']})")
    click.echo("denied paths:")
    for denied in report["denied_paths"]:
        note = "  (default)" if denied["default"] else ""
        shown = (
            denied["label"]
            if denied["label"] == denied["path"]
            else (f"{denied['label']} = {denied['path']}")
        )
        click.echo(f"  {shown}{note}")
    click.echo("commands (first match wins):")
    for rule in report["commands"]:
        click.echo(f"  {rule['action']:<5}  {rule['rule']}")
    click.echo(f"  {report['default_action']:<5}  default_action (when no rule matches)")
    click.echo("credential scopes:")
    if not report["credentials"]:
        click.echo("  (none: no credential can be delivered)")
    for name, globs in report["credentials"].items():
        click.echo(f"  {name}: {', '.join(globs) or '(empty: never delivered)'}")
    limits = report["limits"]
    click.echo(
        f"limits: max_runtime_seconds={limits['max_runtime_seconds']}"
        f" max_output_bytes={limits['max_output_bytes']}"
        f" ask_timeout_seconds={limits['ask_timeout_seconds']}"
    )


@policy_group.command("init")
@click.option(
    "--allow-root",
    "allow_roots",
    multiple=True,
    metavar="DIR",
    help="A directory to list in allowed_roots (repeatable).",
)
def policy_init(allow_roots: tuple[str, ...]) -> None:
    """Write the documented example policy, if there is no policy file yet.

    The example explains every key and starts with default_action = "allow", a few deny
    and ask rules, and no credential scopes. Without --allow-root its allowed_roots list is
    empty, which refuses every command until you add a directory; `endpointd pair` writes
    the file the same way with the directories you give it.
    """
    from endpointd.policy import allowed_root, write_policy

    roots = [allowed_root(raw) for raw in allow_roots]
    path = write_policy(config_dir().path, roots)
    click.echo(f"wrote {path}")
    if not roots:
        click.echo("allowed_roots is empty: every command is refused until you add a directory")


# ---------------------------------------------------------------------------- approvals


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
@click.option(
    "--show",
    "show_id",
    metavar="ID",
    help="Print one request whole: nothing cut, every argument, the stdin preview.",
)
def approvals(as_json: bool, show_id: str | None) -> None:
    """List commands waiting for your approval on this machine.

    A command matching an "ask" rule of the local policy is held, and the control plane
    shows it as waiting for local approval, until you run `endpointd approve ID` or
    `endpointd deny ID`; nobody answering before limits.ask_timeout_seconds (default 5
    minutes) denies it. Each entry shows what would run: the whole command, its directory,
    the environment variables it sets, the start of its stdin (with its size and SHA-256),
    the credentials it gets and how, who asked, the rule, and the time left. Long text is
    wrapped; a field too long to list is cut with its length and SHA-256, and `endpointd
    approvals --show ID` prints it all. Control characters are shown escaped (a newline as
    \\n), so every line break you see is a wrap. A desktop notification is shown where
    notify-send or osascript exists.
    """
    from endpointd.approvals import Approvals, header, render
    from endpointd.approvals import as_json as request_json

    queue = Approvals(state_dir().path)
    if show_id is not None:
        request = queue.show(show_id)
        if as_json:
            click.echo(json.dumps(request_json(request), indent=2))
            return
        click.echo(header(request))
        for line in render(request, full=True):
            click.echo(line)
        return
    pending = queue.pending()
    if as_json:
        click.echo(json.dumps([request_json(r) for r in pending], indent=2))
        return
    if not pending:
        click.echo("no commands are waiting for approval")
        return
    for r in pending:
        click.echo(header(r))
        for line in render(r):
            click.echo(line)
    click.echo("answer with `endpointd approve ID` or `endpointd deny ID`")


@cli.command()
@click.argument("command_id", metavar="ID")
def approve(command_id: str) -> None:
    """Let a command held by an "ask" rule run.

    ID is the command id shown by `endpointd approvals` (a unique prefix is enough). The
    daemon starts the command within a moment. An id that is unknown, already answered or
    timed out is an error and changes nothing; approving never changes the policy itself.
    Only you can approve: this is refused when run by a command endpointd started, and the
    daemon ignores any answer not made by this command (it is signed with a key the
    running daemon made and commands cannot read), noting the attempt in the audit log.
    Look at the request first (`endpointd approvals`, `endpointd approvals --show ID`).
    """
    from endpointd.approvals import Approvals, printable

    request = Approvals(state_dir().path).decide(command_id, approve=True)
    click.echo(f"approved {printable(request.command_id)}: {printable(request.summary)}")


@cli.command()
@click.argument("command_id", metavar="ID")
def deny(command_id: str) -> None:
    """Refuse a command held by an "ask" rule.

    ID is the command id shown by `endpointd approvals` (a unique prefix is enough). The
    control plane is told the user denied it on the device, and the refusal is written to
    the audit log. An id that is unknown, already answered or timed out is an error and
    changes nothing. Like `endpointd approve`, this is refused when run by a command
    endpointd started.
    """
    from endpointd.approvals import Approvals, printable

    request = Approvals(state_dir().path).decide(command_id, approve=False)
    click.echo(f"denied {printable(request.command_id)}: {printable(request.summary)}")


# ---------------------------------------------------------------------------- audit


@cli.command()
@click.option("--tail", type=click.IntRange(min=1), metavar="N", help="Only the last N entries.")
@click.option("--json", "as_json", is_flag=True, help="Print the raw JSON lines.")
def audit(tail: int | None, as_json: bool) -> None:
    """Show the local audit log: every refused command and every approval outcome.

    The log is audit.log in the state dir, one JSON object per line (time, event,
    command_id, rule, detail), readable only by you and never sent anywhere. Events include
    refused, approved, denied and approval_timeout; the rule is named as in policy.toml,
    so `endpointd policy check` can tell you why.
    """
    from endpointd.approvals import printable
    from endpointd.audit import AuditLog

    entries = AuditLog(state_dir().path).tail(tail)
    if as_json:
        for entry in entries:
            click.echo(json.dumps(entry, ensure_ascii=False))
        return
    if not entries:
        click.echo("the audit log is empty")
        return
    for e in entries:
        line = (
            f"{e.get('time', '?')}  {e.get('event', '?')}  {e.get('command_id', '')}"
            f"  {e.get('rule', '')}: {e.get('detail', '')}"
        )
        click.echo(printable(line, limit=2000))


def main() -> None:
    """Console-script entry point (`endpointd = endpointd.cli:main`)."""
    # A fixed prog_name keeps usage lines reading `endpointd …` under `python -m endpointd`.
    cli(prog_name="endpointd")
