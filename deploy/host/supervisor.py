"""The supervisor of one task (`python -I -S tfdeploy-host.zip supervise RUNDIR TASK --
ARGV...`, started by tasks.py launch): it runs ARGV in the task's process group and records
its exit code. One starts per task at every launch, so it imports little: the run directory's
names, not the agent's protocol, and os.fork and os.execvp rather than subprocess (whose
imports were a third of a supervisor's start).
"""
import os
import signal
import time

from deploy.host.layout import task_file
from deploy.host.rundir import write_json_atomic


def supervise(rundir, task, argv):
    # Stay alive through TERM/INT so the exit code gets recorded; a handler (not SIG_IGN) is
    # used because ignored signals would be inherited by the training process across exec.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: None)
    pid = os.fork()
    if pid == 0:
        _become(argv)
    status = os.waitpid(pid, 0)[1]
    code = 128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    write_json_atomic(task_file(rundir, task, "exit"), {"code": code, "ended": time.time()})
    return {}


def _become(argv):
    """The child: the task itself, with SIGPIPE and SIGXFSZ back at their defaults (Python
    ignores both; the handlers above end at exec). Not os.posix_spawn: glibc's leaves two
    signals of its own ignored in the program it starts."""
    try:
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
        os.execvp(argv[0], argv)
    except OSError as exc:
        os.write(1, ("tfdeploy: cannot start %s: %s\n" % (argv[0], exc)).encode())
    finally:
        os._exit(127)
