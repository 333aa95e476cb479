"""Following a run: one path for a run just launched (launch.py) and for one found again
from its local record (reattach.py), so both are watched, stopped and (finish.py) ended the
same way.
"""
from __future__ import annotations

import dataclasses
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from rich.console import Console

from deploy.console.view import LiveView, failure_panel, print_lines, say
from deploy.plan.planner import RunPlan
from deploy.run.follow import Followers
from deploy.ssh.session import Session, StepFailed
from deploy.state.progress import TaskProgress
from deploy.state.record import RunState, update_record

EXIT_INTERRUPTED = 130
# Seconds beyond the grace period to wait for a follower's answer to a stop before stopping
# that host with a command of its own.
STOP_ANSWER_SLACK = 10.0


@dataclass(frozen=True)
class RunSettings:
    runs_dir: Path = Path("runs")
    connect_timeout: float = 10.0
    accept_new_host_keys: bool = False
    # A worker whose peer never comes waits for an hour and ignores SIGTERM: without this
    # watchdog a missing or blocked peer is a silent hang.
    start_timeout: float = 120.0
    restarts: int = 0
    detach: bool = False
    # Probe every host and the TCP mesh before anything is written anywhere (checkrun.py).
    check: bool = True


class Run:
    """The state of one run on the controller: its plan, its tasks' progress, its local files.
    The same object follows a run it just launched and one it found again from its record."""

    def __init__(self, plan: RunPlan, session: Session, local_dir: Path, console: Console,
                 only_task: int | None = None, writes_logs: bool = True):
        self.plan, self.session, self.dir, self.console = plan, session, local_dir, console
        self.tasks = [TaskProgress(t.index, t.host.name) for t in plan.tasks]
        self.only_task = only_task          # `inv logs --task N`: print only its lines
        self.writes_logs = writes_logs      # False while another controller follows the run
        self.logs = {t.index: open(local_dir / f"{t.name}.log", "ab") for t in plan.tasks} \
            if writes_logs else {}
        self.failure: tuple[TaskProgress, str] | None = None
        self.problems: list[str] = []
        self.attempts: list[dict] = []
        self.attempt = 1
        # Ctrl-C while following stops the run (inv train), or only the following (inv logs).
        self.interrupt_stops = True
        self.followers: Followers | None = None
        self.stop_pending: dict[str, float] = {}    # host -> when a fast stop was asked
        self.stopped_clean = False                  # every host answered: nothing survived

    def set_state(self, state: RunState, **fields) -> None:
        update_record(self.dir, state=state, **fields)

    def show(self, task: TaskProgress, lines: list[str], view: LiveView | None = None) -> None:
        if self.only_task is not None and task.index != self.only_task:
            return
        if view:
            view.lines(task, lines)
        else:
            print_lines(self.console, task, lines)

    def catch_up(self, print_lines: bool = True) -> None:
        """Read every task's log on the hosts from where the local copy ends, to its end."""
        while True:
            answers, errors = self.session.poll(self.plan, self.offsets())
            for name, error in errors.items():
                raise StepFailed(f"{name}: reading the logs: {error}")
            more = False
            for task in self.tasks:
                if task.index in answers:
                    data, lines = task.update(answers[task.index])
                    self._keep(task, data)
                    if print_lines:
                        self.show(task, lines)
                    more = more or task.offset < task.size
            if not more:
                return

    def _keep(self, task: TaskProgress, data: bytes) -> None:
        if self.writes_logs and data:
            self.logs[task.index].write(data)
            self.logs[task.index].flush()

    def watch(self, start_timeout: float) -> None:
        """Stream every task's log until all have ended; on the first failure stop the rest."""
        followers = self.followers = Followers(self.plan, self.session.transports)
        by_index = {t.index: t for t in self.tasks}
        hosts = {hp.host.name: [by_index[t.index] for t in hp.tasks] for hp in self.plan.hosts}
        followers.start_all(self.offsets())
        deadline = time.monotonic() + start_timeout if start_timeout > 0 else 0.0
        try:
            with LiveView(self.console, self.tasks, f"run {self.plan.run_id}") as view:
                while not all(t.finished for t in self.tasks):
                    if deadline and time.monotonic() > deadline:
                        self._check_started(start_timeout)
                        deadline = 0.0
                    self._stop_slowly_if_unanswered()
                    event = followers.next(timeout=0.25)
                    if event is None:
                        view.refresh()
                        continue
                    if event.kind == "doc":
                        self._take(event, view)
                    elif not all(t.finished for t in hosts[event.host]):
                        # The stream broke (or ended early): follow again from where we are.
                        if event.error:
                            say(self.console, f"following {event.host}: {event.error}", "yellow")
                        if not followers.restart(event.host, self.offsets()):
                            raise StepFailed(f"{event.host}: lost contact while following the "
                                             f"run: {event.error or 'stream ended'}")
                    view.refresh()
        except KeyboardInterrupt:
            if self.interrupt_stops:
                restore = ignore_sigint()
                try:
                    self._stop_at_once(wait=True)
                finally:
                    restore()
            raise
        finally:
            followers.close()
            self.followers = None
        # Asked to stop, but the tasks ended before a follower answered: nothing to wait for.
        self.stop_pending.clear()

    def stop_tasks(self) -> None:
        """Stop every task: through the running followers when there are (at once), else
        with one command per host."""
        if self.followers is None:
            self.problems += self.session.stop(self.plan).values()
            return
        self._stop_at_once(wait=False)

    def _stop_at_once(self, wait: bool) -> None:
        grace = self.plan.options.grace
        failed = self.followers.send_stop(grace)
        now = time.monotonic()
        self.stop_pending.update({hp.host.name: now for hp in self.plan.hosts
                                  if hp.host.name not in failed})
        if failed:
            self._stop_hosts(failed)
        if not wait:
            return
        # Ctrl-C: wait for the answers (the loop that would read them is being left).
        deadline = now + grace + STOP_ANSWER_SLACK
        while self.stop_pending and time.monotonic() < deadline:
            event = self.followers.next(timeout=0.25)
            if event is None:
                continue
            if event.kind == "doc":
                self._take(event, None)
            elif event.host in self.stop_pending:
                # Its follower ended (every task there ended) before answering.
                self._stop_hosts([event.host])
        self._stop_slowly_if_unanswered(force=True)
        self.stopped_clean = not self.problems

    def _take(self, event, view: LiveView | None) -> None:
        """One follower document: task states and log bytes, or the answer to a stop."""
        if "stopped" in event.doc:
            self._stopped(event.host, event.doc["stopped"])
            return
        by_index = {t.index: t for t in self.tasks}
        for index, doc in event.doc["tasks"].items():
            self._apply(by_index[int(index)], doc, view)

    def _stopped(self, host: str, answer: dict) -> None:
        self.stop_pending.pop(host, None)
        if answer.get("survivors"):
            pids = ", ".join(map(str, answer["survivors"]))
            self.problems.append(f"{host}: processes of the run still alive after SIGKILL: "
                                 f"{pids}")

    def _stop_slowly_if_unanswered(self, force: bool = False) -> None:
        """A host whose follower did not answer a stop in time is stopped by a command."""
        late = [h for h, asked in self.stop_pending.items()
                if force or time.monotonic() - asked > self.plan.options.grace + STOP_ANSWER_SLACK]
        if late:
            self._stop_hosts(late)

    def _stop_hosts(self, names: list[str]) -> None:
        for name in names:
            self.stop_pending.pop(name, None)
        hosts = tuple(hp for hp in self.plan.hosts if hp.host.name in names)
        self.problems += self.session.stop(dataclasses.replace(self.plan, hosts=hosts)).values()

    def _check_started(self, start_timeout: float) -> None:
        """Fail the run if some task never reached its first training step.
        Only a payload that prints events is watched: of another one we cannot tell."""
        if not any(t.speaks_events for t in self.tasks):
            return
        stuck = [t for t in self.tasks if not t.first_step and t.state not in ("exited", "lost")]
        if stuck and self.failure is None:
            names = ", ".join(f"{t.name} ({t.host})" for t in stuck)
            for task in stuck:
                self.console.print(failure_panel(task, "no training step yet"))
            self.failure = (stuck[0], f"startup watchdog: {names} did not reach a first "
                                      f"training step within {start_timeout:g} s")
            say(self.console, self.failure[1] + " — stopping the run", "red")
            self.stop_tasks()

    def offsets(self) -> dict[int, int]:
        return {t.index: t.offset for t in self.tasks}

    def _apply(self, task: TaskProgress, doc: dict, view: LiveView | None) -> None:
        data, lines = task.update(doc)
        self._keep(task, data)
        self.show(task, lines, view)
        if task.finished and task.failed and self.failure is None and view is not None:
            self._fail(task)

    def _fail(self, task: TaskProgress) -> None:
        reason = (f"exit code {task.code}" if task.state == "exited"
                  else "its process group vanished without an exit code")
        self.failure = (task, reason)
        self.console.print(failure_panel(task, reason))
        say(self.console, f"{task.name} failed: stopping the other tasks", "red")
        self.stop_tasks()

    def close(self) -> None:
        """Drop the connections and close the local logs; the run itself goes on as it is."""
        if self.session:
            self.session.close()
        for log in self.logs.values():
            log.close()


def load_local_logs(run: Run, shown: Callable[[TaskProgress, list[str]], None] | None) -> None:
    """Start from the local copies of the logs: their metrics count, and reading the hosts'
    logs goes on from where they end, so no byte is printed or stored twice."""
    for task in run.tasks:
        path = run.dir / f"{task.name}.log"
        lines = task.replay(path.read_bytes() if path.exists() else b"")
        if shown:
            shown(task, lines)


def follow_to_end(run: Run, settings: RunSettings, restarter=None) -> None:
    """Watch the run until every task has ended; on a failure, relaunch while `restarter`
    allows (--restarts)."""
    while True:
        run.watch(settings.start_timeout)
        if run.failure is None or restarter is None or not restarter.may_restart(run):
            return
        restarter.restart(run)


def ignore_sigint():
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    return lambda: signal.signal(signal.SIGINT, previous)

