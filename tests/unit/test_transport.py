"""What a failed command's result says about it."""
from __future__ import annotations

from deploy.ssh.transport import CommandResult


def test_the_error_is_the_last_line_or_a_crashs_headline():
    assert CommandResult(1, b"", b"Traceback ...\n  File x\nValueError: bad\n").error_text() \
        == "ValueError: bad"
    crash = (b"Fatal Python error: _enter_buffered_busy: could not acquire lock\n"
             b"Python runtime state: finalizing\n\nThread 0x7f (most recent call first):\n"
             b"  <no Python frame>\n")
    assert CommandResult(134, b"{}\n", crash).error_text().startswith(
        "Fatal Python error: _enter_buffered_busy")
    assert CommandResult(3, b"", b"").error_text() == "exit code 3"
