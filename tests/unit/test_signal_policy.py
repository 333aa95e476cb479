"""The controller's signal policy (deploy/run/signals.py), with real signals sent to this
process; no network."""
from __future__ import annotations

import os
import signal

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
