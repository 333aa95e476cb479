"""Each host's progress through `inv setup`, from the frames of its build's answer
(deploy/host/venv.py): reused, built or failed, the step it is at, pip's last lines."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Mapping, Optional

from deploy.host.protocol import SetupEvent


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
        """One frame of the host's build (a failed build is its answer's error)."""
        if event.event == "done":
            self.state = "reused" if event.reused else "built"
            self.line, self.versions = f"environment {self.state}", event.versions
            self.env = event.env or self.env
        elif event.text is not None:
            self.line = event.text
            self.tail = (self.tail + [event.text])[-40:]
