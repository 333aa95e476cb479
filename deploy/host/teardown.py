"""Ending a run's processes on a host: TERM to every task's process group, KILL after the
grace period, and a check against the run id that nothing of the run is left; `cleanup` then
deletes the run directory, and only a directory that is provably the run's own, once the last
host sharing it (hosts with one workdir, share.py) is done with it.
"""
import os
import shutil
import signal
import time

from deploy.host import share
from deploy.host.layout import BUILD_PID, RUNS, in_run, task_file, task_keys
from deploy.host.rundir import read_json, run_id_of


def ignores_term(pid):
    """Whether SIGTERM is set to SIG_IGN in process `pid` (SigIgn in /proc/<pid>/status).
    TERM cannot end such a process, so waiting the grace period for it is only a delay."""
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("SigIgn:"):
                    return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
    except (OSError, ValueError):
        pass
    return False


def deaf_to_term(pgid, members):
    """A group in which every process but the supervisor (the group leader, which waits for
    its child and records the exit code) ignores SIGTERM: TERM has no one to end."""
    workers = [p for p in members if p != pgid]
    return bool(workers) and all(ignores_term(p) for p in workers)


def group_members(pgid, run_id):
    """Live processes of group `pgid` that belong to this run (by their environment)."""
    marker = ("TFDEPLOY_RUN_ID=%s" % run_id).encode()
    if not os.path.isdir("/proc/self"):
        try:
            os.killpg(pgid, 0)
            return [pgid]
        except ProcessLookupError:
            return []
        except PermissionError:
            return [pgid]
    members = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name, "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            if fields[0] == b"Z" or int(fields[2]) != pgid:
                continue
            with open("/proc/%s/environ" % name, "rb") as f:
                if marker in f.read().split(b"\0"):
                    members.append(int(name))
        except (OSError, IndexError, ValueError):
            continue
    return members


def task_indices(rundir):
    """The keys of the tasks launched in `rundir` (layout.task_key): those with a pid file."""
    return task_keys(os.listdir(rundir), "pid")


def group_exists(pgid):
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def stop(rundir, grace):
    run_id = run_id_of(rundir)
    groups = {}
    for task in task_indices(rundir):
        info = read_json(task_file(rundir, task, "pid"))
        if info:
            groups[task] = info["pgid"]
    build = read_json(in_run(rundir, BUILD_PID))
    if build:
        groups["build"] = build["pgid"]
    signalled = {}

    def send(task, pgid, sig):
        try:
            os.killpg(pgid, sig)
            signalled.setdefault(str(task), []).append(signal.Signals(sig).name)
        except ProcessLookupError:
            pass

    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        live = {t: g for t, g in groups.items() if group_members(g, run_id)}
        for task, pgid in live.items():
            send(task, pgid, sig)
        deadline = time.time() + wait
        while live and time.time() < deadline:
            time.sleep(0.05)
            members = {t: group_members(g, run_id) for t, g in live.items()}
            live = {t: g for t, g in live.items() if members[t]}
            if sig == signal.SIGTERM:
                for task, pgid in live.items():
                    # TERM cannot end a group whose processes ignore it: KILL it now
                    # rather than after the grace period (the others keep their grace).
                    if deaf_to_term(pgid, members[task]) and "SIGKILL" not in \
                            signalled.get(str(task), ()):
                        send(task, pgid, signal.SIGKILL)
        if not live:
            break
    survivors = sorted(p for g in groups.values() for p in group_members(g, run_id))
    return {"signalled": signalled, "survivors": survivors}


def cleanup(rundir, grace, host=None):
    """Stop the run's processes here; delete the directory when `host` (the inventory host this
    is) was the last one using it."""
    run_id = run_id_of(rundir)
    real = os.path.realpath(rundir)
    # Delete only a directory that is provably this run's own: <workdir>/runs/<run-id>.
    if os.path.basename(real) != run_id or os.path.basename(os.path.dirname(real)) != RUNS:
        raise SystemExit("refusing to delete %s: not a run directory of run %s" % (real, run_id))
    result = stop(rundir, grace)
    if result["survivors"]:
        return result
    if share.leave(real, host):
        # Two last hosts may race here: whichever deletes first, the directory is gone.
        shutil.rmtree(real, ignore_errors=True)
        if os.path.exists(real):
            shutil.rmtree(real)      # what is left: the error says why
        result["removed"] = real
    else:
        result["kept"] = "other hosts sharing the workdir still use it"
    return result
