"""The controller's signal policy (deploy/run/signals.py), with real signals sent to this
process; no network."""
from __future__ import annotations

import errno
import os
import pty
import signal
import subprocess
import sys
import textwrap

import pytest

from deploy.run import signals
from deploy.run.signals import (
    Abandoned, HungUp, Terminated, controller_signals, exit_code, tearing_down
)


@pytest.fixture
def quiet_hangups(monkeypatch):
    """SIGHUP's handler points terminals at /dev/null: not pytest's own."""
    monkeypatch.setattr(signals, "silence_terminal", lambda: None)


def test_sigterm_is_an_interrupt_with_its_own_exit_status():
    with pytest.raises(KeyboardInterrupt) as caught:
        with controller_signals():
            os.kill(os.getpid(), signal.SIGTERM)
            signal.sigtimedwait([], 0)      # a point where the handler has run
    assert isinstance(caught.value, Terminated) and exit_code(caught.value) == 143
    assert exit_code(KeyboardInterrupt()) == 130
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL     # restored after


def test_sighup_raises_hung_up_but_never_during_a_teardown(quiet_hangups):
    with pytest.raises(HungUp) as caught:
        with controller_signals():
            os.kill(os.getpid(), signal.SIGHUP)
            signal.sigtimedwait([], 0)
    assert exit_code(caught.value) == 129
    with controller_signals():
        with tearing_down():
            os.kill(os.getpid(), signal.SIGHUP)
            signal.sigtimedwait([], 0)
            finished = True
    assert finished


def test_an_interrupt_during_a_teardown_abandons_it_with_the_interrupts_status():
    with pytest.raises(Abandoned) as caught:
        with tearing_down():
            raise KeyboardInterrupt
    assert caught.value.exit_code == 130
    with pytest.raises(Abandoned) as caught:
        with controller_signals(), tearing_down():
            os.kill(os.getpid(), signal.SIGTERM)
            signal.sigtimedwait([], 0)
    assert caught.value.exit_code == 143


def test_a_signal_inherited_as_ignored_stays_ignored():
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with controller_signals():
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGHUP)
            signal.sigtimedwait([], 0)
    finally:
        signal.signal(signal.SIGHUP, previous)


def test_after_a_hangup_writes_to_the_dead_terminal_go_nowhere_instead_of_failing(tmp_path):
    """A process whose terminal was closed (the pty's master end gone) gets EIO on every
    write; the controller's output, print and rich alike, survives it (no SIGHUP is sent
    here: the write fails first)."""
    script = textwrap.dedent("""
        import os, sys, traceback
        from rich.console import Console
        from deploy.run.signals import controller_signals
        def report(*exc):
            traceback.print_exception(*exc, file=open("result", "a"))
        sys.excepthook = report
        os.read(0, 1)                       # the test closes the terminal, then lets us on
        try:
            os.write(1, b"x")
            print("wrote to a dead terminal", file=open("result", "w"))
        except OSError as exc:
            print(f"before: {exc.errno}", end=" ", file=open("result", "w"))
        with controller_signals():
            console = Console()
            for _ in range(1000):
                print("the end of a run nobody watches", flush=True)
                console.print("[bold]and its summary[/]")
                print("and a warning", file=sys.stderr, flush=True)
        print("after: ok", file=open("result", "a"))
    """)
    master, slave = pty.openpty()
    rd, wr = os.pipe()
    child = subprocess.Popen([sys.executable, "-c", script], stdin=rd, stdout=slave,
                             stderr=slave, cwd=tmp_path, start_new_session=True,
                             env={**os.environ, "PYTHONPATH": os.getcwd()})
    os.close(slave)
    os.close(rd)
    os.close(master)
    os.write(wr, b"go")
    os.close(wr)
    code = child.wait(timeout=30)
    assert (tmp_path / "result").read_text() == f"before: {errno.EIO} after: ok\n"
    assert code == 0
