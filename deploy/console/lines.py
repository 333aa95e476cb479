"""Which log lines the console shows, and how. The logs themselves are never filtered: every
byte stays in runs/<id>/worker-<i>.log; this only decides what reaches the screen.

Hidden by default, by `train` and `logs` alike (shown with --verbose):
- TensorFlow's C++ log lines (absl/glog format: `I0000 00:00:1796281974.746382  1198
  port.cc:153] oneDNN custom operations are on...`, W/E/F alike) and absl's notice that such
  lines go to stderr before it is initialised. They come from TensorFlow's start-up (CPU
  features, CUDA probes, oneDNN) on every worker, dozens of lines that say nothing about the
  training.
- The continuation of such a line that names a task (`/job:worker/replica:0/task:1`), which
  TensorFlow prints on a line of its own after some of them.
- The payload's machine-readable {"event": ...} lines: the live table shows what they carry.
  Where there is no live table (no terminal) an epoch line is shown as a short readable line
  instead, so piped output still tells how training goes.
"""
from __future__ import annotations

import math
import re

from deploy.console.plain import plain
from deploy.state.progress import parse_event

# Severity, MMDD, time, thread id, file:line]  (absl's and glog's prefix)
CPP_LOG = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d+\.\d+\s+\d+ [^\s\]]+:\d+\] ")
CPP_NOTICES = (
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    # Printed by oneDNN and TensorFlow's CPU feature guard without the prefix in some builds.
    "oneDNN custom operations are on.",
    "This TensorFlow binary is optimized to use available CPU instructions",
    "To enable the following instructions:",
)


# A C++ log line's continuation: a device or task name alone on its line.
CPP_CONTINUATION = re.compile(r"^/job:[\w-]+/replica:\d+/task:\d+(/device:[\w:]+)?\s*$")


def is_tensorflow_chatter(line: str) -> bool:
    """A line of TensorFlow's C++ runtime log, not of the payload."""
    return bool(CPP_LOG.match(line) or CPP_CONTINUATION.match(line)) or \
        line.startswith(CPP_NOTICES)


def shown_line(line: str, raw: bool = False, events_as_text: bool = True,
               epochs_total: int | None = None) -> str | None:
    """What the console prints for one log line: the line itself, a readable form of an epoch
    event (when `events_as_text`), or None to print nothing. `raw` shows every line as it is
    written, but like every other, as plain text (plain.py)."""
    shown = _chosen(line, raw, events_as_text, epochs_total)
    return None if shown is None else plain(shown)


def _chosen(line: str, raw: bool, events_as_text: bool, epochs_total: int | None) -> str | None:
    if raw:
        return line
    event = parse_event(line)
    if event is not None:
        if events_as_text and event.get("event") == "epoch":
            return epoch_text(event, epochs_total)
        return None
    if is_tensorflow_chatter(line):
        return None
    return line


def epoch_text(event: dict, total: int | None = None) -> str:
    """`epoch 3/30  loss 0.9447  accuracy 0.6125` from an epoch event."""
    epoch = f"epoch {event.get('epoch')}" + (f"/{total}" if total else "")
    values = [f"{k} {number(v)}" for k, v in event.items()
              if k not in ("event", "task", "epoch", "seconds")
              and isinstance(v, (int, float)) and not isinstance(v, bool)]
    return "  ".join([epoch, *values])


def number(value: float) -> str:
    """A metric with four decimals (losses are compared by eye to the second decimal); very
    small or large ones in scientific notation."""
    if not math.isfinite(value) or value == 0 or 1e-3 <= abs(value) < 1e5:
        return f"{value:.4f}"
    return f"{value:.3e}"
