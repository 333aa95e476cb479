"""The tasks of a run on their host: start each one detached, supervise it, and report
states and new log bytes to the controller (one answer, or a live stream).

A task runs in a session and process group of its own under a supervisor (a shell:
supervisor.py), which records its exit code: a dropped SSH connection ends nothing, and
teardown (teardown.py) finds every process by its group and the run id in its environment.
"""
import os
import subprocess
import threading
import time

from deploy.host.envkey import env_python
from deploy.host.layout import task_file, workdir_of
from deploy.host.hosterror import HostError
from deploy.host.protocol import FINAL_STATES, LOG_CHUNK
from deploy.host.rundir import read_json, run_id_of, write_json_atomic
from deploy.host.supervisor import supervisor_command
from deploy.host.teardown import group_exists, live_groups

# Variables whose values are paths on this host; a leading ~/ means this host's home.
PATH_VARS = ("TFDEPLOY_OUTPUT_DIR", "TFDEPLOY_BACKUP_DIR", "TFDEPLOY_DATA_DIR")

# How many supervisors this agent started have exited: a follow waiting out its interval
# looks again as soon as one does, so a task's end reaches the controller at once.
_ends = 0
_ended = threading.Condition()


def _reap(proc):
    """Wait for a supervisor (its zombie would keep the task's process group alive to every
    check) and tell the follows it ended."""
    global _ends
    proc.wait()
    with _ended:
        _ends += 1
        _ended.notify_all()


def set_aside(rundir, task, attempt):
    """A relaunch keeps the previous attempt's pid and exit files under another name, so
    that its state is not mistaken for the new attempt's (and nothing is lost)."""
    for kind in ("pid", "exit"):
        path = task_file(rundir, task, kind)
        if os.path.exists(path):
            os.replace(path, "%s.%d" % (path, attempt - 1))


def ends_with_newline(path):
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"


def launch(rundir, task, cwd, argv, requirements, variables):
    """Start the task detached with the environment `variables` on top of this one's.
    `requirements`: the sha256 of the payload's requirements.txt (or None); the python of its
    `inv setup` environment for this host replaces ARGV[0] where that environment exists."""
    # The data directory is the user's (remote) or placed by the data push: made empty here,
    # a mistyped path would train on nothing without a word.
    data = variables.get("TFDEPLOY_DATA_DIR")
    if data is not None and not os.path.isdir(os.path.expanduser(data)):
        raise HostError("TFDEPLOY_DATA_DIR %s is not a directory on this host (field 'data' "
                         "of the inventory)" % data)
    attempt = int(variables.get("TFDEPLOY_ATTEMPT", "1"))
    set_aside(rundir, task, attempt)
    if requirements:
        prefer = env_python(workdir_of(os.path.expanduser(rundir)), requirements)
        if os.path.isfile(prefer):
            argv = [prefer] + argv[1:]
    env = dict(os.environ)
    for key, value in variables.items():
        if key in PATH_VARS:
            value = os.path.expanduser(value)
        env[key] = value
    for key in ("TFDEPLOY_OUTPUT_DIR", "TFDEPLOY_BACKUP_DIR"):
        if key in env:
            os.makedirs(env[key], exist_ok=True)
    log = open(task_file(rundir, task, "log"), "ab")
    if attempt > 1:
        # One log per task across attempts; this line marks where a relaunch begins, on a
        # line of its own even if the failed attempt died mid-line.
        if log.tell() and not ends_with_newline(log.name):
            log.write(b"\n")
        log.write(("==== tfdeploy: attempt %d of task %s starts at %s ====\n" % (
            attempt, task, time.strftime("%Y-%m-%d %H:%M:%S"))).encode())
        log.flush()
    proc = subprocess.Popen(
        supervisor_command(rundir, task, argv),
        cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True, close_fds=True)
    log.close()
    # The agent that started it lives as long as the run: it reaps the supervisor.
    threading.Thread(target=_reap, args=(proc,), daemon=True).start()
    info = {"pid": proc.pid, "pgid": proc.pid, "started": time.time()}
    write_json_atomic(task_file(rundir, task, "pid"), info)
    return info


def statuses(rundir, offsets, thorough=True):
    """State and new log bytes (at most LOG_CHUNK) of each task in `offsets` (task -> bytes
    already read): task -> (status, bytes).

    `thorough` checks liveness against the run id in /proc, for one-off answers; the
    follower's frequent loop uses the cheap process-group check instead."""
    alive = live_groups(run_id_of(rundir)) if thorough else group_exists
    tasks = {}
    for task, offset in offsets.items():
        info = read_json(task_file(rundir, task, "pid"))
        status = {"state": "pending"}
        if info:
            # Liveness first, then the exit file: the supervisor writes it before it exits.
            running = alive(info["pgid"])
            ended = read_json(task_file(rundir, task, "exit"))
            status = {"pid": info["pid"], "started": info["started"]}
            if ended:
                status.update(state="exited", code=ended["code"], ended=ended["ended"])
            else:
                status["state"] = "running" if running else "lost"
        log = task_file(rundir, task, "log")
        data = b""
        try:
            size = os.path.getsize(log)
            if size > offset:
                with open(log, "rb") as f:
                    f.seek(offset)
                    data = f.read(LOG_CHUNK)
        except OSError:
            size = 0
        status.update(size=size, offset=offset + len(data))
        tasks[task] = (status, data)
    return tasks


def follow(rundir, offsets, send, interval=0.1):
    """Call send(doc, chunks) with every change as it happens, log bytes as they are
    (frames.py), until every task has ended and its log is read. It runs inside the host's
    agent (agent.py), which is already running: a stop asked meanwhile acts at once, where a
    new command would first wait for a Python to start on a host whose cores are busy
    training (seconds)."""
    run_id_of(rundir)  # refuse a directory that is not a run's, once
    offsets = dict(offsets)
    last = {}
    while True:
        ends = _ends
        tasks = statuses(rundir, offsets, thorough=False)
        changed, chunks = {}, {}
        for task, (status, data) in tasks.items():
            offsets[task] = status["offset"]
            key = (status["state"], status.get("code"), status["size"], status["offset"])
            if data or last.get(task) != key:
                changed[task] = status
                if data:
                    chunks[task] = data
            last[task] = key
        if changed:
            send({"tasks": changed}, chunks)
        if all(s["state"] in FINAL_STATES and s["offset"] >= s["size"]
               for s, _ in tasks.values()):
            return
        # Behind on a task that still runs, it waits all the same: a flood of logs is read
        # at most a chunk per task per interval while the tasks write it (their cores are
        # theirs), and at full speed once they have ended.
        behind = [s for s, _ in tasks.values() if s["offset"] < s["size"]]
        if not behind or any(s["state"] == "running" for s in behind):
            with _ended:
                _ended.wait_for(lambda: _ends != ends, interval)
