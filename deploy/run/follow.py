"""Live streams of every host's task states and logs, merged into one queue.

One long-lived agent process per host pushes changes as they happen, log bytes as frames
(deploy/host/frames.py); the controller's main thread only reads the queue, so Ctrl-C reaches
it at once and no thread touches task state. The queue is bounded: a reader that gets ahead
of the main thread waits, the channel fills, and the host's follower waits too; the logs wait
on the hosts' disks, not in the controller's memory.
"""
from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from typing import Mapping

from deploy.host.frames import read_frame
from deploy.plan.planner import HostPlan, RunPlan, follow_command, host_offsets
from deploy.ssh.transport import LineStream, Transport

RESTARTS = 3
# Documents waiting for the main thread; each carries at most one chunk of log per task.
QUEUED = 8


@dataclass(frozen=True)
class Event:
    host: str
    kind: str          # "doc": agent answer; "end": stream ended; "error": stream failed
    doc: dict | None = None
    error: str = ""


class Followers:
    def __init__(self, plan: RunPlan, transports: Mapping[str, Transport]):
        self.plan, self.transports = plan, transports
        self.events: queue.Queue[Event] = queue.Queue(QUEUED)
        self.streams: dict[str, LineStream] = {}
        self.restarts = {hp.host.name: 0 for hp in plan.hosts}
        self.lock = threading.Lock()
        self.closed = False

    def start(self, hp: HostPlan, offsets: Mapping[int, int]) -> None:
        mine = host_offsets(hp, offsets)
        thread = threading.Thread(target=self._read, args=(hp, mine), daemon=True,
                                  name=f"follow-{hp.host.name}")
        thread.start()

    def start_all(self, offsets: Mapping[int, int]) -> None:
        for hp in self.plan.hosts:
            self.start(hp, offsets)

    def restart(self, host: str, offsets: Mapping[int, int]) -> bool:
        """Follow `host` again from `offsets` after its stream broke; False once exhausted."""
        self.restarts[host] += 1
        if self.restarts[host] > RESTARTS:
            return False
        self.start(next(hp for hp in self.plan.hosts if hp.host.name == host), offsets)
        return True

    def _read(self, hp: HostPlan, offsets: Mapping[int, int]) -> None:
        name = hp.host.name
        try:
            command = follow_command(hp.host, hp.run_dir, offsets)
            stream = self.transports[name].stream(command.line)
            with self.lock:
                if self.closed:
                    stream.close()
                    return
                self.streams[name] = stream
            while (doc := read_frame(stream)) is not None:
                self._put(Event(name, "doc", doc))
            self._put(Event(name, "end"))
        except Exception as exc:  # reported to the main thread, which decides
            self._put(Event(name, "error", error=str(exc)))

    def _put(self, event: Event) -> None:
        """Queue `event`, waiting while the queue is full; dropped once following is over."""
        while not self.closed:
            try:
                self.events.put(event, timeout=0.25)
                return
            except queue.Full:
                continue

    def send_stop(self, grace: float) -> list[str]:
        """Ask every host's follower to stop its tasks now (TERM, KILL after `grace`); each
        answers with a {"stopped": ...} document. Returns the hosts it could not ask."""
        with self.lock:
            streams = dict(self.streams)
        failed = []
        for hp in self.plan.hosts:
            stream = streams.get(hp.host.name)
            try:
                if stream is None:
                    raise OSError("no follower")
                stream.send(f"stop {grace:g}\n".encode())
            except Exception:  # that host is stopped the slow way instead
                failed.append(hp.host.name)
        return failed

    def next(self, timeout: float) -> Event | None:
        try:
            return self.events.get(timeout=timeout)
        except queue.Empty:
            return None

    def close(self) -> None:
        with self.lock:
            self.closed = True
            streams = list(self.streams.values())
        for stream in streams:
            try:
                stream.close()
            except Exception:  # closing a broken stream may fail; it is being dropped
                pass
