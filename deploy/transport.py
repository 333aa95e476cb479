"""One interface for running commands on a host, with two implementations: SSH (one Fabric
connection per host, reused for every step) and local subprocesses for `transport: local`.

Both run a command line in a POSIX shell, feed it bytes on stdin and return its exit code and
output as bytes, so the executor never knows which kind of host it talks to.
"""
from __future__ import annotations

import os
import socket
import subprocess
import time
from dataclasses import dataclass
from typing import Protocol

import paramiko
from fabric import Connection

from . import hostkeys
from .inventory import Host


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

    def close(self) -> None: ...


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

    def close(self) -> None:
        pass


class SshTransport:
    def __init__(self, host: Host, connect_timeout: float = 10.0, accept_new_host_keys: bool = False):
        self.host = host
        kwargs = {}
        if host.identity_file:
            kwargs["key_filename"] = [os.path.expanduser(host.identity_file)]
        self.connection = Connection(host=host.address, user=host.user, port=host.port,
                                     connect_timeout=connect_timeout, connect_kwargs=kwargs)
        hostkeys.configure(self.connection.client, host.label, host.known_hosts, host.port,
                           accept_new_host_keys or host.host_key_policy == "accept-new")
        self._open()

    def _open(self) -> None:
        label = self.host.label
        try:
            self.connection.open()
        except hostkeys.HostKeyRefused as exc:
            raise TransportError(str(exc)) from None
        except paramiko.BadHostKeyException as exc:
            raise TransportError(
                f"{label}: HOST KEY CHANGED: known_hosts has {hostkeys.fingerprint(exc.expected_key)},"
                f" the server offers {hostkeys.fingerprint(exc.key)}. Refusing to connect; if the "
                f"host was really reinstalled, remove its old line from {self.host.known_hosts}") from None
        except paramiko.AuthenticationException as exc:
            raise TransportError(f"{label}: SSH authentication failed as "
                                 f"{self.connection.user!r}: {exc}") from None
        except (socket.timeout, TimeoutError):
            raise TransportError(f"{label}: no answer on port {self.host.port} "
                                 f"(timed out) — host down or firewalled?") from None
        except (OSError, paramiko.SSHException) as exc:
            raise TransportError(f"{label}: cannot connect to port {self.host.port}: "
                                 f"{getattr(exc, 'strerror', None) or exc}") from None

    def run(self, line: str, stdin: bytes = b"", timeout: float | None = 60.0) -> CommandResult:
        try:
            channel = self.connection.client.get_transport().open_session(timeout=10)
        except (paramiko.SSHException, AttributeError, EOFError, OSError) as exc:
            raise TransportError(f"{self.host.label}: SSH connection lost: {exc}") from None
        try:
            channel.exec_command(line)
            if stdin:
                channel.sendall(stdin)
            channel.shutdown_write()
            return self._collect(channel, timeout)
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise TransportError(f"{self.host.label}: SSH connection lost: {exc}") from None
        finally:
            channel.close()

    def _collect(self, channel: paramiko.Channel, timeout: float | None) -> CommandResult:
        deadline = None if timeout is None else time.monotonic() + timeout
        out, err = bytearray(), bytearray()
        while True:
            busy = False
            if channel.recv_ready():
                out += channel.recv(1 << 16)
                busy = True
            if channel.recv_stderr_ready():
                err += channel.recv_stderr(1 << 16)
                busy = True
            if busy:
                continue
            if channel.exit_status_ready() and channel.eof_received:
                return CommandResult(channel.recv_exit_status(), bytes(out), bytes(err))
            if channel.closed and not channel.exit_status_ready():
                raise TransportError(f"{self.host.label}: channel closed without an exit status")
            if deadline is not None and time.monotonic() > deadline:
                raise TransportError(f"{self.host.label}: command timed out after {timeout:g} s")
            time.sleep(0.002)

    def close(self) -> None:
        self.connection.close()


def connect(host: Host, connect_timeout: float = 10.0, accept_new_host_keys: bool = False) -> Transport:
    if host.transport == "local":
        return LocalTransport(host)
    return SshTransport(host, connect_timeout, accept_new_host_keys)
