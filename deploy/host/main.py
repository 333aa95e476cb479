"""The host package as a program of its own: `python -I tfdeploy-host.zip supervise RUNDIR
TASK -- ARGV...`, the one thing that must outlive the run's agent (agent.py, which takes every
other step as a request): the supervisor of each task, which runs ARGV in the task's process
group and records its exit code (supervisor.py)."""
import os
import sys

from deploy.host.supervisor import supervise
from deploy.host.layout import checked_task_key
from deploy.host.hosterror import HostError


def main(argv):
    try:
        run_verb(argv)
    except HostError as exc:      # a program's error: its words on stderr, exit status 1
        raise SystemExit(str(exc)) from None


def run_verb(argv):
    # Nothing the tool makes on a host is for other users' eyes: run dirs, logs, the cache.
    os.umask(0o077)
    head = argv[:argv.index("--")] if "--" in argv else argv
    if len(head) != 3 or head[0] != "supervise":
        raise HostError("usage: supervise RUNDIR TASK -- ARGV... (not %r)" % argv[:4])
    _, rundir, task = head
    supervise(rundir, checked_task_key(task), argv[argv.index("--") + 1:])


if __name__ == "__main__":
    main(sys.argv[1:])
