"""How many log lines reach the screen. Every line while they come at a pace a person can
read; under a flood (a payload printing thousands of lines a second) a sample of each
flooded task's lines and how many lines a second it prints, so that the console never falls
behind the logs and costs the controller little. This decides only what is shown: the files
in runs/<id>/ keep every byte.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

# Lines a second the console prints, sustained, and at once after a quiet spell: a model's
# summary or TensorFlow's start-up chatter (tens of lines) always shows whole.
RATE = 500.0
BURST = 2000
# A flooded task's sample: this many of its latest lines, at most once a period.
SAMPLE_LINES = 3
SAMPLE_PERIOD = 1.0
# Event lines of a flooded stretch kept to show with its sample (they are few; a payload
# flooding with events keeps only its latest).
SAMPLE_EVENTS = 20


@dataclass
class Skipped:
    """Lines of one task not shown since `since`: how many, its latest lines and events."""
    since: float
    count: int = 0
    latest: list[str] = field(default_factory=list)
    events: list[str] = field(default_factory=list)

    def rate(self, now: float) -> float:
        return self.count / max(now - self.since, 1e-3)


class LineBudget:
    """A token bucket of lines: `admit` says whether a chunk of lines may print whole; the
    chunks it refuses are counted per task (`skip`) and come out as samples (`due`)."""

    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self.tokens = float(BURST)
        self.at = clock()
        self.skipped: dict[int, Skipped] = {}

    def admit(self, count: int) -> bool:
        now = self.clock()
        self.tokens = min(float(BURST), self.tokens + (now - self.at) * RATE)
        self.at = now
        if count > self.tokens:
            return False
        self.tokens -= count
        return True

    def skip(self, task: int, count: int, latest: list[str], events: list[str]) -> None:
        skipped = self.skipped.setdefault(task, Skipped(self.clock()))
        skipped.count += count
        skipped.latest = (skipped.latest + latest)[-SAMPLE_LINES:]
        skipped.events = (skipped.events + events)[-SAMPLE_EVENTS:]

    def take(self, task: int) -> Skipped | None:
        """The task's skipped lines, to be reported now (before it prints more lines)."""
        return self.skipped.pop(task, None)

    def due(self, everything: bool = False) -> list[tuple[int, Skipped]]:
        """The tasks whose sample is due (all of them with `everything`), taken out."""
        now = self.clock()
        tasks = [task for task, skipped in self.skipped.items()
                 if everything or now - skipped.since >= SAMPLE_PERIOD]
        return [(task, self.skipped.pop(task)) for task in tasks]


def skipped_text(skipped: Skipped, now: float, log_name: str) -> str:
    """`… 98,765 lines not shown (96,000 lines/s); worker-0.log has every line`"""
    return (f"… {skipped.count:,} lines not shown ({skipped.rate(now):,.0f} lines/s); "
            f"{log_name} has every line")
