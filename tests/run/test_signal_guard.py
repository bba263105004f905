"""SignalGuard with real signals to this process: SIGINT is named SIGINT and ends as Python's KeyboardInterrupt."""
from __future__ import annotations

import os
import signal

import pytest

from msbridge.run.signals import SignalGuard, TrainingInterrupted


@pytest.fixture(autouse=True)
def python_default_sigint():
    """Each test starts from Python's own SIGINT handler, as in a terminal. A process started in the background of a
    non-interactive shell (``cmd &``, ``nohup``) inherits SIGINT ignored, and the guard leaves an ignored signal so."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def test_sigint_raises_pythons_own_keyboard_interrupt_and_is_named():
    guard = SignalGuard()
    assert guard.install()
    try:
        with pytest.raises(KeyboardInterrupt) as err:
            os.kill(os.getpid(), signal.SIGINT)
        assert type(err.value) is KeyboardInterrupt, "only this one makes an uncaught Ctrl-C end by SIGINT"
        assert guard.interrupt_detail() == {"signal": "SIGINT"}
    finally:
        guard.restore()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_sigint_in_a_critical_block_is_held_until_the_block_is_done():
    guard = SignalGuard()
    guard.install()
    done = []
    try:
        with pytest.raises(KeyboardInterrupt):
            with guard.critical():
                os.kill(os.getpid(), signal.SIGINT)
                done.append("the block finished first")
        assert done == ["the block finished first"]
    finally:
        guard.restore()


def test_a_second_signal_while_ending_is_ignored():
    guard = SignalGuard()
    guard.install()
    try:
        with pytest.raises(TrainingInterrupted):
            os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGINT)  # the close must not be cut short
        assert guard.interrupt_detail() == {"signal": "SIGTERM"}
    finally:
        guard.restore()


def test_reassert_takes_back_a_handler_a_library_replaced():
    guard = SignalGuard()
    guard.install()
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # as MindSpore's runtime replaces it underneath
        guard.reassert()
        assert signal.getsignal(signal.SIGINT) == guard._handle
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    finally:
        guard.restore()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
