"""ProxyCommand as OpenSSH runs it: `exec <command>` through the user's shell ($SHELL, else
/bin/sh), its tokens already expanded when the inventory was loaded, SSH spoken over its
stdin and stdout (paramiko's ProxyCommand socket, which ends the command when closed), its
stderr read as it comes: a proxy that says much there would otherwise stall on a full pipe, and
what it said last is what explains a login that failed through it."""
from __future__ import annotations

import os
import shlex
import threading

import paramiko

from deploy.transport.base import LoginFailed

# What is kept of the command's stderr: its last bytes, enough for a few lines of why.
SAID_KEPT = 2048


def shell_line(command: str) -> str:
    """The command line paramiko splits and runs: the shell, `-c` and `exec <command>`."""
    shell = os.environ.get("SHELL") or "/bin/sh"
    return shlex.join([shell, "-c", f"exec {command}"])


class DrainedProxyCommand(paramiko.ProxyCommand):
    """paramiko's ProxyCommand (which pipes the command's stderr and never reads it), its
    stderr read by a thread of its own to the end; the last SAID_KEPT bytes are kept."""

    def __init__(self, command_line: str):
        super().__init__(command_line)
        self._said = bytearray()
        self._lock = threading.Lock()
        self._drainer = threading.Thread(target=self._drain, daemon=True, name="proxy-stderr")
        self._drainer.start()

    def _drain(self) -> None:
        stream = self.process.stderr
        while chunk := stream.read(4096):
            with self._lock:
                self._said += chunk
                del self._said[:-SAID_KEPT]

    def said(self) -> str:
        """Its last lines on stderr, on one line ("" if none), as text (the console shows
        it inert, as every message). Once the command has ended, all it wrote is read first."""
        if self.process.poll() is not None:
            self._drainer.join(1.0)
        with self._lock:
            text = bytes(self._said).decode("utf-8", "replace")
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        return " | ".join(lines[-5:])


def open_proxy(command: str, where: str) -> DrainedProxyCommand:
    try:
        return DrainedProxyCommand(shell_line(command))
    except paramiko.ProxyCommandFailure as exc:
        raise LoginFailed(f"{where}: cannot run the ProxyCommand {command!r}: {exc}") from None
