"""The controller's signal policy, in one place (docs/design.md, "Signals to the controller").

- SIGINT (Ctrl-C) raises KeyboardInterrupt, as Python does: `inv train` stops the run
  everywhere (exit 130), `inv logs --follow` stops following only.
- SIGTERM (`kill`, a batch system's time limit, a closing IDE) raises Terminated, a
  KeyboardInterrupt: every command treats it as its Ctrl-C, and exits 143 (128 + 15).
- SIGHUP (the terminal closed) raises HungUp: a run being followed is let go, left running
  and reattachable with `inv logs --run ID --follow`; the controller exits 129 (128 + 1).
  Its terminal is gone, so from then on its output goes to /dev/null; a write that meets the
  hung-up terminal before the signal does is dropped the same way (HangupProof).
- A write to stdout or stderr whose pipe has no reader left (`inv train | head`, a `tee` that
  died) raises OutputClosed, a HungUp: the reader is gone, the run is not, and it is let go
  as for a closed terminal; the controller exits 141 (128 + SIGPIPE, as a program SIGPIPE
  ended). That stream goes to /dev/null from then on; the reporters say how to follow the run
  on stderr too. Python ignores SIGPIPE (a broken SSH connection is an error, not a signal):
  the failed write is where it shows.
- While a run is torn down (tearing_down()): a second Ctrl-C or SIGTERM abandons the
  teardown (Abandoned) and the controller exits at once, naming what may be left and the
  `inv down` that finishes the job; SIGHUP only silences the output, as nobody would be left
  to finish the teardown.

A signal the controller inherited as ignored (a background job's SIGINT, `nohup`'s SIGHUP)
stays ignored: whoever started it so chose.
"""
from __future__ import annotations

import _thread
import errno
import os
import select
import signal
import stat
import sys
import threading
from contextlib import contextmanager

EXIT_INTERRUPTED = 128 + signal.SIGINT
EXIT_TERMINATED = 128 + signal.SIGTERM
EXIT_HUNG_UP = 128 + signal.SIGHUP
EXIT_OUTPUT_CLOSED = 128 + signal.SIGPIPE


class Terminated(KeyboardInterrupt):
    """SIGTERM: handled wherever Ctrl-C is, with its own exit status."""
    exit_code = EXIT_TERMINATED


class HungUp(BaseException):
    """SIGHUP: the terminal is gone. Not an error and not an interrupt: a followed run is
    let go instead of stopped."""
    exit_code = EXIT_HUNG_UP
    why = "the terminal closed: "


class OutputClosed(HungUp):
    """A write met a pipe whose reader is gone: handled as a closed terminal."""
    exit_code = EXIT_OUTPUT_CLOSED
    why = "the output's reader is gone (a closed pipe): "


class Abandoned(BaseException):
    """A second interrupt while tearing down: the controller leaves without waiting."""

    def __init__(self, interrupt: KeyboardInterrupt):
        super().__init__()
        self.exit_code = exit_code(interrupt)


def exit_code(interrupt: BaseException) -> int:
    """The exit status of a controller ended by `interrupt`."""
    return getattr(interrupt, "exit_code", EXIT_INTERRUPTED)


_tearing_down = False
# Set when a thread other than the main one met a closed pipe: the main thread hears of it as
# of a hangup, and SIGHUP's handler raises OutputClosed instead.
_output_closed = False


def _terminated(signum, frame):
    raise Terminated()


def _hung_up(signum, frame):
    if _output_closed:
        if not _tearing_down:
            raise OutputClosed()
        return
    silence_terminal()
    if not _tearing_down:
        raise HungUp()


def to_devnull(stream) -> None:
    """Point `stream`'s file descriptor at /dev/null (its buffer is flushed there, at exit
    too, without an error)."""
    try:
        fd = stream.fileno()
    except (OSError, ValueError):
        return
    _fd_to_devnull(fd)


def closed_output_ends_quietly() -> None:
    """A closed pipe met outside a task's own handling (Invoke's help or task list: `tfdeploy
    --help | head`, `inv --list | head`) ends the process as one met inside does: exit 141, no
    traceback. Invoke prints those before any task runs, and lets the error reach the top.
    Any other BrokenPipeError (a socket's, with stdout still read) keeps its traceback."""
    previous = sys.excepthook
    if getattr(previous, "closed_output_ends_quietly", False):
        return

    def hook(kind, value, traceback):
        if not (issubclass(kind, BrokenPipeError) and any(map(_reader_gone, (1, 2)))):
            previous(kind, value, traceback)
            return
        to_devnull(sys.stdout)
        to_devnull(sys.stderr)
        # At once: the interpreter's exit would flush the closed stream and say so.
        os._exit(EXIT_OUTPUT_CLOSED)

    hook.closed_output_ends_quietly = True
    sys.excepthook = hook


def _reader_gone(fd: int) -> bool:
    """Whether `fd` is a pipe whose reading end is closed (poll says POLLERR)."""
    try:
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return False
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except OSError:
        return False


def _fd_to_devnull(fd: int) -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


def _output_gone(stream) -> None:
    """`stream`'s pipe has no reader: point it at /dev/null, then tell the main thread
    (OutputClosed), unless a teardown runs, which must go on whatever it cannot print."""
    global _output_closed
    to_devnull(stream)
    if _tearing_down:
        return
    if threading.current_thread() is threading.main_thread():
        raise OutputClosed()
    _output_closed = True
    if signal.getsignal(signal.SIGHUP) is _hung_up:
        _thread.interrupt_main(signal.SIGHUP)


def silence_terminal() -> None:
    """Point stdout and stderr at /dev/null where they are terminals: a hung-up terminal
    fails every write (EIO), and a failed write must not end a teardown or a let-go. Output
    going to a file or pipe still goes there. A hung-up terminal is no longer a tty to
    isatty() (its ioctls fail too): a character device is taken for one."""
    for fd in (1, 2):
        if _character_device(fd):
            _fd_to_devnull(fd)


def _character_device(fd: int) -> bool:
    try:
        return stat.S_ISCHR(os.fstat(fd).st_mode)
    except OSError:         # closed
        return False


class HangupProof:
    """sys.stdout or sys.stderr, where a write that fails because the terminal hung up (EIO)
    silences the terminal and is dropped: a closed terminal is not a failure of the run, and
    the SIGHUP that comes with it decides what happens (the kernel fails the terminal's
    writes before it signals, and Python runs the handler later still). A write to a pipe
    with no reader (EPIPE) is OutputClosed (_output_gone)."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, text: str) -> int:
        return self._survive(lambda: self.stream.write(text), len(text))

    def flush(self) -> None:
        self._survive(self.stream.flush, None)

    def _survive(self, call, dropped):
        try:
            return call()
        except OSError as exc:
            if exc.errno == errno.EPIPE:
                _output_gone(self.stream)
                return dropped
            if exc.errno != errno.EIO:
                raise
            silence_terminal()
            return dropped

    def __getattr__(self, name):
        return getattr(self.stream, name)


@contextmanager
def controller_signals():
    """SIGTERM and SIGHUP as exceptions in the main thread, and stdout and stderr that outlive
    their terminal, for the duration of a command."""
    global _output_closed
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {}
    for signum, handler in ((signal.SIGTERM, _terminated), (signal.SIGHUP, _hung_up)):
        if signal.getsignal(signum) is signal.SIG_DFL:
            previous[signum] = signal.signal(signum, handler)
    streams = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = HangupProof(sys.stdout), HangupProof(sys.stderr)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = streams
        _output_closed = False
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@contextmanager
def tearing_down():
    """Teardown: an interrupt (a second Ctrl-C, SIGTERM) abandons it as Abandoned; SIGHUP
    lets it go on."""
    global _tearing_down
    outer = _tearing_down
    _tearing_down = True
    try:
        yield
    except KeyboardInterrupt as interrupt:
        raise Abandoned(interrupt) from None
    finally:
        _tearing_down = outer
