"""Unit tests never read this machine's ssh config: the default user and system files are
paths that do not exist."""
from __future__ import annotations

import pytest

from deploy.inventory import sshconfig


@pytest.fixture(autouse=True)
def no_ssh_config_of_this_machine(tmp_path, monkeypatch):
    monkeypatch.setattr(sshconfig, "USER_FILE", str(tmp_path / "no-user-ssh-config"))
    monkeypatch.setattr(sshconfig, "SYSTEM_FILE", str(tmp_path / "no-system-ssh-config"))
