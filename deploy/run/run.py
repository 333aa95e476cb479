"""One run on the controller: its plan, its tasks' progress and its local files. The same
object serves a run just launched (launch.py) and one found again from its record
(reattach.py); the phases that act on it are pieces of their own: watch.py follows it,
stopping.py stops its tasks, restarts.py relaunches it, finish.py tears it down.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from deploy.host.archive import Limits
from deploy.host.protocol import TaskStatus
from deploy.plan.planner import RunPlan
from deploy.cluster.session import Session, StepFailed
from deploy.state import localdir
from deploy.state.events import Reporter, TaskOutput, TaskProgressed
from deploy.state.progress import NewLines, TaskProgress
from deploy.state.record import RunState, update_record

READ_PIECE = 1 << 20


@dataclass(frozen=True)
class RunSettings:
    runs_dir: Path = Path("runs")
    connect_timeout: float = 10.0
    accept_new_host_keys: bool = False
    # A worker whose peer never comes waits for an hour and ignores SIGTERM: without this
    # watchdog a missing or blocked peer is a silent hang.
    start_timeout: float = 120.0
    # A host whose agent sends no heartbeat for this long is lost: the run fails and every
    # other host's tasks are stopped. 0: never.
    lost_after: float = 10.0
    restarts: int = 0
    detach: bool = False
    # Probe every host and the TCP mesh before anything is written anywhere (run/hostchecks.py).
    check: bool = True
    # Show every log line as written, TensorFlow's C++ log and event lines too (lines.py).
    verbose: bool = False
    # How much an archive from a host may unpack to: the chief's output, a carried backup.
    fetch_limits: Limits = Limits()
    # Run on GPUs that other runs or users hold (gpuplace.py refuses them otherwise).
    allow_busy_gpus: bool = False
    # The run's id as `inv submit` chose it for its batch job (None: a new one).
    run_id: str | None = None
    # A lost host's tasks with no spare left: go on with the hosts that remain (--shrink),
    # as long as this many workers do.
    shrink: bool = False
    min_workers: int = 1


class Run:
    def __init__(self, plan: RunPlan, session: Session | None, local_dir: Path,
                 reporter: Reporter, only_task: int | None = None, writes_logs: bool = True,
                 raw: bool = False, limits: Limits = Limits()):
        self.plan, self.session, self.dir = plan, session, local_dir
        self.reporter = reporter            # what the run does is told to it (events.py)
        self.limits = limits                # of the archives fetched from its hosts
        self.tasks = [TaskProgress(t.index, t.host.name, role=t.role, type_index=t.type_index,
                                   gpu=t.gpus) for t in plan.tasks]
        self.only_task = only_task          # `inv logs --task N`: print only its lines
        self.raw = raw                      # print every line as written (no filter)
        self.writes_logs = writes_logs      # False while another controller follows the run
        self.logs = {t.index: open(localdir.task_log(local_dir, t.name), "ab")
                     for t in plan.tasks} if writes_logs else {}
        self.failure: tuple[TaskProgress, str] | None = None
        self.problems: list[str] = []       # what teardown could not do, by host
        self.attempts: list[dict] = []      # the failed attempts of --restarts
        self.attempt = 1
        # Task index -> bytes of its local log from before its log on its host began (a
        # resumed run, a task moved to a spare): the record's log_start.
        self.log_starts: dict[int, int] = {}
        # Host name -> the filesystem id its payload push answered (deploy/host/share.py):
        # hosts with one id share the run directory, and --restarts carries the backup once.
        self.filesystems: dict[str, str | None] = {}
        # Hosts given up on (no heartbeat): nothing more is asked of them; a relaunch moves
        # their tasks elsewhere (restarts.py), and they stay in the plan without tasks.
        self.lost: set[str] = set()
        # Ctrl-C while following stops the run (inv train), or only the following (inv logs).
        self.interrupt_stops = True
        self.stopped_clean = False          # every host answered a stop: none survived
        self.detached = False               # left running without this controller
        self.started = time.time()          # when this controller began the run

    @property
    def reachable(self) -> RunPlan:
        """The plan without the hosts given up on: what may still be asked."""
        return self.plan.without(self.lost)

    def replan(self, plan: RunPlan) -> None:
        """Go on with `plan`, whose tasks are the same or fewer, some on other hosts
        (recovery.py): each task's progress goes on, from an empty log where it moved."""
        by_index = {t.index: t for t in self.tasks}
        for planned in plan.tasks:
            task = by_index[planned.index]
            if task.host != planned.host.name:
                task.moved(planned.host.name, planned.gpus)
                self.log_starts[task.index] = self.local_size(task)
        kept = {t.index for t in plan.tasks}
        for index in [i for i in self.logs if i not in kept]:
            self.logs.pop(index).close()
        self.tasks = [t for t in self.tasks if t.index in kept]
        self.plan = plan

    def local_size(self, task: TaskProgress) -> int:
        """The bytes of the task's local log so far."""
        try:
            return localdir.task_log(self.dir, task.name).stat().st_size
        except FileNotFoundError:
            return 0

    def set_state(self, state: RunState, **fields) -> None:
        update_record(self.dir, state=state, **fields)

    def show(self, task: TaskProgress, new: NewLines) -> None:
        if self.only_task is not None and task.index != self.only_task:
            return
        if new.count:
            self.reporter.emit(TaskOutput(task.name, task.index, task.host, task.epochs_total,
                                          new, self.raw))

    def offsets(self) -> dict[int, int]:
        return {t.index: t.offset for t in self.tasks}

    def apply(self, task: TaskProgress, status: TaskStatus, shown: bool = True) -> None:
        """One answer of the host about `task`: its state, and log bytes kept and shown."""
        before = (task.state, task.epoch, task.epochs_total)
        new = task.update(status)
        if self.writes_logs and status.data:
            self.logs[task.index].write(status.data)
            self.logs[task.index].flush()
        if shown:
            self.show(task, new)
            if (task.state, task.epoch, task.epochs_total) != before:
                self.reporter.emit(TaskProgressed(
                    task.name, task.host, task.state, task.epoch, task.epochs_total, task.loss,
                    dict(task.metrics)))

    def catch_up(self, print_lines: bool = True) -> None:
        """Read every task's log on the hosts from where the local copy ends, to its end."""
        while True:
            answers, errors = self.session.poll(self.plan, self.offsets())
            for name, error in errors.items():
                raise StepFailed(f"{name}: reading the logs: {error}")
            more = False
            for task in self.tasks:
                if task.index in answers:
                    status = answers[task.index]
                    self.apply(task, status, shown=print_lines)
                    # A host that says there is more but sends none is not asked forever.
                    more = more or (task.offset < task.size and bool(status.data))
            if not more:
                return

    def close(self) -> None:
        """Drop the connections and close the local logs; the run itself goes on as it is."""
        if self.session:
            self.session.close()
        for log in self.logs.values():
            log.close()


def load_local_logs(run: Run, shown: Callable[[TaskProgress, NewLines], None] | None) -> None:
    """Start from the local copies of the logs: their metrics count, and reading the hosts'
    logs goes on from where they end (less the bytes from before a host's log began:
    run.log_starts), so no byte is printed or stored twice. Read in pieces: a long run's log
    never sits in memory whole."""
    for task in run.tasks:
        path = localdir.task_log(run.dir, task.name)
        if not path.exists():
            continue
        with path.open("rb") as log:
            while piece := log.read(READ_PIECE):
                new = task.replay(piece)
                if shown:
                    shown(task, new)
        task.offset = task.size = max(0, task.offset - run.log_starts.get(task.index, 0))

