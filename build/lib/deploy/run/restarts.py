"""--restarts: when a task fails, stop the whole cluster and start it again, resuming.

TensorFlow cannot replace one worker of a running MultiWorkerMirroredStrategy cluster, so a
restart is of every task: stop them all (their run directories stay), carry the chief's
BackupAndRestore state to every other host (bare machines share no disk), choose fresh ports
(the old ones may still be in TIME_WAIT or taken meanwhile) and launch every task again.
"""
from __future__ import annotations

import dataclasses
import time

from deploy.console.view import say
from deploy.inventory.model import Inventory
from deploy.plan.planner import Options, plan_run
from deploy.state.record import load_record, write_record


class Restarter:
    def __init__(self, inventory: Inventory, options: Options, limit: int):
        self.inventory, self.options, self.limit = inventory, options, limit

    def may_restart(self, run) -> bool:
        if run.attempt > self.limit:
            say(run.console, f"no restarts left ({self.limit} allowed): ending the run", "red")
            return False
        if run.problems:
            # Some process of the failed attempt could not be stopped: a relaunch beside it
            # would make two clusters fight over the run directory.
            say(run.console, "not restarting: the failed attempt could not be stopped "
                             "everywhere", "bold red")
            return False
        return True

    def restart(self, run) -> None:
        task, reason = run.failure
        run.attempts.append({"attempt": run.attempt, "failed_task": task.name, "reason": reason,
                             "ended": time.time()})
        run.attempt += 1
        console, session = run.console, run.session
        say(console, f"restart {run.attempt - 1} of {self.limit}: {task.name} failed ({reason}); "
                     "stopping the cluster, carrying the chief's backup, relaunching…", "yellow")
        with console.status("stopping every task of the failed attempt…"):
            problems = list(session.stop(run.plan).values())
        if problems:
            run.problems += problems    # may_restart says no; the run ends with them shown
            return
        with console.status("carrying the chief's backup to every host…"):
            size = session.carry_backup(run.plan)
            ports = session.free_ports(run.plan)
        run.plan = plan_run(self.inventory, self.options, run.plan.run_id, ports)
        write_record(run.dir, dataclasses.replace(load_record(run.dir).replanned(run.plan),
                                                  attempt=run.attempt, restarts=self.limit))
        for t in run.tasks:
            t.new_attempt()
        run.failure = None
        with console.status(f"starting attempt {run.attempt}…"):
            session.launch(run.plan, attempt=run.attempt)
        say(console, f"attempt {run.attempt} started (backup of {size / 1024:.0f} KiB carried); "
                     "cluster " + ", ".join(t.endpoint for t in run.plan.tasks), "yellow")
