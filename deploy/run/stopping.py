"""Stopping every task of a run: a stop request to every host's agent while the run is
followed (its answer comes with the followers' events, and the main loop goes on reading
them), and a stop awaited on its own (Session.stop) for a host whose agent cannot be asked
or does not answer in time.
"""
from __future__ import annotations

import dataclasses
import time

from deploy.host.protocol import Stopped
from deploy.run.follow import Followers
from deploy.run.run import Run

# Seconds beyond the grace period to wait for a host's answer to a stop before asking that
# host again and awaiting the answer (Session.stop).
STOP_ANSWER_SLACK = 10.0


class Stopper:
    def __init__(self, run: Run, followers: Followers | None = None):
        self.run, self.followers = run, followers
        self.pending: dict[str, float] = {}     # host -> when a fast stop was asked

    def stop(self) -> None:
        """Ask every host to stop its tasks (TERM, KILL after the grace); the answers come
        with the followers' events (answered())."""
        # A host given up on is not asked: its tasks are out of reach, and the run's end
        # says what may be left there (finish.py).
        lost = self.run.lost
        if self.followers is None:
            self.stop_hosts([hp.host.name for hp in self.run.plan.hosts
                             if hp.host.name not in lost])
            return
        failed = self.followers.send_stop(self.run.plan.options.grace)
        now = time.monotonic()
        self.pending.update({hp.host.name: now for hp in self.run.plan.hosts
                             if hp.tasks and hp.host.name not in failed})
        failed = [name for name in failed if name not in lost]
        if failed:
            self.stop_hosts(failed)

    def answered(self, host: str, answer: Stopped) -> None:
        self.pending.pop(host, None)
        if answer.survivors:
            pids = ", ".join(map(str, answer.survivors))
            self.run.problems.append(f"{host}: processes of the run still alive after "
                                     f"SIGKILL: {pids}")

    def stop_unanswered(self, force: bool = False) -> None:
        """A host that did not answer a stop in time is asked again, the answer awaited."""
        limit = self.run.plan.options.grace + STOP_ANSWER_SLACK
        late = [h for h, asked in self.pending.items()
                if force or time.monotonic() - asked > limit]
        if late:
            self.stop_hosts(late)

    def stop_hosts(self, names: list[str]) -> None:
        for name in names:
            self.pending.pop(name, None)
        run = self.run
        hosts = tuple(hp for hp in run.plan.hosts if hp.host.name in names)
        run.problems += run.session.stop(dataclasses.replace(run.plan, hosts=hosts)).values()

    def wait_for_answers(self, take) -> None:
        """After Ctrl-C: wait for the hosts' answers (the loop that would read them is being
        left), passing on the followers' other events to `take`; a host that does not answer
        in time is asked again, the answer awaited. Sets run.stopped_clean."""
        deadline = time.monotonic() + self.run.plan.options.grace + STOP_ANSWER_SLACK
        while self.pending and time.monotonic() < deadline:
            event = self.followers.next(timeout=0.25)
            if event is None:
                continue
            if event.kind in ("tasks", "stopped"):
                take(event)
            elif event.kind == "error" and event.host in self.pending:
                # Its agent was lost before answering: stopped by a request of its own, which
                # reports that host as unanswered if it is still gone.
                self.stop_hosts([event.host])
        self.stop_unanswered(force=True)
        self.run.stopped_clean = not self.run.problems
