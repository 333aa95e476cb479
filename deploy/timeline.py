"""Where a run's time goes, on the controller's own clock: when TFDEPLOY_TIMELINE names a file,
each phase's end is appended to it as a JSON line {"phase", "host", "t"} (t: wall-clock
seconds, which the caller that started the controller compares with its own start time).
benchmarks/bench_timeline.py reads it. Without the variable a mark costs one dictionary
lookup: it stays in the code that users run.
"""
from __future__ import annotations

import json
import os
import threading
import time

_PATH = os.environ.get("TFDEPLOY_TIMELINE")
_lock = threading.Lock()


def mark(phase: str, host: str | None = None) -> None:
    """`phase` (for `host`, when one host's part of it) has just ended."""
    if not _PATH:
        return
    line = json.dumps({"phase": phase, "host": host, "t": time.time()}) + "\n"
    with _lock, open(_PATH, "a", encoding="utf-8") as out:
        out.write(line)
