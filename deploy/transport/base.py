"""One interface for running commands on a host, with two implementations: SSH (ssh.py: one
connection per host, reused for every channel; see login.py) and local subprocesses for
`transport: local` (local.py).

Both run a command line in a POSIX shell: once with bytes on its stdin, answered with its exit
code and output (run: `inv setup`'s steps), or as a stream both ways (stream: the run's agent,
deploy/cluster/hostagent.py), so the executor never knows which kind of host it talks to.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Protocol, Union

from deploy.errors import Failure
from deploy.inventory.model import Host

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

class LoginFailed(Failure):
    """A login or a channel failed; the message names the hop (and the host, for its own)."""
