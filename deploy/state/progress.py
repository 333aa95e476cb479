"""What the controller knows about each task, updated from the agent's answers.

Pure: it turns task states and log bytes into states, metrics and complete log lines;
printing and networking live elsewhere. Nothing here grows with the log: a chunk's lines stay
one block of bytes, split only when the console asks for them (NewLines); only event lines,
found by a byte search, are decoded and parsed, all of them.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from deploy.host.layout import task_key, task_name
from deploy.host.protocol import FINAL_STATES, TaskStatus
# A line longer than this (a progress bar redrawn with \r and no newline for a whole epoch)
# keeps only its last bytes for the console; the log file keeps all of it.
MAX_PARTIAL = 64 << 10
# Every event line holds this key; the lines without it are never decoded.
EVENT_KEY = b'"event"'
# Keras' own output, for payloads that print no event lines (`model.fit(verbose=1 or 2)`):
# `Epoch 3/5`, then the epoch's last progress line, `20/20 - 0s - loss: 0.6526 - accuracy:
# 0.7302 - 57ms/epoch - 3ms/step` (verbose=1: `20/20 [====] - 0s 3ms/step - loss: ...`, the
# bar redrawn with \r before it). Only lines holding one of these are decoded.
KERAS_MARKERS = (b"Epoch ", b"loss: ")
KERAS_EPOCH = re.compile(r"^Epoch (\d+)/(\d+)\s*$")
KERAS_LAST_STEP = re.compile(r"^\s*(\d+)/(\1)\b(.*\bloss: .*)$")
KERAS_METRIC = re.compile(r"\b([A-Za-z_][\w.]*): (-?(?:\d+\.?\d*|\.\d+)(?:e[-+]?\d+)?|nan|-?inf)"
                          r"(?=\s|$)")
KERAS_TIME = re.compile(r"\b(\d+(?:\.\d+)?)(us|ms|s)/(epoch|step)\b")
UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}


def decoded(line: bytes) -> str:
    return line.rstrip(b"\r").decode("utf-8", "replace")


@dataclass
class NewLines:
    """The complete lines one chunk of log ended, as one block of bytes (each line ends with
    a newline), and a last line without one when the task has ended."""
    block: bytes = b""
    last: str | None = None
    events: list[str] = field(default_factory=list)    # the event lines among them

    @property
    def count(self) -> int:
        return self.block.count(b"\n") + (self.last is not None)

    def all(self) -> list[str]:
        lines = [decoded(line) for line in self.block.split(b"\n")[:-1]]
        return lines + ([self.last] if self.last is not None else [])

    def last_lines(self, n: int) -> list[str]:
        """The last `n` lines, splitting nothing before them."""
        if n <= 0:
            return []
        pieces = self.block[:-1].rsplit(b"\n", n)[-n:] if self.block else []
        lines = [decoded(line) for line in pieces]
        return (lines + ([self.last] if self.last is not None else []))[-n:]


@dataclass
class TaskProgress:
    index: int
    host: str
    state: str = "pending"
    code: int | None = None
    pid: int | None = None
    started: float | None = None
    ended: float | None = None
    offset: int = 0
    size: int = 0
    epoch: int | None = None
    loss: float | None = None
    losses: list[float] = field(default_factory=list)
    metrics: dict = field(default_factory=dict)
    val_losses: list[float] = field(default_factory=list)
    epochs_total: int | None = None  # from the start event, when the payload says
    steps_per_epoch: int | None = None
    epoch_seconds: list[float] = field(default_factory=list)
    first_step: bool = False
    speaks_events: bool = False      # printed any {"event": ...} line
    partial: bytes = b""
    tail: list[str] = field(default_factory=list)
    role: str = "worker"             # its task type
    type_index: int | None = None    # its index among its type (None: its index, a worker)
    relaunches: int = 0              # times it was relaunched in place (a ps cluster's worker)
    keras_epoch: int | None = None   # Keras' `Epoch N/M` header read, its end not yet
    keras_seen: bool = False         # an epoch was read from Keras' own output
    gpu: str | None = None           # its CUDA_VISIBLE_DEVICES ("all": every GPU of its host)
    gpu_utilization: int | None = None   # % and MiB, as its host's beats last sampled them
    gpu_memory: int | None = None
    gpu_memory_peak: int | None = None

    def gpu_sampled(self, utilization: int | None, memory: int | None) -> None:
        self.gpu_utilization, self.gpu_memory = utilization, memory
        if memory is not None:
            self.gpu_memory_peak = max(memory, self.gpu_memory_peak or 0)

    @property
    def name(self) -> str:
        return task_name(task_key(self.role, self.index if self.type_index is None
                                  else self.type_index))

    @property
    def finished(self) -> bool:
        """Ended, and every byte of its log read."""
        return self.state in FINAL_STATES and self.offset >= self.size

    def host_lost(self) -> None:
        """Its host stopped answering: nothing more will be read of it here."""
        if self.state not in FINAL_STATES:
            self.state = "lost"
        self.size = self.offset

    @property
    def failed(self) -> bool:
        return self.state == "lost" or (self.state == "exited" and self.code != 0)

    @property
    def duration(self) -> float | None:
        if self.started is None or self.ended is None:
            return None
        return self.ended - self.started

    def update(self, status: TaskStatus, tail_lines: int = 40) -> NewLines:
        """Apply one answer of the host: the task's `status` (checked: protocol.py) and its
        next log bytes; return the complete lines they end."""
        self.state = status.state
        for key in ("code", "pid", "started", "ended"):
            if getattr(status, key) is not None:
                setattr(self, key, getattr(status, key))
        self.offset, self.size = status.offset, status.size
        new = self.feed(status.data)
        # A task that ended without a final newline still gets its last line shown.
        if self.finished and self.partial:
            new.last = self.partial.decode("utf-8", "replace")
            self._observe(new, [new.last])
            self.partial = b""
        self.tail = (self.tail + new.last_lines(tail_lines))[-tail_lines:]
        return new

    def replay(self, data: bytes, tail_lines: int = 40) -> NewLines:
        """Take in the next piece of a local copy of the log (a reattaching controller): the
        metrics and losses it holds, and the offset from which the host has more."""
        new = self.feed(data)
        self.tail = (self.tail + new.last_lines(tail_lines))[-tail_lines:]
        self.offset = self.size = self.offset + len(data)
        return new

    def moved(self, host: str, gpu: str | None) -> None:
        """From the next attempt on the task runs on `host` (its own was lost): its log there
        starts empty, and the local log goes on where it ends (a partial line is dropped)."""
        self.host, self.gpu = host, gpu
        self.offset = self.size = 0
        self.partial = b""

    def new_attempt(self) -> None:
        """The task is launched again (--restarts): a fresh state, the same log and offset."""
        self.state, self.code = "pending", None
        self.pid, self.started, self.ended = None, None, None
        self.first_step = False

    def feed(self, data: bytes) -> NewLines:
        """The lines `data` completes, with its event lines taken in."""
        end = data.rfind(b"\n")
        if end < 0:
            self.partial = (self.partial + data)[-MAX_PARTIAL:]
            return NewLines()
        new = NewLines(self.partial + data[:end + 1])
        self.partial = data[end + 1:][-MAX_PARTIAL:]
        self._observe(new, self._event_lines(new.block))
        return new

    @staticmethod
    def _event_lines(block: bytes) -> list[str]:
        """The lines of `block` that hold the event key (a byte search, not a split)."""
        return _lines_holding(block, (EVENT_KEY,))

    def _observe(self, new: NewLines, lines: list[str]) -> None:
        for line in lines:
            if self.observe(line):
                new.events.append(line)
        if not self.speaks_events:
            for line in _lines_holding(new.block, KERAS_MARKERS):
                self.observe_keras(line)

    def observe_keras(self, line: str) -> None:
        """Take in Keras' epoch header or an epoch's last progress line."""
        line = line.rsplit("\r", 1)[-1].strip()
        header = KERAS_EPOCH.match(line)
        if header:
            self.keras_epoch, self.epochs_total = int(header[1]), int(header[2])
            return
        last = KERAS_LAST_STEP.match(line)
        if last is None or self.keras_epoch is None:
            return
        metrics = {name: float(value) for name, value in KERAS_METRIC.findall(last[3])}
        steps = int(last[1])
        took = KERAS_TIME.search(last[3])
        seconds = None if took is None else float(took[1]) * UNITS[took[2]] * (
            steps if took[3] == "step" else 1)
        self.steps_per_epoch, self.keras_seen = steps, True
        self.epoch_ended(self.keras_epoch, metrics, seconds)
        self.keras_epoch = None           # once per epoch, however often the line repeats

    def observe(self, line: str) -> bool:
        """Take in the event `line` holds, if any; whether it held one. Event lines win over
        Keras' output: what was read of that is dropped at the first one."""
        event = parse_event(line)
        if not event:
            return False
        if self.keras_seen and not self.speaks_events:
            self.losses, self.val_losses, self.epoch_seconds = [], [], []
            self.epoch, self.loss, self.metrics = None, None, {}
        self.speaks_events = True
        kind = event.get("event")
        if kind == "start":
            self.epochs_total = _count(event.get("epochs"))
            self.steps_per_epoch = _count(event.get("steps_per_epoch"))
        elif kind == "first_step":
            self.first_step = True
        elif kind == "resumed" and isinstance(event.get("epoch"), int):
            # Training goes on after the last backed-up epoch: the losses of epochs after
            # it (from a failed attempt) are replaced by the new attempt's.
            for series in (self.losses, self.val_losses, self.epoch_seconds):
                del series[event["epoch"]:]
        elif kind == "epoch":
            # "seconds" is how long the epoch took, not a metric of the model.
            self.epoch_ended(event.get("epoch"),
                             {k: v for k, v in event.items()
                              if k not in ("event", "task", "epoch", "seconds")
                              and _is_number(v)},
                             event["seconds"] if _is_number(event.get("seconds")) else None)
        return True

    def epoch_ended(self, epoch, metrics: dict, seconds: float | None) -> None:
        """An epoch's end, from an event line or Keras' output: its loss, validation loss,
        metrics and duration."""
        self.first_step = True
        self.epoch = epoch
        loss = metrics.get("loss")
        if _is_number(loss):
            self.loss = float(loss)
            self.losses.append(float(loss))
        if _is_number(metrics.get("val_loss")):
            self.val_losses.append(float(metrics["val_loss"]))
        if seconds is not None and seconds > 0:
            self.epoch_seconds.append(float(seconds))
        self.metrics = metrics

    @property
    def steps_per_second(self) -> float | None:
        """Training steps per second in the last epoch (the payload says how many steps an
        epoch has and how long it took)."""
        if not self.steps_per_epoch or not self.epoch_seconds:
            return None
        return self.steps_per_epoch / self.epoch_seconds[-1]

    @property
    def eta_seconds(self) -> float | None:
        """Seconds until the last epoch ends, from the recent epochs' mean duration, measured
        from the first epoch's end: the first epoch includes tracing the model and joining the
        cluster, which later epochs do not pay, so there is no estimate until a second one."""
        recent = self.epoch_seconds[1:][-5:]
        if not self.epochs_total or self.epoch is None or not recent:
            return None
        return max(0, self.epochs_total - self.epoch) * sum(recent) / len(recent)


# What a run whose tasks printed no epoch says at its end, and `inv plot` of it.
NO_EPOCHS = ("no task printed its epochs, so there is no epoch, loss or loss.png to show: print "
             "Keras' own progress (model.fit(..., verbose=2)) or tfdeploy's event lines "
             "(README: Writing a payload)")


def told_epochs(tasks: list[TaskProgress]) -> bool:
    """Whether any task said how its epochs went (event lines, or Keras' output)."""
    return any(t.speaks_events or t.keras_seen for t in tasks)


def _lines_holding(block: bytes, markers: tuple[bytes, ...]) -> list[str]:
    """The lines of `block` that hold any of `markers`, in order, each once (a byte search,
    not a split)."""
    starts = set()
    for marker in markers:
        at = block.find(marker)
        while at >= 0:
            start = block.rfind(b"\n", 0, at) + 1
            starts.add(start)
            end = block.find(b"\n", at)
            at = block.find(marker, end) if end >= 0 else -1
    return [decoded(block[start:block.find(b"\n", start) if block.find(b"\n", start) >= 0
                          else len(block)]) for start in sorted(starts)]


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _count(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 \
        else None


def parse_event(line: str) -> dict | None:
    """The payload's JSON metrics line, or None for ordinary log output."""
    line = line.strip()
    if not (line.startswith("{") and line.endswith("}")):
        return None
    try:
        doc = json.loads(line)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) and "event" in doc else None


def losses_agree(tasks: list[TaskProgress], rel_tol: float = 1e-6) -> bool | None:
    """True when every task printed the same loss each epoch: training was synchronous.
    None when there is nothing to compare (one task, or no losses)."""
    series = [t.losses for t in tasks if t.losses]
    if len(tasks) < 2 or len(series) < 2:
        return None
    if len({len(s) for s in series}) != 1:
        return False
    for values in zip(*series):
        ref = values[0]
        # Written as "not close" so that a NaN loss never counts as agreeing.
        if not all(abs(v - ref) <= rel_tol * max(1.0, abs(ref)) for v in values):
            return False
    return True
