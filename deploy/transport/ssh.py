"""SSH hosts: every command on a channel of the host's one login (login.py)."""
from __future__ import annotations

import socket
from contextlib import contextmanager

import paramiko

from deploy.inventory.model import Host
from deploy.transport.base import (
    LINE_LIMIT, OUTPUT_LIMIT, PRIVATE, CommandResult, LineStream, LoginFailed, Stdin,
    TransportError, pieces
)
from deploy.transport.login import HostLogin


class SshExchange:
    """One command on its own channel: its stdin sent, then its output and exit code."""

    def __init__(self, channel: paramiko.Channel, label: str, timeout: float | None):
        self.channel, self.label = channel, label
        self.channel.settimeout(timeout)
        self.timeout = timeout
        self.out = channel.makefile("rb")

    @contextmanager
    def _errors(self):
        try:
            yield
        except socket.timeout:
            raise TransportError(
                f"{self.label}: command timed out after {self.timeout:g} s") from None
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise TransportError(f"{self.label}: SSH connection lost: {exc}") from None

    def send(self, stdin: Stdin) -> None:
        """Every piece through memoryviews: paramiko's sendall re-copies the unsent rest after
        every packet (quadratic in the size), and a bytes copy per slice costs as much as the
        encryption. A command that stopped reading (it failed) closes the channel: sending
        stops, and finish() gives its exit code and message."""
        with self._errors():
            for piece in pieces(stdin):
                view = memoryview(piece)
                while view:
                    sent = self.channel.send(view)
                    if not sent:
                        return
                    view = view[sent:]

    def finish(self) -> CommandResult:
        with self._errors():
            self.channel.shutdown_write()
            # Our commands write little to stderr, so reading stdout first cannot stall.
            out = self.out.read(OUTPUT_LIMIT + 1)
            if len(out) > OUTPUT_LIMIT:
                raise TransportError(f"{self.label}: the command printed more than "
                                     f"{OUTPUT_LIMIT} bytes")
            err = self.channel.makefile_stderr("rb").read(OUTPUT_LIMIT)
            return CommandResult(self.channel.recv_exit_status(), out, err)

    def close(self) -> None:
        self.channel.close()


class SshStream:
    """A channel's output through one bytearray: paramiko's own file object grows its buffer
    by bytes concatenation, a copy of the whole buffer per packet, which a stream of large
    log chunks would pay for every 32 KiB."""

    RECV = 1 << 18
    # A send that moves no byte for this long means the host stopped reading: it is lost.
    SEND_TIMEOUT = 60.0

    def __init__(self, channel: paramiko.Channel, label: str):
        self.channel, self.label = channel, label
        self.buffer = bytearray()
        channel.settimeout(self.SEND_TIMEOUT)

    @contextmanager
    def _errors(self):
        try:
            yield
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise TransportError(f"{self.label}: SSH connection lost: {exc}") from None

    def _fill(self) -> bool:
        while True:
            try:
                data = self.channel.recv(self.RECV)
                break
            except socket.timeout:
                continue   # a read waits as long as it takes: its reader judges silence
            except (paramiko.SSHException, EOFError, OSError) as exc:
                raise TransportError(f"{self.label}: SSH connection lost: {exc}") from None
        self.buffer += data
        return bool(data)

    def _take(self, size: int) -> bytes:
        with memoryview(self.buffer) as view:
            taken = bytes(view[:size])
        del self.buffer[:size]          # cheap: a bytearray drops its head in place
        return taken

    def readline(self, limit: int = -1) -> bytes:
        searched = 0
        while True:
            end = self.buffer.find(b"\n", searched)
            if end >= 0:
                size = end + 1
                break
            if 0 <= limit <= len(self.buffer):
                size = limit
                break
            searched = len(self.buffer)
            if not self._fill():
                size = len(self.buffer)
                break
        return self._take(size if limit < 0 else min(size, limit))

    def read(self, size: int) -> bytes:
        while len(self.buffer) < size and self._fill():
            pass
        return self._take(size)

    def __iter__(self):
        while line := self.readline(LINE_LIMIT):
            yield line

    def send(self, data: bytes) -> None:
        """Through a memoryview: paramiko's sendall re-copies the unsent rest after every
        packet (quadratic in the size)."""
        view = memoryview(data)
        with self._errors():
            while view:
                sent = self.channel.send(view)
                if not sent:
                    raise OSError("channel closed")
                view = view[sent:]

    def outcome(self) -> CommandResult:
        """Once the output has ended: the exit code and what the command said on stderr."""
        with self._errors():
            err = self.channel.makefile_stderr("rb").read()
            return CommandResult(self.channel.recv_exit_status(), b"", err)

    def close(self) -> None:
        self.channel.close()


class SshTransport:
    """One SSH login per host, reused for every step (login.py: gateways, keys)."""

    def __init__(self, host: Host, connect_timeout: float = 10.0,
                 accept_new_host_keys: bool = False):
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

    def run(self, line: str, stdin: Stdin = b"", timeout: float | None = 60.0) -> CommandResult:
        exchange = self.exchange(line, timeout)
        try:
            exchange.send(stdin)
            return exchange.finish()
        finally:
            exchange.close()

    def exchange(self, line: str, timeout: float | None = 60.0) -> SshExchange:
        channel = self._channel()
        try:
            channel.exec_command(PRIVATE + line)
        except (paramiko.SSHException, EOFError, OSError) as exc:
            channel.close()
            raise TransportError(f"{self.host.label}: SSH connection lost: {exc}") from None
        return SshExchange(channel, self.host.label, timeout)

    def stream(self, line: str) -> LineStream:
        channel = self._channel()
        channel.exec_command(PRIVATE + line)
        # stdin stays open: the follower takes commands on it (a fast stop).
        return SshStream(channel, self.host.label)

    def close(self) -> None:
        self.login.close()
