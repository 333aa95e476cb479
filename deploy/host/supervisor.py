"""The supervisor of one task (`python -I -S tfdeploy-host.zip supervise RUNDIR TASK --
ARGV...`, started by tasks.py launch): it runs ARGV in the task's process group and records
its exit code. One starts per task at every launch, so it imports the standard library and the
run directory's names, not the agent's protocol.
"""
import signal
import subprocess
import time

from deploy.host.layout import task_file
from deploy.host.rundir import write_json_atomic


def supervise(rundir, task, argv):
    # Stay alive through TERM/INT so the exit code gets recorded; a handler (not SIG_IGN) is
    # used because ignored signals would be inherited by the training process across exec.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: None)
    try:
        code = subprocess.call(argv)
    except OSError as exc:
        print("tfdeploy: cannot start %s: %s" % (argv[0], exc), flush=True)
        code = 127
    if code < 0:
        code = 128 - code
    write_json_atomic(task_file(rundir, task, "exit"), {"code": code, "ended": time.time()})
    return {}
