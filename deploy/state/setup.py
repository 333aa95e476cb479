"""Each host's progress through `inv setup`, from the JSON lines its setup step prints
(deploy/host/env.py): reused, built or failed, the step it is at, pip's last lines."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field


@dataclass
class HostProgress:
    name: str
    state: str = "checking"
    line: str = ""
    started: float = field(default_factory=time.monotonic)
    ended: float | None = None
    result: dict | None = None
    env: str | None = None           # the environment's directory, as the host named it
    tail: list[str] = field(default_factory=list)

    def seconds(self) -> float:
        return (self.ended or time.monotonic()) - self.started

    def apply(self, doc: dict) -> None:
        """One event of the host's setup step (setup_event)."""
        event = doc.get("event")
        if event == "done":
            self.state = "reused" if doc.get("reused") else "built"
            self.line, self.result = f"environment {self.state}", doc
        elif event == "error":
            self.state, self.line = "failed", doc.get("message", "failed")
        elif "text" in doc:
            self.line = doc["text"]
            self.tail = (self.tail + [doc["text"]])[-40:]


def setup_event(raw: bytes) -> dict:
    """One line of the setup step: its JSON event, or a plain log line as one."""
    text = raw.decode("utf-8", "replace").strip()
    try:
        doc = json.loads(text)
        return doc if isinstance(doc, dict) else {"event": "log", "text": text}
    except ValueError:
        return {"event": "log", "text": text}
