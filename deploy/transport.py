"""One interface for running commands on a host, with two implementations: SSH (one Fabric
connection per host, reused for every step) and local subprocesses for `transport: local`.

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
from fabric import Config as FabricConfig, Connection

from . import hostkeys
from .inventory import Host
from .sshconfig import Hop

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
    """One SSH login per host, through its gateways if it has any (`jump:` or a ProxyJump in
    the ssh config): each gateway is a login of its own, host key checked against the same
    known_hosts with the same policy, and the next hop is reached over a direct-tcpip channel
    from it. Only the SSH session goes through a gateway; training traffic does not."""

    def __init__(self, host: Host, connect_timeout: float = 10.0, accept_new_host_keys: bool = False):
        self.host = host
        self.connect_timeout = connect_timeout
        self.accept_new = accept_new_host_keys or host.host_key_policy == "accept-new"
        self.logins: list[Connection] = []      # gateways first, the host itself last
        try:
            self._open()
        except BaseException:
            self.close()
            raise

    @property
    def connection(self) -> Connection:
        return self.logins[-1]

    def _open(self) -> None:
        route = [*self.host.via, self.host.ssh]
        sock = None
        for i, hop in enumerate(route):
            last = i == len(route) - 1
            where = self.host.label if last else (
                f"{self.host.label}: gateway {hop.described()}")
            login = self._login(hop, sock, where, _scan_from(route[:i]))
            self.logins.append(login)
            self._connect(login, hop, where)
            if not last:
                sock = self._tunnel(login, route[i + 1], where)

    def _login(self, hop: Hop, sock: paramiko.Channel | None, where: str,
               scan_from: str) -> Connection:
        # Key files from the ssh config that do not exist are skipped, as `ssh` skips them;
        # the agent and ~/.ssh/id_* are tried after them (paramiko's defaults, left on).
        kwargs: dict = {"key_filename": [k for k in map(os.path.expanduser, hop.identity_files)
                                         if os.path.exists(k)]}
        if sock is not None:
            kwargs["sock"] = sock
        # The host's ssh config was read when the inventory was loaded; Fabric reads none
        # (an empty SSHConfig) and makes no gateway of its own, whose host key it would add
        # without asking.
        login = Connection(host=hop.hostname, user=hop.user, port=hop.port, gateway=False,
                           config=FabricConfig(ssh_config=paramiko.SSHConfig()),
                           connect_timeout=self.connect_timeout, connect_kwargs=kwargs)
        hostkeys.configure(login.client, where, self.host.known_hosts, hop.port, self.accept_new,
                           scan_from)
        return login

    def _tunnel(self, gateway: Connection, hop: Hop, where: str) -> paramiko.Channel:
        try:
            return gateway.transport.open_channel(
                "direct-tcpip", (hop.hostname, hop.port), ("", 0), timeout=self.connect_timeout)
        except (paramiko.SSHException, EOFError, OSError) as exc:
            # A refusal by the gateway is a ChannelException whose text says why.
            raise TransportError(f"{where}: cannot reach {hop.hostname}:{hop.port} from there: "
                                 f"{getattr(exc, 'text', None) or exc or 'no answer'}") from None

    def _connect(self, login: Connection, hop: Hop, where: str) -> None:
        try:
            login.open()
        except hostkeys.HostKeyRefused as exc:
            raise TransportError(str(exc)) from None
        except paramiko.BadHostKeyException as exc:
            raise TransportError(
                f"{where}: HOST KEY CHANGED: known_hosts has {hostkeys.fingerprint(exc.expected_key)},"
                f" the server offers {hostkeys.fingerprint(exc.key)}. Refusing to connect; if the "
                f"host was really reinstalled, remove its old line from {self.host.known_hosts}") from None
        except paramiko.AuthenticationException as exc:
            raise TransportError(f"{where}: SSH authentication failed as {login.user!r}"
                                 f"{_keys_tried(hop)}: {exc}") from None
        except (socket.timeout, TimeoutError):
            raise TransportError(f"{where}: no answer on port {hop.port} "
                                 f"(timed out) — host down or firewalled?") from None
        except paramiko.SSHException as exc:
            if "No authentication methods" not in str(exc):
                raise TransportError(f"{where}: cannot connect to port {hop.port}: {exc}") from None
            # No key file, no agent key, no ~/.ssh/id_*: nothing was even offered.
            raise TransportError(f"{where}: SSH authentication failed as {login.user!r}: no key "
                                 f"to offer{_keys_tried(hop)}") from None
        except OSError as exc:
            raise TransportError(f"{where}: cannot connect to port {hop.port}: "
                                 f"{getattr(exc, 'strerror', None) or exc}") from None

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
        for login in reversed(self.logins):
            login.close()


def _scan_from(hops: list[Hop]) -> str:
    """How to run ssh-keyscan where a hop is reachable: on the gateway before it, if any."""
    if not hops:
        return ""
    jump = f"-J {','.join(h.shown() for h in hops[:-1])} " if len(hops) > 1 else ""
    return f"ssh {jump}ssh://{hops[-1].shown()} "


def _keys_tried(hop: Hop) -> str:
    """Which identity files were offered, and which were missing (then the agent's keys)."""
    if not hop.identity_files:
        return " (no identity_file; tried ssh-agent and ~/.ssh/id_*)"
    missing = [k for k in hop.identity_files if not os.path.exists(os.path.expanduser(k))]
    return (f" (key files {', '.join(hop.identity_files)}"
            + (f"; missing: {', '.join(missing)}" if missing else "") + "; then ssh-agent)")


def connect(host: Host, connect_timeout: float = 10.0, accept_new_host_keys: bool = False) -> Transport:
    if host.transport == "local":
        return LocalTransport(host)
    return SshTransport(host, connect_timeout, accept_new_host_keys)
