"""Ending a run's processes on a host: TERM to every task's process group and to every other
process of this user whose environment carries the run's id (one that left its group), KILL
after the grace period, and a check against the run id that nothing of the run is left;
`cleanup` then deletes the run directory, and only a directory that is provably the run's own,
once the last host sharing it (hosts with one workdir, share.py) is done with it.
"""
import os
import shutil
import signal
import time

from deploy.host import share
from deploy.host.layout import BUILD_PID, RUN_ID, RUNS, in_run, task_file, task_keys
from deploy.host.hosterror import HostError
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


def run_processes(run_id, spare=()):
    """One pass over /proc: pid -> process group of every live process of this user whose
    environment holds TFDEPLOY_RUN_ID=<run_id> as an entry of its own (not a prefix of
    another id), except the pids in `spare`. None where there is no /proc to read.

    Only the environment a process was started with shows there; every task and whatever it
    starts inherits it, so a process that left its task's group (setsid, a double fork, a
    nohup helper) is found by it all the same. Processes of other users are never looked at."""
    if not os.path.isdir("/proc/self"):
        return None
    # An entry of its own: between two NULs once the environment is framed by one on each side.
    marker = ("\0TFDEPLOY_RUN_ID=%s\0" % run_id).encode()
    uid = os.geteuid()
    found = {}
    # The pass reads every process of this user, each of a whole host's for root, and runs
    # every 50 ms while a teardown waits: file descriptors rather than file objects, and one
    # search rather than a list of entries, take about a third off each process's cost
    # (docs/benchmarks.md, "Small packets held back; idle cores").
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in spare:
            continue
        try:
            fd = os.open("/proc/%s/environ" % name, os.O_RDONLY)
            try:
                # The file is owned as its process is (for root, every process opens).
                if os.fstat(fd).st_uid != uid:
                    continue
                environ = [b"\0"]
                while True:
                    piece = os.read(fd, 65536)
                    if not piece:
                        break
                    environ.append(piece)
            finally:
                os.close(fd)
            environ.append(b"\0")
            if marker not in b"".join(environ):
                continue
            with open("/proc/%s/stat" % name, "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            if fields[0] != b"Z":
                found[int(name)] = int(fields[2])
        except (OSError, IndexError, ValueError):
            continue     # ended meanwhile, or not ours to read
    return found


def live_groups(run_id):
    """Whether a process group still holds a live process of run `run_id` (by their
    environment), as a test to ask of any number of groups: one look at /proc for them all,
    since each look reads every process's environment. Without /proc: whether it exists."""
    found = run_processes(run_id)
    if found is None:
        return group_exists
    return set(found.values()).__contains__


def lineage():
    """This process and its ancestors (the agent, the shell that started it and, on a local
    host, the controller): never signalled, whatever their environment holds."""
    pids, pid = set(), os.getpid()
    while pid > 1 and pid not in pids:
        pids.add(pid)
        try:
            with open("/proc/%d/stat" % pid, "rb") as f:
                pid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            break
    return pids


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


def stop(rundir, grace, run_id=None):
    """TERM every task's process group, then every other process of the run (escaped from its
    group: found by the run id in its environment), KILL what is left after `grace` seconds.
    Each round looks at /proc once for all of them. Answers what was signalled, the pids of
    escaped processes that were (only when there were some), and the survivors. `run_id`: the
    run's, when known (owned_run_id); by default its run.json's."""
    run_id = run_id or run_id_of(rundir)
    groups = {}
    for task in task_indices(rundir):
        info = read_json(task_file(rundir, task, "pid"))
        if info:
            groups[task] = info["pgid"]
    build = read_json(in_run(rundir, BUILD_PID))
    if build:
        groups["build"] = build["pgid"]
    spare = lineage()
    signalled, escaped = {}, {}

    def look():
        """The groups with live processes of the run (task -> members), and the run's
        processes outside every recorded group."""
        found = run_processes(run_id, spare)
        if found is None:      # no /proc: groups by their existence only, escapes unseen
            return {t: [g] for t, g in groups.items() if group_exists(g)}, []
        live = {t: [p for p, g in found.items() if g == pgid] for t, pgid in groups.items()}
        pgids = set(groups.values())
        return {t: m for t, m in live.items() if m}, [p for p, g in found.items()
                                                         if g not in pgids]

    def send(task, pgid, sig):
        try:
            os.killpg(pgid, sig)
            signalled.setdefault(str(task), []).append(signal.Signals(sig).name)
        except ProcessLookupError:
            pass

    def end_escaped(pids, sig):
        """TERM once to each (also to one that appears later, started by a process that was
        still ending); KILL in the KILL round, or at once to one that ignores TERM."""
        for pid in pids:
            sent = escaped.get(pid, [])
            want = signal.SIGKILL if sig == signal.SIGKILL or ignores_term(pid) else sig
            if "SIGKILL" in sent or want.name in sent:
                continue
            try:
                os.kill(pid, want)
                escaped.setdefault(pid, []).append(want.name)
            except ProcessLookupError:
                pass

    # Every look at /proc reads the environment of each of this user's processes (all of a
    # host's, for root): the state each round starts from is the last look's, and a run whose
    # tasks have all ended costs one look.
    live, loose = look()
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        if not live and not loose:
            break
        for task in live:
            send(task, groups[task], sig)
        # After the groups: a task's own shutdown may end its helpers itself.
        end_escaped(loose, sig)
        deadline = time.time() + wait
        while True:
            time.sleep(0.05)
            live, loose = look()
            end_escaped(loose, sig)
            if sig == signal.SIGTERM:
                for task, members in live.items():
                    # TERM cannot end a group whose processes ignore it: KILL it now
                    # rather than after the grace period (the others keep their grace).
                    if deaf_to_term(groups[task], members) and "SIGKILL" not in \
                            signalled.get(str(task), ()):
                        send(task, groups[task], signal.SIGKILL)
            if not (live or loose) or time.time() >= deadline:
                break
    result = {"signalled": signalled,
              "survivors": sorted({p for m in live.values() for p in m} | set(loose))}
    if escaped:
        result["escaped"] = sorted(escaped)
    return result


def owned_run_id(rundir, named=None):
    """The run id of `rundir` for its cleanup: its run.json's; where that is gone, `named`, the
    run the controller holds the directory for, when the directory is that run's by its place,
    <workdir>/runs/<named>. Such a directory is what a task of the run wrote after the run's
    teardown had removed it: a host back after it was lost, writing into a shared workdir."""
    try:
        return run_id_of(rundir)
    except HostError:
        real = os.path.realpath(rundir)
        if not named or not RUN_ID.match(named) or os.path.basename(real) != named or \
                os.path.basename(os.path.dirname(real)) != RUNS:
            raise
        return named


def cleanup(rundir, grace, host=None, named=None):
    """Stop the run's processes here; delete the directory when `host` (the inventory host this
    is) was the last one using it. `named`: as for owned_run_id."""
    run_id = owned_run_id(rundir, named)
    real = os.path.realpath(rundir)
    # Delete only a directory that is provably this run's own: <workdir>/runs/<run-id>.
    if os.path.basename(real) != run_id or os.path.basename(os.path.dirname(real)) != RUNS:
        raise HostError("refusing to delete %s: not a run directory of run %s" % (real, run_id))
    result = stop(rundir, grace, run_id)
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
