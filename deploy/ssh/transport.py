"""One interface for running commands on a host, with two implementations: SSH (one Fabric
connection per host, reused for every channel; see login.py) and local subprocesses for
`transport: local`.

Both run a command line in a POSIX shell: once with bytes on its stdin, answered with its exit
code and output (run: `inv setup`'s steps), or as a stream both ways (stream: the run's agent,
agent.py), so the executor never knows which kind of host it talks to.
"""
from __future__ import annotations

import os
import pwd
import signal
import socket
import subprocess
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterable, Protocol, Union

import paramiko

from deploy.errors import Failure
from deploy.inventory.model import Host
from deploy.ssh.login import HostLogin, LoginFailed

# What a command reads on stdin: bytes, or pieces of bytes sent in order as they come (a
# large stream need never be joined in memory).
Stdin = Union[bytes, Iterable[bytes]]


def pieces(stdin: Stdin) -> Iterable[bytes]:
    return (stdin,) if isinstance(stdin, (bytes, bytearray, memoryview)) else stdin


@dataclass(frozen=True)
class CommandResult:
    code: int
    stdout: bytes
    stderr: bytes

    def error_text(self) -> str:
        """The line that says what went wrong: the last one (a traceback's exception), or the
        headline of a crash of the interpreter itself, whose last line says nothing."""
        text = (self.stderr or self.stdout).decode("utf-8", "replace").strip()
        if not text:
            return f"exit code {self.code}"
        lines = text.splitlines()
        fatal = [line for line in lines if line.startswith("Fatal Python error")]
        return fatal[0] if fatal else lines[-1]


# Every command runs with umask 077: whatever it creates on the host (run directories, logs,
# the cache, a task's files) is private to the user, also on a home shared with others.
PRIVATE = "umask 077; "

# A host is untrusted input: what a command of its own (inv setup's steps) may print, and a
# line of a stream read by lines (inv setup's build), are bounded; a longer line comes in
# pieces. The agents' channels are read by frames, bounded by frames.py.
OUTPUT_LIMIT = 16 << 20
LINE_LIMIT = 1 << 20
# sshd's PATH for a session where the environment names none.
LOGIN_PATH = "/usr/local/bin:/usr/bin:/bin"


def login_environment(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a local host's commands get (its agent, and so its tasks): what a login
    gives an SSH host's (HOME, USER, LOGNAME, PATH, SHELL; LANG and LC_* as ssh sends them),
    taken from this shell, so that the tasks find the same python and home. Nothing else of
    the controller's environment (its tokens, its cloud credentials): what a task needs more
    comes from the inventory's `env`, in its launch request, as on any host."""
    environ = os.environ if environ is None else environ
    account = pwd.getpwuid(os.getuid())
    env = {"HOME": environ.get("HOME") or account.pw_dir, "USER": account.pw_name,
           "LOGNAME": account.pw_name, "SHELL": environ.get("SHELL") or account.pw_shell,
           "PATH": environ.get("PATH") or LOGIN_PATH}
    env.update({k: v for k, v in environ.items() if k == "LANG" or k.startswith("LC_")})
    return env


class TransportError(Failure):
    """The host could not be reached or the command could not be run at all."""


class Transport(Protocol):
    host: Host

    def run(self, line: str, stdin: Stdin = b"", timeout: float | None = 60.0) -> CommandResult: ...

    def stream(self, line: str) -> "LineStream": ...

    def close(self) -> None: ...


class LineStream(Protocol):
    """The output of a long-running command, read as it comes: by lines (iterating, or
    readline) or by byte counts (read, for the follow stream's frames); close() abandons it."""

    def __iter__(self): ...

    def readline(self, limit: int = -1) -> bytes: ...

    def read(self, size: int) -> bytes: ...

    def send(self, data: bytes) -> None: ...

    def outcome(self) -> CommandResult: ...

    def close(self) -> None: ...


class LocalStream:
    def __init__(self, line: str):
        # Its own session, so that closing it ends exactly this command and its children.
        # Its stderr goes to a file: a pipe nobody reads could stall it.
        self.errors = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(["/bin/sh", "-c", PRIVATE + line], stdout=subprocess.PIPE,
                                     stdin=subprocess.PIPE, stderr=self.errors,
                                     start_new_session=True, cwd=os.path.expanduser("~"),
                                     env=login_environment())

    def __iter__(self):
        return iter(lambda: self.proc.stdout.readline(LINE_LIMIT), b"")

    def readline(self, limit: int = -1) -> bytes:
        return self.proc.stdout.readline(limit)

    def read(self, size: int) -> bytes:
        return self.proc.stdout.read(size)

    def send(self, data: bytes) -> None:
        try:
            self.proc.stdin.write(data)
            self.proc.stdin.flush()
        except (OSError, ValueError) as exc:
            raise TransportError(f"local stream: {exc}") from None

    def outcome(self) -> CommandResult:
        """Once the output has ended: the exit code and what the command said on stderr."""
        code = self.proc.wait()
        self.errors.seek(0)
        return CommandResult(code, b"", self.errors.read())

    def close(self) -> None:
        _end(self.proc)
        self.errors.close()


def _end(proc: subprocess.Popen) -> None:
    """End a command started in a session of its own (SIGTERM to that group if it still runs),
    wait for it and close its pipes."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    proc.wait()
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            try:
                pipe.close()
            except OSError:
                pass


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


class LocalTransport:
    def __init__(self, host: Host):
        self.host = host

    def run(self, line: str, stdin: Stdin = b"", timeout: float | None = 60.0) -> CommandResult:
        try:
            done = subprocess.run(["/bin/sh", "-c", PRIVATE + line], input=b"".join(pieces(stdin)),
                                  capture_output=True, env=login_environment(),
                                  timeout=timeout, cwd=os.path.expanduser("~"))
        except subprocess.TimeoutExpired:
            raise TransportError(f"{self.host.label}: command timed out after {timeout:g} s") from None
        return CommandResult(done.returncode, done.stdout, done.stderr)

    def stream(self, line: str) -> LineStream:
        return LocalStream(line)

    def close(self) -> None:
        pass


class SshTransport:
    """One SSH login per host, reused for every step (login.py: gateways, keys)."""

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


def connect(host: Host, connect_timeout: float = 10.0, accept_new_host_keys: bool = False) -> Transport:
    if host.transport == "local":
        return LocalTransport(host)
    return SshTransport(host, connect_timeout, accept_new_host_keys)
