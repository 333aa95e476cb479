"""How the end of one task bears on the run, by its role. Pure: watch.py acts on the answers.

A cluster of workers only (MultiWorkerMirroredStrategy) ends when every task has ended, and
any task failing fails it: its workers wait on each other, none can go on alone.

A parameter-server cluster ends with its chief, which runs the training program: ps and worker
tasks only serve (`tf.distribute.Server(...).join()`) and never exit by themselves.
  - the chief exits 0: the run succeeded; the other tasks are stopped;
  - the chief fails: the run fails;
  - a ps task ends, however: the run fails at once (the variables it held are gone);
  - a worker ends: reported and tolerated (the chief's coordinator gives its steps to the
    other workers), relaunched in place under --restarts; once no worker is left and none
    comes back, the run fails (the chief would wait for one forever);
  - the evaluator ends: reported, never fatal.
"""
from __future__ import annotations

from typing import Iterable

from deploy.state.progress import TaskProgress

FAIL = "fail"            # the run fails: stop every task
SUCCEED = "succeed"      # the run is done: stop the others, success
TOLERATE = "tolerate"    # a worker of a ps cluster: reported, relaunched if --restarts allows
REPORT = "report"        # the evaluator: reported only
CONTINUE = "continue"    # nothing to do (a worker-only cluster's task that exited 0)


def on_end(task: TaskProgress, roles: bool) -> str:
    """What the run does when `task` has ended (`roles`: a parameter-server cluster)."""
    if not roles:
        return FAIL if task.failed else CONTINUE
    if task.role == "chief":
        return FAIL if task.failed else SUCCEED
    if task.role == "ps":
        return FAIL
    if task.role == "worker":
        return TOLERATE
    return REPORT


def no_worker_left(tasks: Iterable[TaskProgress]) -> bool:
    """Every worker of a ps cluster has ended: the chief has nothing to run its steps on."""
    workers = [t for t in tasks if t.role == "worker"]
    return bool(workers) and all(t.state in ("exited", "lost") for t in workers)


def watched(task: TaskProgress, roles: bool) -> bool:
    """Whether the startup watchdog waits for the task's first training step: every task of a
    worker-only cluster trains, in a ps cluster only the chief runs steps it can tell of."""
    return not roles or task.role == "chief"


def succeeded(tasks: Iterable[TaskProgress], roles: bool) -> bool:
    """How the run went, once it ended with no failure: every task exited 0, or with roles,
    the chief did (the others were stopped when it ended)."""
    tasks = list(tasks)
    ended_well = [t.state == "exited" and t.code == 0 for t in tasks
                  if not roles or t.role == "chief"]
    return bool(ended_well) and all(ended_well)
