"""A port lost between the check and the launch: the check (or the port probe) found it free,
then another process bound it before the task did. TensorFlow's gRPC server cannot start and
the task exits; nothing about the run is wrong but its ports. The run is relaunched once,
every task on fresh ports; a second loss ends it, naming the host and the port.

Recognised in the failed task's last log lines (the console hides the first below as
TensorFlow's C++ log; the log file keeps it):
- TensorFlow 2.21: `E0000 … add_port.cc:83] Failed to add port to server: No address added out
  of total 1 resolved for '0.0.0.0:45149'`, then `Could not start gRPC server`;
- any Python server: `OSError: [Errno 98] Address already in use`.
"""
from __future__ import annotations

import re
import time

from deploy.run.restarts import relaunch
from deploy.state.events import AttemptStarted, PortLost, RunFailing
from deploy.state.progress import TaskProgress

ADD_PORT_FAILED = re.compile(r"Failed to add port to server: .*:(\d+)'")
BIND_FAILED = ("Could not start gRPC server", "[Errno 98] Address already in use")


def lost_port(task: TaskProgress, planned: int | None) -> int | None:
    """The port `task` could not bind (the one its log names, else the one it was given), or
    None when its end says nothing of a port."""
    for line in reversed(task.tail):
        found = ADD_PORT_FAILED.search(line)
        if found:
            return int(found.group(1))
    if any(marker in line for line in task.tail for marker in BIND_FAILED):
        return planned
    return None


class NewPorts:
    """Relaunches a run whose task lost its port, once."""

    def __init__(self, restarts: int):
        self.restarts = restarts
        self.used = False

    def relaunched(self, run) -> bool:
        """After a failed attempt: whether it failed for a lost port and was started again on
        new ports. A second loss is named in the run's failure."""
        task, _ = run.failure
        port = lost_port(task, next((t.port for t in run.plan.tasks if t.index == task.index),
                                    None))
        if port is None:
            return False
        why = (f"port {port} on {task.host} was taken by another process before "
               f"{task.name} could bind it")
        if self.used:
            run.failure = (task, why + ", again on new ports")
            run.reporter.emit(RunFailing(run.failure[1]))
            return False
        self.used = True
        run.attempts.append({"attempt": run.attempt, "failed_task": task.name, "reason": why,
                             "ended": time.time()})
        run.attempt += 1
        run.reporter.emit(PortLost(why))
        if relaunch(run, self.restarts, carry_backup=False) is None:
            return False
        run.reporter.emit(AttemptStarted(run.attempt, tuple(t.endpoint for t in run.plan.tasks)))
        return True
