"""The controller's signal policy (deploy/run/signals.py), with real signals sent to this
process; no network."""
from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from deploy.run import signals
from deploy.run.signals import (
    Abandoned, HungUp, OutputClosed, Terminated, controller_signals, exit_code, tearing_down
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


def readerless_pipe():
    """A text stream whose pipe has no reader left (`inv train | head` once head is done),
    wrapped as the controller wraps stdout; and its file descriptor."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    stream = open(write_end, "w")
    return signals.HangupProof(stream), write_end


def points_at_devnull(fd: int) -> bool:
    return os.fstat(fd).st_rdev == os.stat(os.devnull).st_rdev


def test_a_write_nobody_reads_is_output_closed_then_goes_to_devnull():
    proof, fd = readerless_pipe()
    try:
        with pytest.raises(OutputClosed) as caught:
            proof.write("a line for a reader that is gone\n")
            proof.flush()
        assert isinstance(caught.value, HungUp) and exit_code(caught.value) == 141
        assert points_at_devnull(fd)
        proof.write("what follows is dropped without an error\n")
        proof.flush()
    finally:
        proof.stream.close()


def test_a_closed_pipe_never_ends_a_teardown():
    proof, fd = readerless_pipe()
    try:
        with tearing_down():
            proof.write("stopping tasks…\n")
            proof.flush()
            finished = True
        assert finished and points_at_devnull(fd)
    finally:
        proof.stream.close()


def test_a_closed_pipe_met_by_another_thread_reaches_the_main_one():
    proof, fd = readerless_pipe()
    try:
        with pytest.raises(OutputClosed):
            with controller_signals():
                writer = threading.Thread(target=lambda: (proof.write("x\n"), proof.flush()))
                writer.start()
                writer.join()
                for _ in range(100):        # the handler runs between two of these
                    time.sleep(0.01)
        assert points_at_devnull(fd)
        assert signals._output_closed is False          # reset with the command's end
    finally:
        proof.stream.close()
