"""`endpointd service install|uninstall`: run the daemon at login via the OS service manager.

Linux gets a systemd **user** unit (no root needed; runs while the user is logged in, or
always with `loginctl enable-linger`), macOS a launchd agent. ``KillMode=process`` matters:
by default systemd kills the whole cgroup when the daemon stops or crashes, which would take
the running commands with it, whereas endpointd's design is that commands outlive the
daemon and are re-attached by the next one (see ``endpointd.process.supervisor``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import escape

from endpointd.errors import ServiceError
from endpointd.paths import CONFIG_DIR_ENV, DATA_DIR_ENV, STATE_DIR_ENV

SYSTEMD_UNIT = "endpointd.service"
LAUNCHD_LABEL = "dev.superagent.endpointd"
# Tests (and unusual setups) point this at a scratch directory instead of the real one.
SERVICE_DIR_ENV = "ENDPOINTD_SERVICE_DIR"


@dataclass(frozen=True)
class ServiceFile:
    path: Path
    content: str
    enable: list[str]  # command that starts it now and at every login
    disable: list[str]  # command that stops it and keeps it from starting


def _quote_systemd(arg: str) -> str:
    # systemd splits ExecStart like a shell; quote anything with spaces or quotes.
    if arg and all(c.isalnum() or c in "/._-+:=," for c in arg):
        return arg
    return '"' + arg.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _environment() -> dict[str, str]:
    # Carry explicit directory overrides into the service so it uses the same files as
    # the `endpointd pair` that preceded it.
    return {
        k: os.environ[k] for k in (CONFIG_DIR_ENV, STATE_DIR_ENV, DATA_DIR_ENV) if os.environ.get(k)
    }


def service_file(platform: str | None = None, directory: Path | None = None) -> ServiceFile:
    platform = platform or sys.platform
    override = os.environ.get(SERVICE_DIR_ENV)
    exec_args = [sys.executable, "-m", "endpointd", "run"]
    env = _environment()
    if platform.startswith("linux"):
        base = directory or (
            Path(override) if override else Path.home() / ".config" / "systemd" / "user"
        )
        env_lines = "".join(f"Environment={_quote_systemd(f'{k}={v}')}\n" for k, v in env.items())
        content = (
            "[Unit]\n"
            "Description=endpointd: super-agent device daemon\n"
            "After=network-online.target\n"
            "Wants=network-online.target\n\n"
            "[Service]\n"
            f"ExecStart={' '.join(_quote_systemd(a) for a in exec_args)}\n"
            f"{env_lines}"
            "Restart=always\n"
            "RestartSec=5\n"
            "# Commands run detached under their own supervisors and must survive a daemon\n"
            "# restart; only the daemon process itself is stopped.\n"
            "KillMode=process\n\n"
            "[Install]\n"
            "WantedBy=default.target\n"
        )
        return ServiceFile(
            path=base / SYSTEMD_UNIT,
            content=content,
            enable=["systemctl", "--user", "enable", "--now", "endpointd"],
            disable=["systemctl", "--user", "disable", "--now", "endpointd"],
        )
    if platform == "darwin":
        base = directory or (
            Path(override) if override else Path.home() / "Library" / "LaunchAgents"
        )
        path = base / f"{LAUNCHD_LABEL}.plist"
        args = "".join(f"    <string>{escape(a)}</string>\n" for a in exec_args)
        env_xml = ""
        if env:
            pairs = "".join(
                f"    <key>{escape(k)}</key><string>{escape(v)}</string>\n" for k, v in env.items()
            )
            env_xml = f"  <key>EnvironmentVariables</key>\n  <dict>\n{pairs}  </dict>\n"
        logs = Path.home() / "Library" / "Logs" / "endpointd.log"
        content = (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            '<!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN"'
            ' "http://www.apple.com/DTDs/PropertyList-1.0.dtd">\n'
            '<plist version="1.0">\n<dict>\n'
            f"  <key>Label</key><string>{LAUNCHD_LABEL}</string>\n"
            f"  <key>ProgramArguments</key>\n  <array>\n{args}  </array>\n"
            f"{env_xml}"
            "  <key>RunAtLoad</key><true/>\n"
            "  <key>KeepAlive</key><true/>\n"
            # launchd kills the job's whole process group on stop unless told otherwise;
            # supervisors use their own sessions, so they survive either way.
            "  <key>AbandonProcessGroup</key><true/>\n"
            f"  <key>StandardOutPath</key><string>{escape(str(logs))}</string>\n"
            f"  <key>StandardErrorPath</key><string>{escape(str(logs))}</string>\n"
            "</dict>\n</plist>\n"
        )
        return ServiceFile(
            path=path,
            content=content,
            enable=["launchctl", "load", "-w", str(path)],
            disable=["launchctl", "unload", "-w", str(path)],
        )
    raise ServiceError(
        f"`endpointd service` supports Linux (systemd) and macOS (launchd), not {platform};"
        " run `endpointd run` from your own service manager instead"
    )


def install(*, now: bool) -> ServiceFile:
    service = service_file()
    try:
        service.path.parent.mkdir(parents=True, exist_ok=True)
        service.path.write_text(service.content, encoding="utf-8")
    except OSError as exc:
        raise ServiceError(f"cannot write {service.path}: {exc.strerror}") from None
    if now:
        if service.path.name == SYSTEMD_UNIT:
            _run(["systemctl", "--user", "daemon-reload"])
        _run(service.enable)
    return service


def uninstall(*, now: bool) -> tuple[ServiceFile, bool]:
    service = service_file()
    if now and service.path.exists():
        _run(service.disable)
    try:
        service.path.unlink()
    except FileNotFoundError:
        return service, False
    except OSError as exc:
        raise ServiceError(f"cannot remove {service.path}: {exc.strerror}") from None
    return service, True


def _run(argv: list[str]) -> None:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    except OSError as exc:
        raise ServiceError(f"cannot run {argv[0]}: {exc.strerror}") from None
    if proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip().splitlines()
        raise ServiceError(
            f"`{' '.join(argv)}` failed: {detail[-1] if detail else proc.returncode}"
        )
