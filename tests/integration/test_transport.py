"""What a failed command's result says about it; what a local host's commands see."""
from __future__ import annotations

import os
import pwd

from deploy.inventory.load import parse_inventory
from deploy.transport.base import CommandResult
from deploy.transport.local import LocalTransport, login_environment


def test_the_error_is_the_last_line_or_a_crashs_headline():
    assert CommandResult(1, b"", b"Traceback ...\n  File x\nValueError: bad\n").error_text() \
        == "ValueError: bad"
    crash = (b"Fatal Python error: _enter_buffered_busy: could not acquire lock\n"
             b"Python runtime state: finalizing\n\nThread 0x7f (most recent call first):\n"
             b"  <no Python frame>\n")
    assert CommandResult(134, b"{}\n", crash).error_text().startswith(
        "Fatal Python error: _enter_buffered_busy")
    assert CommandResult(3, b"", b"").error_text() == "exit code 3"


def test_a_local_host_gets_a_logins_environment_and_nothing_else_of_this_shell(monkeypatch):
    """As an SSH host's commands get sshd's: what a login gives, and LANG and LC_* as ssh
    sends them; the controller's tokens stay here (a task needing one names it in `env`)."""
    env = login_environment({"HOME": "/home/u", "PATH": "/venv/bin:/usr/bin", "LANG": "C.UTF-8",
                             "LC_TIME": "C", "AWS_SECRET_ACCESS_KEY": "k", "PYTHONPATH": "/x"})
    account = pwd.getpwuid(os.getuid())
    assert env == {"HOME": "/home/u", "USER": account.pw_name, "LOGNAME": account.pw_name,
                   "SHELL": account.pw_shell, "PATH": "/venv/bin:/usr/bin", "LANG": "C.UTF-8",
                   "LC_TIME": "C"}
    assert login_environment({})["HOME"] == account.pw_dir
    monkeypatch.setenv("TFDEPLOY_TEST_TOKEN", "s3cr3t")
    host = parse_inventory("hosts:\n  - {name: h, transport: local}\n", "h.yaml", {}).hosts[0]
    seen = LocalTransport(host).run("env").stdout.decode()
    assert "TFDEPLOY_TEST_TOKEN" not in seen and f"PATH={os.environ['PATH']}\n" in seen


class Flood:
    """A stream whose one line never ends."""

    def __init__(self):
        self.left = 8 << 20

    def readline(self, limit: int = -1) -> bytes:
        n = self.left if limit < 0 else min(limit, self.left)
        self.left -= n
        return b"x" * n


def test_a_hosts_lines_come_in_bounded_pieces():
    """An endless line from a host (inv setup's build) is read a piece at a time."""
    from deploy.transport.base import LINE_LIMIT
    from deploy.transport.ssh import SshStream
    stream = SshStream.__new__(SshStream)
    stream.readline = Flood().readline
    pieces = list(SshStream.__iter__(stream))
    assert len(pieces) == 8 and all(len(p) == LINE_LIMIT for p in pieces)
