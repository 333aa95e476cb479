"""The unit tier: pure logic, no network, no process of its own, no TensorFlow.

Unit tests never read this machine's ssh config: the default user and system files are paths
that do not exist. They start no process: the one exception is `ssh -G`, which is how an
inventory is resolved (OpenSSH's own reading of a config, deploy/inventory/openssh.py) and
which reads files and touches no network. A test that needs a host's agent, sshd, git or
TensorFlow belongs in tests/integration/ (docs/testing.md, "Tiers").
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from deploy.inventory import sshconfig


class ProcessStarted(AssertionError):
    """A unit test started a process: it belongs in tests/integration/."""


def _refuse(what):
    raise ProcessStarted("a unit test started a process (%s): move it to tests/integration/"
                         % what)


def _is_ssh_resolution(args):
    words = [os.fsdecode(a) for a in ([args] if isinstance(args, (str, bytes)) else args)]
    return bool(words) and os.path.basename(words[0]) == "ssh" and "-G" in words[1:]


@pytest.fixture(autouse=True)
def no_process_starts():
    """Every way Python starts a process, refused in each unit test (and given back after it:
    a test of another tier may run next in the same session)."""
    real_execute = subprocess.Popen._execute_child

    def execute_child(self, args, *rest, **kwargs):
        if not _is_ssh_resolution(args):
            _refuse(" ".join(map(str, [args] if isinstance(args, (str, bytes)) else args))[:120])
        return real_execute(self, args, *rest, **kwargs)

    def refused(name):
        return lambda *args, **kwargs: _refuse("os.%s" % name)

    names = [n for n in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system", "execv",
                         "execve", "execvp", "execvpe", "execl", "execle", "execlp", "execlpe",
                         "spawnv", "spawnve", "spawnvp", "spawnvpe")
             if hasattr(os, n)]
    saved = {n: getattr(os, n) for n in names}
    subprocess.Popen._execute_child = execute_child
    for n in names:
        setattr(os, n, refused(n))
    try:
        yield
    finally:
        subprocess.Popen._execute_child = real_execute
        for n, f in saved.items():
            setattr(os, n, f)


@pytest.fixture(autouse=True)
def no_tensorflow():
    """TensorFlow takes seconds to import and starts threads: a unit test never needs it."""
    yield
    assert "tensorflow" not in sys.modules, "a unit test imported tensorflow"


@pytest.fixture(autouse=True)
def no_ssh_config_of_this_machine(tmp_path, monkeypatch):
    monkeypatch.setattr(sshconfig, "USER_FILE", str(tmp_path / "no-user-ssh-config"))
    monkeypatch.setattr(sshconfig, "SYSTEM_FILE", str(tmp_path / "no-system-ssh-config"))
