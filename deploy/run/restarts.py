"""--restarts: when a task fails, stop the whole cluster and start it again, resuming; in a
parameter-server cluster, start again only the worker that ended.

TensorFlow cannot replace one worker of a running MultiWorkerMirroredStrategy cluster, so a
restart is of every task: stop them all (their run directories stay), carry the chief's
BackupAndRestore state to every other host (bare machines share no disk), choose fresh ports
(the old ones may still be in TIME_WAIT or taken meanwhile) and launch every task again. A
host lost meanwhile (no heartbeat) is not asked anything more: its tasks go to a spare, or
away with --shrink (plan/recovery.py), and the backup they resume from is the copy this
controller keeps after each of the chief's epochs (BackupKeeper), the chief's host lost or not.

A parameter-server cluster's coordinator (on the chief) waits for a lost worker to come back
at its address and gives its steps to the others meanwhile: the worker is relaunched in place,
on the same port, the rest untouched. Its chief or a ps failing ends the run (the variables,
or the program driving them, are gone), so there the whole-cluster restart is not used.
"""
from __future__ import annotations

import dataclasses
import threading
import time

from deploy.errors import Failure
from deploy.plan.planner import plan_run
from deploy.plan.recovery import Recovery
from deploy.state import localdir
from deploy.state.events import (
    ArchiveNote, AttemptStarted, Recovering, RestartRefused, Restarting
)
from deploy.state.record import load_record, write_record


class BackupKeeper:
    """A copy of the chief's backup, fetched into runs/<id>/backup/ after each of its epochs,
    so that a new attempt resumes from it even when the chief's host is the one lost. Fetched
    in the background: a slow or frozen chief never holds up the watch loop, whose heartbeats
    are what name a host lost."""

    def __init__(self, run):
        self.run = run
        self.fetching: threading.Thread | None = None
        self.again = False                  # an epoch ended while a copy was on its way
        self.problem = ""

    def epoch_ended(self) -> None:
        if self.fetching is not None and self.fetching.is_alive():
            self.again = True
        else:
            self._fetch()

    def tick(self) -> None:
        """In the watch loop: what went wrong is said here (the reporter is not the thread's),
        and a copy asked for meanwhile is fetched."""
        if self.problem:
            self.run.reporter.emit(ArchiveNote(f"keeping a copy of the chief's backup: "
                                               f"{self.problem}"))
            self.problem = ""
        if self.again and not self.fetching.is_alive():
            self._fetch()

    def settle(self, timeout: float = 60.0) -> None:
        """Let a copy on its way land (a relaunch takes its own copy after it). A chief given
        up on fails it at once (HostAgent.abandon)."""
        if self.fetching is not None:
            self.fetching.join(timeout)
        self.again = False

    def _fetch(self) -> None:
        self.again = False
        run = self.run
        chief, kept = run.plan.chief_host, localdir.kept_backup(run.dir)

        def fetch() -> None:
            try:
                run.session.keep_backup(chief, run.limits, kept)
            except Failure as exc:          # the last copy stays; the run goes on
                self.problem = str(exc)
        self.fetching = threading.Thread(target=fetch, name="backup copy", daemon=True)
        self.fetching.start()


class Restarter:
    def __init__(self, limit: int):
        self.limit = limit
        self.used = 0               # whole-cluster restarts so far (a resumed run starts anew)

    def may_restart(self, run) -> bool:
        if self.used >= self.limit:
            run.reporter.emit(RestartRefused(f"no restarts left ({self.limit} allowed): ending "
                                             "the run"))
            return False
        if run.problems:
            # Some process of the failed attempt could not be stopped: a relaunch beside it
            # would make two clusters fight over the run directory.
            run.reporter.emit(RestartRefused("not restarting: the failed attempt could not be "
                                             "stopped everywhere"))
            return False
        return True

    def relaunch_task(self, run, task, reason: str) -> bool:
        """Start the ended worker `task` again in place (same host, port and TF_CONFIG), while
        relaunches are left; False when none are."""
        used = sum(t.relaunches for t in run.tasks)
        if used >= self.limit:
            run.reporter.emit(RestartRefused(f"no restarts left ({self.limit} allowed): "
                                             f"{task.name} is not relaunched"))
            return False
        # Its peers know it by this port, so it is its only one: one taken meanwhile by
        # another program would fail it at once, a relaunch spent for nothing.
        port = next(t.port for t in run.plan.tasks if t.index == task.index)
        if port and port not in run.session.ports_free(task.host, (port,)):
            run.reporter.emit(RestartRefused(f"{task.name} is not relaunched: its port {port} on "
                                             f"{task.host} was taken by another program"))
            return False
        run.attempts.append({"attempt": task.relaunches + 1, "failed_task": task.name,
                             "reason": reason, "ended": time.time(), "in_place": True})
        task.relaunches += 1
        task.new_attempt()
        run.reporter.emit(Restarting(used + 1, self.limit, task.name, reason, task.host))
        with run.reporter.status(f"starting {task.name} again…"):
            run.session.launch(run.plan, attempt=task.relaunches + 1, only=task.index)
        return True

    def restart(self, run, recovery: Recovery | None = None) -> None:
        """Attempt run.attempt + 1 of every task; `recovery`: on the hosts it says, in place
        of those lost."""
        task, reason = run.failure
        run.attempts.append({"attempt": run.attempt, "failed_task": task.name, "reason": reason,
                             "ended": time.time()})
        run.attempt += 1
        self.used += 1
        run.reporter.emit(Restarting(self.used, self.limit, task.name, reason))
        if recovery is not None:
            run.reporter.emit(Recovering(recovery.shown(), recovery.moved, recovery.dropped))
        carried = relaunch(run, self.limit, carry_backup=True, recovery=recovery)
        if carried is not None:
            size, written = carried
            run.reporter.emit(AttemptStarted(run.attempt, tuple(t.endpoint for t in run.plan.tasks),
                                             size, len(written)))


def relaunch(run, restarts: int, carry_backup: bool,
             recovery: Recovery | None = None) -> tuple[int, list[str]] | None:
    """Stop every task of the attempt that failed (on the hosts that answer), choose fresh
    ports and start attempt `run.attempt` of every task, on `recovery`'s hosts when given
    (with the chief's backup carried to every host first, when `carry_backup`). The size of
    the backup carried and the hosts it was written to; None when the failed attempt could
    not be stopped everywhere (its problems are the run's: it ends with them)."""
    reporter, session = run.reporter, run.session
    with reporter.status("stopping every task of the failed attempt…"):
        problems = list(session.stop(run.reachable).values())
    if problems:
        run.problems += problems    # no relaunch beside them; the run ends with them shown
        return None
    with reporter.status("carrying the chief's backup to every host…" if carry_backup
                         else "choosing new ports…"):
        chief, kept = run.plan.chief_host, localdir.kept_backup(run.dir)
        source = None
        if carry_backup and chief.host.name not in run.lost:
            # The freshest backup is the stopped chief's own; a lost chief's is the copy
            # kept after its last epoch.
            if session.keep_backup(chief, run.limits, kept) is None:
                kept.unlink(missing_ok=True)        # it has none yet
            source = chief.host.name
        if recovery is not None:
            run.replan(plan_run(recovery.inventory, run.plan.options, run.plan.run_id))
        carried = session.carry_backup(
            run.reachable, run.filesystems, run.limits, kept, source,
            lambda line: reporter.emit(ArchiveNote(line))) if carry_backup else (0, [])
        ports = session.free_ports(run.reachable)
    run.plan = run.plan.with_ports(ports)
    write_record(run.dir, dataclasses.replace(
        load_record(run.dir).replanned(run.plan, run.log_starts), attempt=run.attempt,
        restarts=restarts))
    for t in run.tasks:
        t.new_attempt()
    run.failure = None
    with reporter.status(f"starting attempt {run.attempt}…"):
        session.launch(run.plan, attempt=run.attempt)
    return carried
