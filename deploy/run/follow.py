"""Live streams of every host's task states and logs, merged into one queue.

Each host's agent follows its tasks and sends changes as they happen, log bytes as frames
(deploy/host/frames.py); the controller's main thread only reads the queue, so Ctrl-C reaches
it at once and no thread touches task state. The agent sends at most a few frames ahead of
what the main thread has taken (credits, deploy/host/agent.py): a controller that falls
behind stops the hosts' follows, and the logs wait on the hosts' disks, not in the
controller's memory; the agents' readers never wait, so other answers (a stop) still come.
"""
from __future__ import annotations

import queue
from dataclasses import dataclass
from typing import Mapping

from deploy.host.protocol import Stopped, Tasks
from deploy.plan.planner import (
    HostPlan, RunPlan, credit_request, follow_request, host_offsets, stop_request
)
from deploy.cluster.hostagent import HostAgent, Reply

RESTARTS = 3


@dataclass(frozen=True)
class Event:
    host: str
    kind: str          # "tasks": a follow frame; "stopped": a stop's answer; "end": the
                       # follow ended; "error": it failed
    tasks: Tasks | None = None
    stopped: Stopped | None = None
    error: str = ""
    broken: bool = False   # the error is an answer that broke the protocol: asking again
                           # would get the same


class Followers:
    def __init__(self, plan: RunPlan, agents: Mapping[str, HostAgent]):
        self.plan, self.agents = plan, agents
        self.events: queue.Queue[Event] = queue.Queue()
        self.follows: dict[str, int] = {}       # host -> the id of its running follow
        self.restarts = {hp.host.name: 0 for hp in plan.hosts}
        self.closed = False

    def start(self, hp: HostPlan, offsets: Mapping[int, int]) -> None:
        name = hp.host.name

        def on_frame(tasks: Tasks) -> None:
            self._put(Event(name, "tasks", tasks))

        def on_end(reply: Reply) -> None:
            self._put(Event(name, "error", error=reply.error, broken=reply.broken)
                      if reply.error else Event(name, "end"))
        request = follow_request(hp.run_dir, host_offsets(hp, offsets))
        reply = self.agents[name].ask(request, "following", on_frame=on_frame, on_end=on_end)
        self.follows[name] = reply.number

    def start_all(self, offsets: Mapping[int, int]) -> None:
        for hp in self.plan.hosts:
            if hp.tasks:                # a spare, or a host given up on, has none to follow
                self.start(hp, offsets)

    def restart(self, host: str, offsets: Mapping[int, int]) -> bool:
        """Follow `host` again from `offsets` after its follow failed; False once exhausted."""
        self.restarts[host] += 1
        if self.restarts[host] > RESTARTS:
            return False
        self.start(next(hp for hp in self.plan.hosts if hp.host.name == host), offsets)
        return True

    def _put(self, event: Event) -> None:
        if not self.closed:
            self.events.put(event)

    def send_stop(self, grace: float) -> list[str]:
        """Ask every host's agent to stop its tasks now (TERM, KILL after `grace`); each
        answer comes as a "stopped" event. Returns the hosts it could not ask."""
        failed = []
        for hp in self.plan.hosts:
            name = hp.host.name
            if not hp.tasks:
                continue

            def on_end(reply: Reply, name: str = name) -> None:
                self._put(Event(name, "error", error=reply.error) if reply.error
                          else Event(name, "stopped", stopped=reply.answer))
            agent = self.agents.get(name)
            if agent is None or agent.lost:
                failed.append(name)     # that host is stopped the slow way instead
                continue
            agent.ask(stop_request(hp.run_dir, grace), "stopping", on_end=on_end)
        return failed

    def next(self, timeout: float) -> Event | None:
        """The next event; taking a host's follow frame lets its agent send one more."""
        try:
            event = self.events.get(timeout=timeout)
        except queue.Empty:
            return None
        if event.kind == "tasks" and event.host in self.follows:
            self.agents[event.host].tell(credit_request(self.follows[event.host]))
        return event

    def close(self) -> None:
        self.closed = True
