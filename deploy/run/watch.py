"""Following a run to its end: every task's log streamed live, each task's end judged by its
role (state/lifetime.py: the first failure stops the others; a parameter-server cluster ends
with its chief), and a startup watchdog stops a run whose tasks never reach a first training
step. With --restarts a failed attempt is relaunched (restarts.py) and followed again; in a
parameter-server cluster only the worker that ended is relaunched, in place.
"""
from __future__ import annotations

import time

from deploy.commandline import command
from deploy.run.follow import Event, Followers
from deploy.run.livetensorboard import LiveTensorBoard
from deploy.run.run import Run, RunSettings
from deploy.run.signals import tearing_down
from deploy.run.stopping import Stopper
from deploy.cluster.session import StepFailed
from deploy.plan.recovery import NoRecovery, recovered
from deploy.run.restarts import BackupKeeper
from deploy.state import lifetime
from deploy.state.events import (
    FollowResumed, HostLost, RestartRefused, RunFailing, TaskEnded, TaskLastLines
)
from deploy.state.progress import TaskProgress
from deploy.timeline import mark


class Watch:
    def __init__(self, run: Run, start_timeout: float, restarter=None, lost_after: float = 0.0):
        self.run, self.start_timeout, self.restarter = run, start_timeout, restarter
        # A host silent this long (no heartbeat from its agent) is lost; 0: never.
        self.lost_after = lost_after
        self.followers = Followers(run.plan, run.session.agents)
        self.stopper = Stopper(run, self.followers)
        self.by_index = {t.index: t for t in run.tasks}
        self.host_tasks = {hp.host.name: [self.by_index[t.index] for t in hp.tasks]
                           for hp in run.plan.hosts}
        # The hosts' answers name tasks by key (layout.task_key).
        self.by_key = {hp.host.name: {t.key: self.by_index[t.index] for t in hp.tasks}
                       for hp in run.plan.hosts}
        self.roles = run.plan.has_roles
        self.ending = False          # the chief finished: the others are being stopped
        self.quiet: set[str] = set()  # hosts whose follower ended with all their tasks
        self.lost = run.lost          # hosts given up on (no heartbeat), in this run
        self.tensorboard = LiveTensorBoard(run)
        # The chief's backup is copied here after each of its epochs.
        self.chief = run.plan.chief.index
        self.backup = BackupKeeper(run)
        self.answered = False        # a follow's first answer is a phase's end (timeline)

    def follow(self) -> None:
        """Stream every task's log until all have ended; on the first failure stop the rest."""
        run = self.run
        self.followers.start_all(run.offsets())
        deadline = time.monotonic() + self.start_timeout if self.start_timeout > 0 else 0.0
        try:
            with run.reporter.watching(run.tasks, f"run {run.plan.run_id}", run.raw):
                while not all(t.finished for t in run.tasks):
                    if deadline and time.monotonic() > deadline:
                        self.check_started()
                        deadline = 0.0
                    self.stopper.stop_unanswered()
                    self.watch_heartbeats()
                    event = self.followers.next(timeout=0.25)
                    if event is not None:
                        self.handle(event)
                    self.tensorboard.tick()
                    self.backup.tick()
                    self.gpu_samples()
                    run.reporter.refresh()
                if self.stopper.pending:
                    # A stop still at work on a host would end what a relaunch starts there
                    # (it signals the run directory's tasks): its answer is awaited first.
                    self.stopper.wait_for_answers(lambda event: self.take(event, judged=False))
                self.backup.settle()
        except KeyboardInterrupt:
            if run.interrupt_stops:
                # Teardown begins here: a second interrupt abandons it (signals.py).
                with tearing_down():
                    self.stopper.stop()
                    self.stopper.wait_for_answers(lambda event: self.take(event, judged=False))
            raise
        finally:
            self.followers.close()
            self.tensorboard.close()

    def gpu_samples(self) -> None:
        """Each GPU task's utilisation and memory, as its host's beats last sampled them."""
        for task in self.run.tasks:
            if task.gpu is not None and task.gpu != "all" and task.host not in self.lost:
                sample = self.run.session.agents[task.host].gpu_sample.get(task.gpu)
                if sample is not None:
                    task.gpu_sampled(*sample)

    def watch_heartbeats(self) -> None:
        """A host whose agent has said nothing for lost_after seconds (every agent beats each
        second) is lost: frozen, cut off, or gone."""
        if not self.lost_after:
            return
        for hp in self.run.plan.hosts:
            tasks = self.host_tasks[hp.host.name]
            if hp.host.name in self.lost or not tasks or all(t.finished for t in tasks):
                continue
            silent = self.run.session.agents[hp.host.name].silent_for()
            if silent > self.lost_after:
                self.host_lost(hp, silent)

    def host_lost(self, hp, silent: float) -> None:
        """Give up on the host (nothing more is asked of it, nothing awaited), fail the run
        and stop every other host's tasks."""
        run = self.run
        silence = f"no heartbeat for {silent:.0f} s"
        why = f"{hp.host.label}: {silence}"
        self.lost.add(hp.host.name)
        run.session.agents[hp.host.name].abandon(
            f"lost ({silence}); its tasks may still run there: "
            f"`{command('down')} --run {run.plan.run_id}` stops them once it answers again")
        for task in self.host_tasks[hp.host.name]:
            task.host_lost()
        stopping = run.failure is None and not self.ending
        run.reporter.emit(HostLost(hp.host.name, why, stopping))
        if stopping:
            run.failure = (self.host_tasks[hp.host.name][0], why)
            self.stopper.stop()

    def handle(self, event: Event) -> None:
        if event.host in self.lost:
            return                       # what it said before it was given up on
        if event.kind in ("tasks", "stopped"):
            self.take(event)
        elif event.broken:
            # It answered what a follow does not (protocol.py): asked again, it would again.
            raise StepFailed(f"{event.host}: following the run: {event.error}")
        elif all(t.finished for t in self.host_tasks[event.host]):
            self.quiet.add(event.host)   # a relaunch there follows it again
        else:
            # The stream broke (or ended early): follow again from where we are.
            if event.error:
                self.run.reporter.emit(FollowResumed(event.host, event.error))
            if not self.followers.restart(event.host, self.run.offsets()):
                raise StepFailed(f"{event.host}: lost contact while following the run: "
                                 f"{event.error or 'stream ended'}")

    def take(self, event: Event, judged: bool = True) -> None:
        """One follower event: task states and log bytes, or the answer to a stop. `judged`:
        a task's end bears on the run (not while the run is being stopped)."""
        if event.kind == "stopped":
            self.stopper.answered(event.host, event.stopped)
            return
        if not self.answered:
            self.answered = True
            mark("first follow answer")
        tasks = self.by_key[event.host]
        for key, status in event.tasks.tasks.items():
            task = tasks.get(key)
            if task is None:
                continue
            finished, epoch = task.finished, task.epoch
            self.run.apply(task, status)
            if task.finished and not finished and judged:
                self.ended(task)
            if task.index == self.chief and task.epoch != epoch and judged:
                self.backup.epoch_ended()

    def ended(self, task: TaskProgress) -> None:
        """A task has ended (and its log is read): what that does to the run, by its role."""
        run = self.run
        if run.failure is not None or self.ending:
            return       # the run is being stopped: its tasks end because of that
        action = lifetime.on_end(task, self.roles)
        if action == lifetime.FAIL:
            self.fail(task, reason(task))
        elif action == lifetime.SUCCEED:
            self.ending = True
            run.reporter.emit(TaskEnded(task.name, task.host, reason(task), "run_done"))
            self.stopper.stop()
        elif action == lifetime.TOLERATE:
            self.worker_ended(task)
        elif action == lifetime.REPORT:
            run.reporter.emit(TaskEnded(task.name, task.host, reason(task), "goes_on"))

    def worker_ended(self, task: TaskProgress) -> None:
        """A worker of a ps cluster ended: relaunched in place while --restarts allows, else
        training goes on with the others, as long as there are others."""
        run = self.run
        if task.failed:
            run.reporter.emit(last_lines(task, reason(task), run.raw))
        if self.restarter is not None and self.restarter.relaunch_task(run, task, reason(task)):
            host = task.host
            if host in self.quiet:
                self.quiet.discard(host)
                self.followers.start(next(hp for hp in run.plan.hosts if hp.host.name == host),
                                     run.offsets())
            return
        if lifetime.no_worker_left(run.tasks):
            self.fail(task, "no worker left to run the training steps", panel=False)
            return
        run.reporter.emit(TaskEnded(task.name, task.host, reason(task), "coordinator_goes_on"))

    def fail(self, task: TaskProgress, why: str, panel: bool = True) -> None:
        self.run.failure = (task, why)
        if panel:
            self.run.reporter.emit(last_lines(task, why, self.run.raw))
        self.run.reporter.emit(RunFailing(f"{task.name} failed: stopping the other tasks"))
        self.stopper.stop()

    def check_started(self) -> None:
        """Fail the run if some task never reached its first training step.
        Only a payload that prints events is watched: of another one we cannot tell."""
        run = self.run
        if not any(t.speaks_events for t in run.tasks):
            return
        stuck = [t for t in run.tasks if lifetime.watched(t, self.roles) and not t.first_step
                 and t.state not in ("exited", "lost")]
        if stuck and run.failure is None:
            names = ", ".join(f"{t.name} ({t.host})" for t in stuck)
            for task in stuck:
                run.reporter.emit(last_lines(task, "no training step yet", run.raw))
            run.failure = (stuck[0], f"startup watchdog: {names} did not reach a first "
                                     f"training step within {self.start_timeout:g} s")
            run.reporter.emit(RunFailing(run.failure[1] + " — stopping the run"))
            self.stopper.stop()


def follow_to_end(run: Run, settings: RunSettings, restarter=None, new_ports=None) -> None:
    """Watch the run until every task has ended; on a failure, relaunch on new ports once when
    a task lost its port (`new_ports`, lostport.py), or while `restarter` allows (--restarts)."""
    while True:
        Watch(run, settings.start_timeout, restarter, settings.lost_after).follow()
        if run.failure is None:
            return
        if new_ports is not None and new_ports.relaunched(run):
            continue
        if restarter is None:
            return
        if run.plan.has_roles:
            run.reporter.emit(RestartRefused("not restarting the cluster: in a "
                                             "parameter-server cluster --restarts relaunches "
                                             "workers only"))
            return
        if not restarter.may_restart(run):
            return
        recovery = None
        if any(hp.tasks for hp in run.plan.hosts if hp.host.name in run.lost):
            # A host with tasks was lost: they go to a spare, or away (--shrink).
            try:
                recovery = recovered(run.plan.inventory, run.lost, settings.shrink,
                                     settings.min_workers)
            except NoRecovery as exc:
                run.reporter.emit(RestartRefused(f"not restarting: {exc}"))
                return
        restarter.restart(run, recovery)


def last_lines(task: TaskProgress, why: str, raw: bool) -> TaskLastLines:
    return TaskLastLines(task.name, task.host, why, tuple(task.tail), raw)


def reason(task: TaskProgress) -> str:
    """How a task ended, in words."""
    return (f"exit code {task.code}" if task.state == "exited"
            else "its process group vanished without an exit code")
