"""Following a run to its end: every task's log streamed live, the first failure stops the
others, and a startup watchdog stops a run whose tasks never reach a first training step.
With --restarts a failed attempt is relaunched (restarts.py) and followed again.
"""
from __future__ import annotations

import time

from deploy.console.view import LiveView, failure_panel, say
from deploy.run.follow import Event, Followers
from deploy.run.run import Run, RunSettings, ignore_sigint
from deploy.run.stopping import Stopper
from deploy.ssh.session import StepFailed
from deploy.state.progress import TaskProgress


class Watch:
    def __init__(self, run: Run, start_timeout: float):
        self.run, self.start_timeout = run, start_timeout
        self.followers = Followers(run.plan, run.session.transports)
        self.stopper = Stopper(run, self.followers)
        self.by_index = {t.index: t for t in run.tasks}
        self.host_tasks = {hp.host.name: [self.by_index[t.index] for t in hp.tasks]
                           for hp in run.plan.hosts}

    def follow(self) -> None:
        """Stream every task's log until all have ended; on the first failure stop the rest."""
        run = self.run
        self.followers.start_all(run.offsets())
        deadline = time.monotonic() + self.start_timeout if self.start_timeout > 0 else 0.0
        try:
            with LiveView(run.console, run.tasks, f"run {run.plan.run_id}", run.raw) as view:
                while not all(t.finished for t in run.tasks):
                    if deadline and time.monotonic() > deadline:
                        self.check_started()
                        deadline = 0.0
                    self.stopper.stop_unanswered()
                    event = self.followers.next(timeout=0.25)
                    if event is not None:
                        self.handle(event, view)
                    view.refresh()
        except KeyboardInterrupt:
            if run.interrupt_stops:
                restore = ignore_sigint()
                try:
                    self.stopper.stop()
                    self.stopper.wait_for_answers(lambda event: self.take(event, None))
                finally:
                    restore()
            raise
        finally:
            self.followers.close()

    def handle(self, event: Event, view: LiveView) -> None:
        if event.kind == "doc":
            self.take(event, view)
        elif not all(t.finished for t in self.host_tasks[event.host]):
            # The stream broke (or ended early): follow again from where we are.
            if event.error:
                say(self.run.console, f"following {event.host}: {event.error}", "yellow")
            if not self.followers.restart(event.host, self.run.offsets()):
                raise StepFailed(f"{event.host}: lost contact while following the run: "
                                 f"{event.error or 'stream ended'}")

    def take(self, event: Event, view: LiveView | None) -> None:
        """One follower document: task states and log bytes, or the answer to a stop."""
        if "stopped" in event.doc:
            self.stopper.answered(event.host, event.doc["stopped"])
            return
        for index, status in event.doc["tasks"].items():
            task = self.by_index[int(index)]
            self.run.apply(task, status, status.pop("data", b""), view)
            if task.finished and task.failed and self.run.failure is None and view is not None:
                self.fail(task)

    def fail(self, task: TaskProgress) -> None:
        reason = (f"exit code {task.code}" if task.state == "exited"
                  else "its process group vanished without an exit code")
        self.run.failure = (task, reason)
        self.run.console.print(failure_panel(task, reason, self.run.raw))
        say(self.run.console, f"{task.name} failed: stopping the other tasks", "red")
        self.stopper.stop()

    def check_started(self) -> None:
        """Fail the run if some task never reached its first training step.
        Only a payload that prints events is watched: of another one we cannot tell."""
        run = self.run
        if not any(t.speaks_events for t in run.tasks):
            return
        stuck = [t for t in run.tasks if not t.first_step and t.state not in ("exited", "lost")]
        if stuck and run.failure is None:
            names = ", ".join(f"{t.name} ({t.host})" for t in stuck)
            for task in stuck:
                run.console.print(failure_panel(task, "no training step yet", run.raw))
            run.failure = (stuck[0], f"startup watchdog: {names} did not reach a first "
                                     f"training step within {self.start_timeout:g} s")
            say(run.console, run.failure[1] + " — stopping the run", "red")
            self.stopper.stop()


def follow_to_end(run: Run, settings: RunSettings, restarter=None) -> None:
    """Watch the run until every task has ended; on a failure, relaunch while `restarter`
    allows (--restarts)."""
    while True:
        Watch(run, settings.start_timeout).follow()
        if run.failure is None or restarter is None or not restarter.may_restart(run):
            return
        restarter.restart(run)
