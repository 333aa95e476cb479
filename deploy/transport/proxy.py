"""ProxyCommand as OpenSSH runs it: `exec <command>` through the user's shell ($SHELL, else
/bin/sh), its tokens already expanded when the inventory was loaded, SSH spoken over its
stdin and stdout (paramiko's ProxyCommand socket, which ends the command when closed)."""
from __future__ import annotations

import os
import shlex

import paramiko

from deploy.transport.base import LoginFailed


def shell_line(command: str) -> str:
    """The command line paramiko splits and runs: the shell, `-c` and `exec <command>`."""
    shell = os.environ.get("SHELL") or "/bin/sh"
    return shlex.join([shell, "-c", f"exec {command}"])


def open_proxy(command: str, where: str) -> paramiko.ProxyCommand:
    try:
        return paramiko.ProxyCommand(shell_line(command))
    except paramiko.ProxyCommandFailure as exc:
        raise LoginFailed(f"{where}: cannot run the ProxyCommand {command!r}: {exc}") from None
