"""What a run, a check, a setup or a prune reports as it goes: typed events, sent to a reporter.

Orchestration (deploy/run/) never prints. It emits events; a reporter decides what people or
programs see: the live view and plain lines (deploy/console/reporter.py), or JSON lines for
scripts and CI (`--json`, the same module).

Every event is a frozen record (deploy/host/records.py) of plain values (str, int, float,
bool, None, and tuples or mappings of those), so that any reporter can show it and `as_json` can
write it; two carry a richer value and say themselves how it is written (the check's report, a
task's new log bytes, decoded only where they are shown). Its `kind` is
its name on the JSON stream (`task_started`...); its `text()` is the line a person reads, and
its `level` how it should stand out. Host text in an event (a log line, an error a host sent)
is carried as it came; each reporter shows it inert.
"""
from __future__ import annotations

import re
from typing import ClassVar, ContextManager, Mapping, Optional, Protocol, Tuple

from deploy.commandline import command
from deploy.host.archive import size
from deploy.host.records import Frozen, asdict, record
from deploy.plan.checks import CheckReport, rows
from deploy.state.envprogress import HostProgress
from deploy.state.progress import NewLines, TaskProgress
from deploy.state.record import RunRecord

INFO, NOTE, WARNING, ERROR, GOOD = "info", "note", "warning", "error", "good"


@record
class Event(Frozen):
    level: ClassVar[str] = INFO

    @classmethod
    def kind(cls) -> str:
        return re.sub(r"(?<!^)(?=[A-Z])", "_", cls.__name__).lower()

    def text(self) -> str:
        return self.kind().replace("_", " ")

    def as_json(self) -> dict:
        return {"event": self.kind(), **_plain(asdict(self))}


def _plain(value):
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


class Reporter(Protocol):
    """Where a run's events go (deploy/console/reporter.py): `emit` tells one; `status` shows
    a step while it runs (its `update` changes the text); `watching` and `refresh` are the
    run's live view while its tasks are followed, `setup_progress` inv setup's rows."""

    def emit(self, event: Event) -> None: ...

    def status(self, text: str) -> ContextManager: ...

    def watching(self, tasks: list[TaskProgress], title: str, raw: bool) -> ContextManager: ...

    def refresh(self) -> None: ...

    def setup_progress(self, progress: Mapping[str, HostProgress]) -> ContextManager: ...


# --- a run -----------------------------------------------------------------------------------

@record
class RunPlanned(Event):
    run_id: str
    tasks: int
    hosts: int

    def text(self) -> str:
        return f"run {self.run_id}: {self.tasks} task(s) on {self.hosts} host(s)"


@record
class HostsChecked(Event):
    """The checks found every host ready (`inv train`'s first step)."""
    level: ClassVar[str] = GOOD
    hosts: int
    seconds: float

    def text(self) -> str:
        return (f"checked {self.hosts} host(s) in {self.seconds:.1f} s: versions, disk, ports "
                "and the TCP mesh are fine")


@record
class CheckReported(Event):
    """The check's table (`inv check`, or `inv train` when a host is not ready): a row per host,
    then every problem in words."""
    report: CheckReport

    def text(self) -> str:
        return f"{len(self.report.all_problems)} problem(s) on {len(self.report.hosts)} host(s)"

    def as_json(self) -> dict:
        report = self.report
        return {"event": self.kind(), "ok": report.ok, "seconds": round(report.seconds, 3),
                "hosts": [{"host": c.host.name, "cells": [str(x) for x in cells],
                           "problems": list(c.problems),
                           "gpus": [asdict(g) for g in c.probe.gpus]
                           if c.probe else []}
                          for c, cells in zip(report.hosts, rows(report))],
                "problems": list(report.all_problems)}


@record
class PayloadLeftOut(Event):
    """What of tfdeploy's own lies inside the payload and stays home (push/bundle.py)."""
    paths: tuple[str, ...]

    def text(self) -> str:
        return (f"payload: left out {', '.join(self.paths)} (tfdeploy's own: its runs "
                f"directory and .tfdeploy*)")


@record
class GpusPlaced(Event):
    """The GPUs each placing host gave its tasks, leased for the run (run/gpuplace.py)."""
    hosts: tuple[tuple[str, tuple[int, ...]], ...]

    def text(self) -> str:
        return "GPUs: " + "; ".join(f"{name} {', '.join(map(str, indices))}"
                                    for name, indices in self.hosts)


@record
class RecordsAt(Event):
    path: str

    def text(self) -> str:
        return f"local records in {self.path}"


@record
class Pushed(Event):
    """What a push sent: of the payload's or the data's files, how many some host lacked, and
    to how many hosts (deploy/push/)."""
    line: str

    def text(self) -> str:
        return self.line


@record
class TasksStarted(Event):
    tasks: int
    seconds: float
    cluster: Tuple[str, ...]

    def text(self) -> str:
        return (f"started {self.tasks} task(s) in {self.seconds:.1f} s; cluster "
                + ", ".join(self.cluster))


@record
class TaskOutput(Event):
    """New whole lines of a task's log, as its host wrote them (`new`, kept as the bytes they
    came as: a flood is decoded only where it is shown). `raw`: every line is to be shown as
    written (`inv logs`, --verbose), not only what the console shows by default."""
    name: str
    index: int
    host: str
    epochs_total: Optional[int]
    new: NewLines
    raw: bool = False

    def as_json(self) -> dict:
        return {"event": self.kind(), "task": self.name, "host": self.host,
                "lines": self.new.all()}


@record
class TaskProgressed(Event):
    """A task's state or epoch changed (from its host's answers and its log's event lines)."""
    task: str
    host: str
    state: str
    epoch: Optional[int]
    epochs: Optional[int]
    loss: Optional[float]
    metrics: Mapping[str, float]


@record
class TaskLastLines(Event):
    """Why a task stopped the run, with its last log lines (the console's red panel)."""
    level: ClassVar[str] = ERROR
    task: str
    host: str
    why: str
    lines: Tuple[str, ...]
    raw: bool = False              # shown as written, not as the console filters lines

    def text(self) -> str:
        return f"{self.task} on {self.host}: {self.why} — last log lines"


@record
class TaskEnded(Event):
    """A task ended and the run goes on (or, the chief's success, ends well): `effect` says
    which (`run_done`, `goes_on`, `coordinator_goes_on`)."""
    task: str
    host: str
    reason: str
    effect: str

    @property
    def level(self) -> str:
        return GOOD if self.effect == "run_done" else WARNING

    def text(self) -> str:
        if self.effect == "run_done":
            return f"{self.task} finished: the run is done, stopping the other tasks"
        if self.effect == "coordinator_goes_on":
            return (f"{self.task} ({self.host}) ended ({self.reason}): the chief's coordinator "
                    "goes on with the other workers")
        return f"{self.task} ({self.host}) ended ({self.reason}); the run goes on without it"


@record
class RunFailing(Event):
    """The run fails and the other tasks are being stopped: `why` (a task failed, the startup
    watchdog, a port lost twice)."""
    level: ClassVar[str] = ERROR
    why: str

    def text(self) -> str:
        return self.why


@record
class HostLost(Event):
    level: ClassVar[str] = ERROR
    host: str
    why: str
    stopping: bool           # the run fails for it: the other hosts' tasks are stopped

    def text(self) -> str:
        return f"{self.why}: the host is lost" + (" — stopping the other tasks"
                                                  if self.stopping else "")


@record
class FollowResumed(Event):
    """A host's follow broke and is asked again from where it was."""
    level: ClassVar[str] = WARNING
    host: str
    error: str

    def text(self) -> str:
        return f"following {self.host}: {self.error}"


@record
class Interrupted(Event):
    """Ctrl-C or SIGTERM: every task of the run is being stopped."""
    level: ClassVar[str] = WARNING
    terminated: bool

    def text(self) -> str:
        return (f"{'terminated' if self.terminated else 'interrupted'}: stopping every task "
                "of the run…")


def _found_again(run_id: str, runs_dir_flag: str) -> str:
    """The commands that follow, inspect and stop a run this controller leaves."""
    return (f"  follow it:  {command('logs')} --run {run_id} --follow{runs_dir_flag}\n"
            f"  its state:  {command('status')} --run {run_id}{runs_dir_flag}\n"
            f"  stop it:    {command('down')} --run {run_id}{runs_dir_flag}")


@record
class StoppedUnstarted(Event):
    """The terminal closed, or stdout's reader went away, before the run's tasks started:
    nothing is left to go on, so what the run set up is torn down. `stdout_closed` as in
    Detached."""
    level: ClassVar[str] = WARNING
    run_id: str
    why: str
    stdout_closed: bool = False

    def text(self) -> str:
        return (f"{self.why}no task of run {self.run_id} had started: tearing down what it "
                "set up…")


@record
class Detached(Event):
    """The run goes on without this controller; how to find it again. `stdout_closed`: let go
    because stdout's reader is gone (reporters then say it on stderr too)."""
    run_id: str
    hosts: int
    why: str
    runs_dir_flag: str
    stdout_closed: bool = False

    def text(self) -> str:
        rid, flag = self.run_id, self.runs_dir_flag
        return (f"{self.why}run {rid} is running detached on {self.hosts} host(s); nothing "
                f"was torn down.\n" + _found_again(rid, flag))


@record
class Supervised(Event):
    """`--detach --restarts N`: the run goes on under a background controller on this
    machine, which relaunches it; how to find it again."""
    run_id: str
    pid: int
    restarts: int
    log: str
    runs_dir_flag: str

    def text(self) -> str:
        rid, flag = self.run_id, self.runs_dir_flag
        return (f"run {rid} goes on under a background controller on this machine (pid "
                f"{self.pid}) that relaunches it up to {self.restarts} time(s); its log: "
                f"{self.log}. Closing this terminal does not stop it; shutting down or "
                "suspending this machine does (the tasks go on, unsupervised).\n"
                + _found_again(rid, flag))


@record
class ControllerOutput(Event):
    """A line the background controller of a run wrote to its log, as `inv logs --follow`
    shows it."""
    line: str

    def text(self) -> str:
        return self.line


@record
class FollowStopped(Event):
    """`inv logs --follow` stopped following; the run goes on. `stdout_closed` as in
    Detached."""
    level: ClassVar[str] = WARNING
    run_id: str
    runs_dir_flag: str
    stdout_closed: bool = False

    def text(self) -> str:
        return (f"stopped following; run {self.run_id} goes on. Stop it with: "
                f"{command('down')} --run {self.run_id}{self.runs_dir_flag}")


@record
class RestartRefused(Event):
    level: ClassVar[str] = ERROR
    why: str

    def text(self) -> str:
        return self.why


@record
class Restarting(Event):
    """A relaunch under --restarts (of every task, or of one worker in place)."""
    level: ClassVar[str] = WARNING
    number: int
    limit: int
    task: str
    reason: str
    in_place_on: Optional[str] = None    # the host of a worker relaunched in place

    def text(self) -> str:
        head = f"restart {self.number} of {self.limit}: {self.task}"
        if self.in_place_on:
            return f"{head} ended ({self.reason}); relaunching it in place on {self.in_place_on}"
        return (f"{head} failed ({self.reason}); stopping the cluster, carrying the chief's "
                "backup, relaunching…")


@record
class Recovering(Event):
    """Lost hosts' tasks move to spares, or are given up (--shrink), for the next attempt."""
    level: ClassVar[str] = WARNING
    how: str
    moved: Tuple[Tuple[str, str], ...]      # (lost host, the spare that takes its tasks)
    dropped: Tuple[str, ...]                # lost hosts whose tasks are given up

    def text(self) -> str:
        return f"  {self.how}"


@record
class PortLost(Event):
    """A task's port was taken between the check and the launch: relaunching on new ports."""
    level: ClassVar[str] = WARNING
    why: str

    def text(self) -> str:
        return f"{self.why}: relaunching every task on new ports…"


@record
class AttemptStarted(Event):
    level: ClassVar[str] = WARNING
    attempt: int
    cluster: Tuple[str, ...]
    backup_bytes: Optional[int] = None        # carried before it (--restarts)
    carried_to: int = 0                       # other workdirs the backup was written to

    def text(self) -> str:
        cluster = "cluster " + ", ".join(self.cluster)
        if self.backup_bytes is None:
            return f"attempt {self.attempt} started; {cluster}"
        where = (f"carried to {self.carried_to} other workdir(s)" if self.carried_to
                 else "every host shares the chief's workdir")
        return (f"attempt {self.attempt} started (backup of {self.backup_bytes / 1024:.0f} "
                f"KiB, {where}); {cluster}")


@record
class ArchiveNote(Event):
    """What unpacking an archive from a host skipped or refused, naming the host."""
    level: ClassVar[str] = WARNING
    line: str

    def text(self) -> str:
        return self.line


@record
class TaskSnapshot(Frozen):
    """One task as the controller knows it at that moment (state/progress.py TaskProgress)."""
    index: int
    name: str
    host: str
    pid: Optional[int]
    state: str
    code: Optional[int]
    duration: Optional[float]
    epoch: Optional[int]
    epochs_total: Optional[int]
    loss: Optional[float]
    metrics: Mapping[str, float]
    steps_per_second: Optional[float]
    eta_seconds: Optional[float]
    losses: Tuple[float, ...]
    gpu: Optional[str] = None
    gpu_utilization: Optional[int] = None
    gpu_memory: Optional[int] = None
    gpu_memory_peak: Optional[int] = None


def snapshot(task: TaskProgress) -> TaskSnapshot:
    return TaskSnapshot(
        index=task.index, name=task.name, host=task.host, pid=task.pid, state=task.state,
        code=task.code, duration=task.duration, epoch=task.epoch,
        epochs_total=task.epochs_total, loss=task.loss, metrics=dict(task.metrics),
        steps_per_second=task.steps_per_second, eta_seconds=task.eta_seconds,
        losses=tuple(task.losses), gpu=task.gpu, gpu_utilization=task.gpu_utilization,
        gpu_memory=task.gpu_memory, gpu_memory_peak=task.gpu_memory_peak)


@record
class RunSummary(Event):
    """The run's last event: how every task ended, the wall time, whether the workers' losses
    agree (None: no loss to compare), what teardown could not do (nothing: no process of the
    run is left and its run directories are gone from its `hosts` hosts), and where its
    results are on this machine."""
    run_id: str
    exit_code: int
    tasks: Tuple[TaskSnapshot, ...]
    wall_time: Optional[float]
    losses_agree: Optional[bool]
    teardown_problems: Tuple[str, ...]
    hosts: int
    summary: str                       # summary.json
    artifacts: int = 0
    artifacts_dir: Optional[str] = None
    loss_plot: Optional[str] = None
    tensorboard: Optional[str] = None
    hint: Optional[str] = None         # what the run's view lacked, and how to have it
    # Hosts lost during the run whose tasks went elsewhere (--restarts): not reached at its end.
    lost_hosts: Tuple[str, ...] = ()

    def teardown_lines(self) -> list[str]:
        lines = [f"teardown: {problem}" for problem in self.teardown_problems] or [
            f"teardown: no process of run {self.run_id} left; run directories removed on "
            f"{self.hosts} host(s)"]
        if self.lost_hosts:
            lines.append(f"teardown: not reached: {', '.join(self.lost_hosts)}, lost during the "
                         f"run; what is left there stays until `{command('down')} --run "
                         f"{self.run_id}` once it answers")
        return lines

    def file_lines(self) -> list[str]:
        lines = []
        if self.artifacts:
            lines.append(f"artifacts:   {self.artifacts} file(s) in {self.artifacts_dir}")
        if self.loss_plot:
            lines.append(f"loss curve:  {self.loss_plot}")
        lines.append(f"summary:     {self.summary}")
        if self.tensorboard:
            lines.append(f"TensorBoard: tensorboard --logdir {self.tensorboard}")
        return lines

    def text(self) -> str:
        return "\n".join(self.teardown_lines() + self.file_lines() +
                         ([f"note: {self.hint}"] if self.hint else []))


@record
class PlotFailed(Event):
    level: ClassVar[str] = WARNING
    path: str
    error: str

    def text(self) -> str:
        return f"{self.path}: could not write the loss plot: {self.error}"


@record
class TeardownAbandoned(Event):
    """A second interrupt during teardown: what may be left, and the command that finishes."""
    level: ClassVar[str] = ERROR
    left: str
    command: str

    def text(self) -> str:
        return f"teardown abandoned: {self.left}. Finish it with:\n  {self.command}"


# --- runs found again: inv runs, status, logs, down, plot --------------------------------------

@record
class RunListed(Frozen):
    run_id: str
    started: str
    hosts: Tuple[str, ...]
    tasks: int
    state: str            # as shown: "running (no controller)", "finished (exit 1)"...
    style_state: str      # the record's state, for the console's colour
    exit_code: Optional[int]
    attempt: int


def listed(record: RunRecord) -> RunListed:
    return RunListed(record.run_id, record.started_text(), tuple(h.name for h in record.hosts),
                     len(record.tasks), record.shown_state(), record.state.value,
                     record.exit_code, record.attempt)


@record
class RecordDamaged(Event):
    """A run record that cannot be read (its file and why); the other runs go on."""
    level: ClassVar[str] = WARNING
    problem: str

    def text(self) -> str:
        return f"skipped {self.problem}"


@record
class RunsListed(Event):
    runs_dir: str
    runs: Tuple[RunListed, ...]

    def text(self) -> str:
        return f"no runs recorded in {self.runs_dir}" if not self.runs else \
            f"runs in {self.runs_dir} (newest last)"


@record
class RunStatus(Event):
    title: str
    tasks: Tuple[TaskSnapshot, ...]

    def text(self) -> str:
        return self.title


@record
class Submitted(Event):
    """`inv submit` queued a run as a Slurm batch job; how to find it again."""
    run_id: str
    job_id: str
    script: str
    runs_dir_flag: str

    def text(self) -> str:
        rid, flag = self.run_id, self.runs_dir_flag
        return (f"submitted run {rid} as Slurm job {self.job_id} ({self.script})\n"
                + _found_again(rid, flag))


@record
class JobOutput(Event):
    """A line of a submitted run's batch job output (its controller's), as `inv logs` reads it."""
    line: str

    def text(self) -> str:
        return self.line


@record
class RunNote(Event):
    """What `inv logs`, `inv down` or `inv plot` says about a run found again: ended, being
    stopped, its plot drawn."""
    level: ClassVar[str] = NOTE
    run_id: str
    note: str

    def text(self) -> str:
        return self.note


# --- inv setup, inv prune -----------------------------------------------------------------------

@record
class SetupPlanned(Event):
    requirements: str
    hosts: int
    wheels: int
    wheelhouse: Optional[str]
    pinned: Tuple[str, ...]          # hosts that name their own python: train runs that
    inventory: str

    def text(self) -> str:
        line = f"setup: environment for {self.requirements} on {self.hosts} host(s)"
        if self.wheels:
            line += f", installing from {self.wheels} file(s) of {self.wheelhouse}"
        if self.pinned:
            line += (f"\nnote: {', '.join(self.pinned)} name their own python in "
                     f"{self.inventory}: {command('train')} runs that, not this environment")
        return line


@record
class SetupResult(Frozen):
    name: str
    state: str                       # reused, built, failed
    env: Optional[str]
    seconds: float
    versions: Mapping[str, Optional[str]]
    line: str                        # its last step, or why it failed
    tail: Tuple[str, ...]            # pip's last lines, for a failure


def setup_of(progress: HostProgress) -> SetupResult:
    return SetupResult(progress.name, progress.state, progress.env, progress.seconds(),
                     dict(progress.versions), progress.line, tuple(progress.tail))


@record
class SetupDone(Event):
    hosts: Tuple[SetupResult, ...]
    cleanup_problems: Mapping[str, str]

    def text(self) -> str:
        states = [h.state for h in self.hosts]
        counts = ", ".join(f"{states.count(k)} {k}" for k in ("reused", "built", "failed")
                           if states.count(k))
        return f"setup: {counts} of {len(states)} host(s)" + (
            " (an unchanged requirements.txt reuses its environment: no pip)"
            if states.count("reused") == len(states) else "")


@record
class HostPruned(Event):
    host: str
    dry_run: bool
    freed: Mapping[str, Tuple[int, int]]      # kind label -> (count, bytes)
    error: Optional[str] = None

    @property
    def level(self) -> str:
        return ERROR if self.error else INFO

    def text(self) -> str:
        if self.error:
            return f"{self.host}: {self.error}"
        parts = ", ".join(f"{count} {label} ({size(nbytes)})"
                          for label, (count, nbytes) in self.freed.items())
        total = sum(nbytes for _, nbytes in self.freed.values())
        return f"{self.host}: {'would free' if self.dry_run else 'freed'} {size(total)}: {parts}"


@record
class PruneDone(Event):
    dry_run: bool

    @property
    def level(self) -> str:
        return WARNING if self.dry_run else INFO

    def text(self) -> str:
        return "dry run: nothing was deleted" if self.dry_run else ""
