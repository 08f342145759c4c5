"""Where the tickets' workspaces live: the data dir, by platform, and never inside the
config or state dirs (every command is denied those)."""

from __future__ import annotations

from pathlib import Path

import pytest

from endpointd.guard.files import within
from endpointd.paths import config_dir, data_dir, state_dir

HOME = Path("/home/dev")


@pytest.mark.parametrize(
    ("platform", "env", "expected", "source"),
    [
        ("linux", {}, HOME / ".local/share/endpointd", "XDG default"),
        ("linux", {"XDG_DATA_HOME": "/xd"}, Path("/xd/endpointd"), "$XDG_DATA_HOME"),
        # The XDG spec: a relative value is invalid and ignored.
        ("linux", {"XDG_DATA_HOME": "rel"}, HOME / ".local/share/endpointd", "XDG default"),
        ("freebsd14", {}, HOME / ".local/share/endpointd", "XDG default"),
        (
            "darwin",
            {"XDG_DATA_HOME": "/xd"},
            HOME / "Library/Application Support/endpointd-data",
            "macOS default",
        ),
        ("win32", {"LOCALAPPDATA": "/local"}, Path("/local/endpointd-data"), "%LOCALAPPDATA%"),
        ("win32", {}, HOME / "AppData/Local/endpointd-data", "Windows default"),
        (
            "linux",
            {"ENDPOINTD_DATA_DIR": "/d", "XDG_DATA_HOME": "/xd"},
            Path("/d"),
            "ENDPOINTD_DATA_DIR",
        ),
    ],
)
def test_data_dir_follows_platform_conventions(
    platform: str, env: dict[str, str], expected: Path, source: str
) -> None:
    found = data_dir(env=env, platform=platform, home=HOME)
    assert (found.path, found.source) == (expected, source)


def test_a_relative_override_is_made_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert data_dir(env={"ENDPOINTD_DATA_DIR": "d"}, platform="linux").path == tmp_path / "d"


@pytest.mark.parametrize("platform", ["linux", "darwin", "win32", "freebsd14"])
@pytest.mark.parametrize(
    "env",
    [
        {},
        {"XDG_CONFIG_HOME": "/x/c", "XDG_STATE_HOME": "/x/s", "XDG_DATA_HOME": "/x/d"},
        {"APPDATA": "/a", "LOCALAPPDATA": "/a"},
        {"LOCALAPPDATA": "/l"},
    ],
)
def test_the_data_dir_is_never_inside_the_config_or_state_dir(
    platform: str, env: dict[str, str]
) -> None:
    data = str(data_dir(env=env, platform=platform, home=HOME).path)
    for denied in (config_dir, state_dir):
        other = str(denied(env=env, platform=platform, home=HOME).path)
        assert not within(data, other), (platform, env, data, other)
        assert not within(other, data), (platform, env, data, other)
