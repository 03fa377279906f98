"""Local secrets and sockets live where only this user can reach them: the embedded Redis's
socket (in the state folder, or a 0700 folder of this user's own when that path is too long),
the local Flower's generated password (0600, made once)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from dtask.exceptions import ConfigurationError
from dtask.local.stack import local_flower_password
from dtask.services import embedded


@pytest.fixture
def tmp_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def test_a_short_home_keeps_the_socket_in_the_state_folder(tmp_root: Path) -> None:
    assert embedded.redis_socket(tmp_root / "h") == tmp_root / "h" / "redis" / "redis.sock"


def test_a_long_home_puts_the_socket_in_a_private_folder_never_a_shared_name(
    tmp_root: Path,
) -> None:
    home = tmp_root / ("x" * 120)
    socket = embedded.redis_socket(home)
    assert socket.parent == tmp_root / f"dtask-{os.getuid()}"
    assert socket.parent.stat().st_mode & 0o777 == 0o700
    assert len(str(socket)) < 108 and embedded.redis_socket(home) == socket


def test_a_private_folder_others_can_write_is_refused(tmp_root: Path) -> None:
    squatted = tmp_root / f"dtask-{os.getuid()}"
    squatted.mkdir(mode=0o777)
    squatted.chmod(0o777)
    with pytest.raises(ConfigurationError, match="is not a private folder of this user"):
        embedded.redis_socket(tmp_root / ("x" * 120))


def test_the_local_flower_password_is_made_once_and_private(tmp_path: Path) -> None:
    first = local_flower_password(tmp_path / "home")
    path = tmp_path / "home" / "flower-password"
    assert len(first) >= 20 and path.stat().st_mode & 0o777 == 0o600
    path.chmod(0o644)  # loosened by hand: tightened again, same password
    assert local_flower_password(tmp_path / "home") == first
    assert path.stat().st_mode & 0o777 == 0o600
