"""--restarts: when a task fails, stop the whole cluster and start it again, resuming; in a
parameter-server cluster, start again only the worker that ended.

TensorFlow cannot replace one worker of a running MultiWorkerMirroredStrategy cluster, so a
restart is of every task: stop them all (their run directories stay), carry the chief's
BackupAndRestore state to every other host (bare machines share no disk), choose fresh ports
(the old ones may still be in TIME_WAIT or taken meanwhile) and launch every task again.

A parameter-server cluster's coordinator (on the chief) waits for a lost worker to come back
at its address and gives its steps to the others meanwhile: the worker is relaunched in place,
on the same port, the rest untouched. Its chief or a ps failing ends the run (the variables,
or the program driving them, are gone), so there the whole-cluster restart is not used.
"""
from __future__ import annotations

import dataclasses
import time

from deploy.state.events import ArchiveNote, AttemptStarted, RestartRefused, Restarting
from deploy.state.record import load_record, write_record


class Restarter:
    def __init__(self, limit: int):
        self.limit = limit

    def may_restart(self, run) -> bool:
        if run.attempt > self.limit:
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

    def restart(self, run) -> None:
        task, reason = run.failure
        run.attempts.append({"attempt": run.attempt, "failed_task": task.name, "reason": reason,
                             "ended": time.time()})
        run.attempt += 1
        run.reporter.emit(Restarting(run.attempt - 1, self.limit, task.name, reason))
        carried = relaunch(run, self.limit, carry_backup=True)
        if carried is not None:
            size, written = carried
            run.reporter.emit(AttemptStarted(run.attempt, tuple(t.endpoint for t in run.plan.tasks),
                                             size, len(written)))


def relaunch(run, restarts: int, carry_backup: bool) -> tuple[int, list[str]] | None:
    """Stop every task of the attempt that failed, choose fresh ports and start attempt
    `run.attempt` of every task (with the chief's backup carried to every host first, when
    `carry_backup`). The size of the backup carried and the hosts it was written to; None when
    the failed attempt could not be stopped everywhere (its problems are the run's: it ends
    with them)."""
    reporter, session = run.reporter, run.session
    with reporter.status("stopping every task of the failed attempt…"):
        problems = list(session.stop(run.plan).values())
    if problems:
        run.problems += problems    # no relaunch beside them; the run ends with them shown
        return None
    with reporter.status("carrying the chief's backup to every host…" if carry_backup
                         else "choosing new ports…"):
        carried = session.carry_backup(
            run.plan, run.filesystems, run.limits, run.dir,
            lambda line: reporter.emit(ArchiveNote(line))) if carry_backup else (0, [])
        ports = session.free_ports(run.plan)
    run.plan = run.plan.with_ports(ports)
    write_record(run.dir, dataclasses.replace(load_record(run.dir).replanned(run.plan),
                                              attempt=run.attempt, restarts=restarts))
    for t in run.tasks:
        t.new_attempt()
    run.failure = None
    with reporter.status(f"starting attempt {run.attempt}…"):
        session.launch(run.plan, attempt=run.attempt)
    return carried
