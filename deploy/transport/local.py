"""Local hosts (`transport: local`): commands as subprocesses of the controller, with the
environment a login would give. Slurm's nodes (slurm.py) are reached the same way, through
srun."""
from __future__ import annotations

import os
import pwd
import signal
import subprocess
import tempfile

from deploy.inventory.model import Host
from deploy.transport.base import (
    LINE_LIMIT, PRIVATE, CommandResult, LineStream, Stdin, TransportError, pieces
)

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


class LocalStream:
    def __init__(self, argv: list[str], env: dict[str, str]):
        # Its own session, so that closing it ends exactly this command and its children.
        # Its stderr goes to a file: a pipe nobody reads could stall it.
        self.errors = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stdin=subprocess.PIPE,
                                     stderr=self.errors, start_new_session=True,
                                     cwd=os.path.expanduser("~"), env=env)

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


class LocalTransport:
    def __init__(self, host: Host):
        self.host = host

    def argv(self, line: str) -> list[str]:
        """What runs a command line on the host: here, a shell on this machine."""
        return ["/bin/sh", "-c", PRIVATE + line]

    def environment(self) -> dict[str, str]:
        return login_environment()

    def run(self, line: str, stdin: Stdin = b"", timeout: float | None = 60.0) -> CommandResult:
        try:
            done = subprocess.run(self.argv(line), input=b"".join(pieces(stdin)),
                                  capture_output=True, env=self.environment(),
                                  timeout=timeout, cwd=os.path.expanduser("~"))
        except subprocess.TimeoutExpired:
            raise TransportError(
                f"{self.host.label}: command timed out after {timeout:g} s") from None
        return CommandResult(done.returncode, done.stdout, done.stderr)

    def stream(self, line: str) -> LineStream:
        return LocalStream(self.argv(line), self.environment())

    def close(self) -> None:
        pass
