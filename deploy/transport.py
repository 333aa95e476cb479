"""One interface for running commands on a host, with two implementations: SSH (one Fabric
connection per host, reused for every step; see sshlogin.py) and local subprocesses for
`transport: local`.

Both run a command line in a POSIX shell, feed it bytes on stdin and return its exit code and
output as bytes, so the executor never knows which kind of host it talks to.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
from dataclasses import dataclass
from typing import Protocol

import paramiko

from .inventory import Host
from .sshlogin import HostLogin, LoginFailed

SEND_SLICE = 256 << 10


@dataclass(frozen=True)
class CommandResult:
    code: int
    stdout: bytes
    stderr: bytes

    def error_text(self) -> str:
        text = (self.stderr or self.stdout).decode("utf-8", "replace").strip()
        return text.splitlines()[-1] if text else f"exit code {self.code}"


class TransportError(Exception):
    """The host could not be reached or the command could not be run at all."""


class Transport(Protocol):
    host: Host

    def run(self, line: str, stdin: bytes = b"", timeout: float | None = 60.0) -> CommandResult: ...

    def stream(self, line: str) -> "LineStream": ...

    def close(self) -> None: ...


class LineStream(Protocol):
    """Output lines of a long-running command, read as they come; close() abandons it."""

    def __iter__(self): ...

    def send(self, data: bytes) -> None: ...

    def close(self) -> None: ...


class LocalStream:
    def __init__(self, line: str):
        # Its own session, so that closing it ends exactly this command and its children.
        self.proc = subprocess.Popen(["/bin/sh", "-c", line], stdout=subprocess.PIPE,
                                     stdin=subprocess.PIPE, start_new_session=True,
                                     cwd=os.path.expanduser("~"))

    def __iter__(self):
        return iter(self.proc.stdout)

    def send(self, data: bytes) -> None:
        try:
            self.proc.stdin.write(data)
            self.proc.stdin.flush()
        except (OSError, ValueError) as exc:
            raise TransportError(f"local stream: {exc}") from None

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        self.proc.wait()
        self.proc.stdout.close()
        try:
            self.proc.stdin.close()
        except OSError:
            pass


class SshStream:
    def __init__(self, channel: paramiko.Channel, label: str):
        self.channel, self.label = channel, label
        self.file = channel.makefile("rb")

    def __iter__(self):
        try:
            yield from self.file
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise TransportError(f"{self.label}: SSH connection lost: {exc}") from None

    def send(self, data: bytes) -> None:
        try:
            self.channel.sendall(data)
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise TransportError(f"{self.label}: SSH connection lost: {exc}") from None

    def close(self) -> None:
        self.channel.close()


class LocalTransport:
    def __init__(self, host: Host):
        self.host = host

    def run(self, line: str, stdin: bytes = b"", timeout: float | None = 60.0) -> CommandResult:
        try:
            done = subprocess.run(["/bin/sh", "-c", line], input=stdin, capture_output=True,
                                  timeout=timeout, cwd=os.path.expanduser("~"))
        except subprocess.TimeoutExpired:
            raise TransportError(f"{self.host.label}: command timed out after {timeout:g} s") from None
        return CommandResult(done.returncode, done.stdout, done.stderr)

    def stream(self, line: str) -> LineStream:
        return LocalStream(line)

    def close(self) -> None:
        pass


class SshTransport:
    """One SSH login per host, reused for every step (deploy/sshlogin.py: gateways, keys)."""

    def __init__(self, host: Host, connect_timeout: float = 10.0, accept_new_host_keys: bool = False):
        self.host = host
        try:
            self.login = HostLogin(host, connect_timeout,
                                   accept_new_host_keys or host.host_key_policy == "accept-new")
        except LoginFailed as exc:
            raise TransportError(str(exc)) from None
        self.connection = self.login.connection

    def _channel(self) -> paramiko.Channel:
        try:
            return self.connection.client.get_transport().open_session(timeout=10)
        except (paramiko.SSHException, AttributeError, EOFError, OSError) as exc:
            raise TransportError(f"{self.host.label}: SSH connection lost: {exc}") from None

    def run(self, line: str, stdin: bytes = b"", timeout: float | None = 60.0) -> CommandResult:
        channel = self._channel()
        try:
            channel.settimeout(timeout)
            channel.exec_command(line)
            # In slices: paramiko's sendall re-copies the unsent rest after every packet, which
            # is quadratic in the size (100 MB took minutes instead of seconds).
            view = memoryview(stdin)
            for start in range(0, len(view), SEND_SLICE):
                channel.sendall(view[start:start + SEND_SLICE].tobytes())
            channel.shutdown_write()
            # Our commands write little to stderr, so reading stdout first cannot stall.
            out = channel.makefile("rb").read()
            err = channel.makefile_stderr("rb").read()
            return CommandResult(channel.recv_exit_status(), out, err)
        except socket.timeout:
            raise TransportError(f"{self.host.label}: command timed out after {timeout:g} s") from None
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise TransportError(f"{self.host.label}: SSH connection lost: {exc}") from None
        finally:
            channel.close()

    def stream(self, line: str) -> LineStream:
        channel = self._channel()
        channel.exec_command(line)
        # stdin stays open: the follower takes commands on it (a fast stop).
        return SshStream(channel, self.host.label)

    def close(self) -> None:
        self.login.close()


def connect(host: Host, connect_timeout: float = 10.0, accept_new_host_keys: bool = False) -> Transport:
    if host.transport == "local":
        return LocalTransport(host)
    return SshTransport(host, connect_timeout, accept_new_host_keys)
