"""Each host's progress through `inv setup`, from the JSON lines its setup step prints
(deploy/host/venv.py): reused, built or failed, the step it is at, pip's last lines."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Mapping, Optional

from deploy.host.protocol import ProtocolError, SetupEvent


@dataclass
class HostProgress:
    name: str
    state: str = "checking"
    line: str = ""
    started: float = field(default_factory=time.monotonic)
    ended: float | None = None
    versions: Mapping[str, Optional[str]] = field(default_factory=dict)   # of its environment
    env: str | None = None           # the environment's directory, as the host named it
    tail: list[str] = field(default_factory=list)

    def seconds(self) -> float:
        return (self.ended or time.monotonic()) - self.started

    def apply(self, event: SetupEvent) -> None:
        """One event of the host's setup step (setup_event)."""
        if event.event == "done":
            self.state = "reused" if event.reused else "built"
            self.line, self.versions = f"environment {self.state}", event.versions
            self.env = event.env or self.env
        elif event.event == "error":
            self.state, self.line = "failed", event.message or "failed"
        elif event.text is not None:
            self.line = event.text
            self.tail = (self.tail + [event.text])[-40:]


def setup_event(raw: bytes) -> SetupEvent:
    """One line of the setup step: its JSON event (checked: a bad one is the step's failure,
    naming the field), or a plain log line as one."""
    text = raw.decode("utf-8", "replace").strip()
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        doc = None
    if not isinstance(doc, dict):
        return SetupEvent("log", text=text)
    try:
        return SetupEvent.decode(doc)
    except ProtocolError as exc:
        return SetupEvent("error", message=str(exc))
