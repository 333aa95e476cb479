"""The supervisor of one task: a POSIX shell that runs the task as its child, in the task's
process group, and records its exit code when it ends (started by tasks.py launch).

It must outlive the agent (a dropped connection ends nothing) and it starts once per task at
every launch, so it is the host's /bin/sh running SCRIPT, not a Python: a shell starts in about
a millisecond of CPU, a Python with the few modules a supervisor needs in about thirty, which
on a host whose cores start a training program at the same moment is the launch's own cost.

What the script does, and why:
- `trap : HUP INT TERM`: a signal for the group (teardown's SIGTERM, a Ctrl-C) ends the task,
  and the shell waits for it all the same to record how it ended. A handler, not `trap ''`:
  an ignored signal would be inherited by the task; a handled one is back at its default.
- The shell's own output goes to /dev/null and the task gets the log on fd 1 and 2, in a
  subshell that execs it: shells print "Terminated" or "Killed" for a child a signal ended,
  and that is no line of the task's. A task that cannot start says why in its log (exit 127).
- The exit file is written in one write, not renamed into place: a reader looks at the group's
  liveness first and reads the file after (tasks.py statuses), so it reads a whole file once
  the shell is gone, and a partial one only while the task still counts as running.
- `ended` is `date +%s.%N`, or null where the host's `date` cannot say it.
"""
from deploy.host.layout import task_file

SCRIPT = """exit_file=$1
shift
trap : HUP INT TERM
exec 3>&1 >/dev/null 2>&1
(exec "$@" >&3 2>&3 3>&-)
code=$?
exec 3>&-
ended=$(date +%s.%N)
case $ended in ''|*[!0-9.]*) ended=null ;; esac
printf '{"code": %d, "ended": %s}\\n' "$code" "$ended" >"$exit_file"
"""


def supervisor_command(rundir, task, argv):
    """The command line of task `task`'s supervisor, which runs `argv`: every value is a
    positional parameter of SCRIPT, never part of it."""
    return ["/bin/sh", "-c", SCRIPT, "tfdeploy", task_file(rundir, task, "exit")] + list(argv)
