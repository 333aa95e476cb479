"""The helper that travels with every run and does the host-side work.

It is copied into the run directory on each host and run there by the host's own Python, so it
uses the standard library only. Keeping this logic in one program (rather than long shell
snippets) keeps the remote commands short, quotable, and the same over SSH and locally.

Layout of a run directory (<workdir>/runs/<run-id>/):
    run.json            {"run_id": ...}: whose directory this is; checked before deleting it
    tfdeploy_agent.py   this file
    payload/            the training program
    output/             TFDEPLOY_OUTPUT_DIR of the tasks
    worker-<i>.log      stdout+stderr of task i
    worker-<i>.pid      {"pid", "pgid", "started"} of task i's supervisor (its group leader)
    worker-<i>.exit     {"code", "ended"}, written by the supervisor when the task ends
    worker-<i>.pid.<n>, worker-<i>.exit.<n>   the same of attempt n, moved aside by a relaunch
    build.pid           {"pid", "pgid", "started"} of the running step of `inv setup` (pip)

Verbs (each prints one JSON document on stdout):
    launch RUNDIR TASK CWD [PY] -- ARGV...  environment as JSON on stdin; starts task
                                        detached; ARGV[0] becomes PY if that exists (the env
                                        of `inv setup`)
    supervise RUNDIR TASK -- ARGV...    (internal) runs ARGV, records its exit code
    poll RUNDIR TASK:OFFSET...          state, exit code and new log bytes of tasks
    follow RUNDIR TASK:OFFSET...        the same as a stream of JSON lines, one per change,
                                        until every task has ended and its log is read;
                                        `stop GRACE` on its stdin stops the tasks at once
    stop RUNDIR GRACE                   TERM every task's process group (and the setup's
                                        pip), KILL after GRACE s
    cleanup RUNDIR GRACE                stop, then delete the run directory
    want RUNDIR CACHE                   hashes of manifest.json missing from the file cache
    receive RUNDIR CACHE                those files on stdin: verify, cache, assemble payload/
    push RUNDIR CACHE                   want, answered as a line; then receive on the same
                                        stdin (all three in tfdeploy_cache.py, beside this file)
"""
import base64
import json
import os
import signal
import subprocess
import sys
import threading
import time

MAX_CHUNK = 1 << 20
# The running step of `inv setup` (venv, pip) in its own process group, recorded by
# tfdeploy_env.py (BUILD_PID there): stopped with the tasks, so cleanup leaves no pip behind.
BUILD_PID = "build.pid"
# Variables whose values are paths on this host; a leading ~/ means this host's home.
PATH_VARS = ("TFDEPLOY_OUTPUT_DIR", "TFDEPLOY_BACKUP_DIR", "TFDEPLOY_DATA_DIR")


def task_file(rundir, task, kind):
    return os.path.join(rundir, "worker-%s.%s" % (task, kind))


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def write_json_atomic(path, doc):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f)
    os.replace(tmp, path)


def run_id_of(rundir):
    doc = read_json(os.path.join(rundir, "run.json"))
    if not doc or not doc.get("run_id"):
        raise SystemExit("not a tfdeploy run directory: %s" % rundir)
    return doc["run_id"]


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


def launch(rundir, task, cwd, argv, prefer=None):
    doc = json.load(sys.stdin)
    # The data directory is the user's (remote) or placed by the data push: made empty here,
    # a mistyped path would train on nothing without a word.
    data = doc["env"].get("TFDEPLOY_DATA_DIR")
    if data is not None and not os.path.isdir(os.path.expanduser(data)):
        raise SystemExit("TFDEPLOY_DATA_DIR %s is not a directory on this host (field 'data' "
                         "of the inventory)" % data)
    attempt = int(doc["env"].get("TFDEPLOY_ATTEMPT", "1"))
    set_aside(rundir, task, attempt)
    if prefer and os.path.isfile(os.path.expanduser(prefer)):
        argv = [os.path.expanduser(prefer)] + argv[1:]
    env = dict(os.environ)
    for key, value in doc["env"].items():
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
        [sys.executable, os.path.abspath(__file__), "supervise", rundir, task, "--"] + argv,
        cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True, close_fds=True)
    info = {"pid": proc.pid, "pgid": proc.pid, "started": time.time()}
    write_json_atomic(task_file(rundir, task, "pid"), info)
    return info


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
    return sorted(int(n[len("worker-"):-len(".pid")]) for n in os.listdir(rundir)
                  if n.startswith("worker-") and n.endswith(".pid"))


def group_exists(pgid):
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def parse_requests(requests):
    return {task: int(offset) for task, offset in (item.split(":") for item in requests)}


def poll(rundir, offsets, thorough=True):
    """State and new log bytes of each task in `offsets` (task -> bytes already read).

    `thorough` checks liveness against the run id in /proc, for one-off answers; the
    follower's frequent loop uses the cheap process-group check instead."""
    if thorough:
        run_id = run_id_of(rundir)
        alive = lambda pgid: bool(group_members(pgid, run_id))  # noqa: E731
    else:
        alive = group_exists
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
                    data = f.read(MAX_CHUNK)
        except OSError:
            size = 0
        status.update(size=size, offset=offset + len(data),
                      data=base64.b64encode(data).decode("ascii"))
        tasks[task] = status
    return {"tasks": tasks}


def follow(rundir, offsets, interval=0.1, heartbeat=2.0):
    """Stream changes as they happen. One long-lived process is far cheaper than a new
    process per poll, which matters on hosts whose cores are busy training. The heartbeat
    makes a follower whose reader went away notice it (broken pipe) and exit.

    It also takes `stop GRACE` lines on stdin and answers {"stopped": ...}: this process is
    already running, so a stop sent through it acts at once, where a new command would first
    wait for a Python to start on a host whose cores are busy training (seconds)."""
    run_id_of(rundir)  # refuse a directory that is not a run's, once
    offsets = dict(offsets)
    last = {}
    out = threading.Lock()
    stopping = threading.Lock()

    def send(doc):
        with out:
            sys.stdout.write(json.dumps(doc) + "\n")
            sys.stdout.flush()

    def commands():
        try:
            for line in sys.stdin:
                words = line.split()
                if len(words) == 2 and words[0] == "stop":
                    with stopping:
                        send({"stopped": stop(rundir, float(words[1]))})
        except (OSError, ValueError):
            pass  # the reader went away; the heartbeat ends us

    threading.Thread(target=commands, daemon=True).start()
    last_write = time.time()
    while True:
        doc = poll(rundir, offsets, thorough=False)
        changed = {}
        for task, status in doc["tasks"].items():
            offsets[task] = status["offset"]
            key = (status["state"], status.get("code"), status["size"], status["offset"])
            if status["data"] or last.get(task) != key:
                changed[task] = status
            last[task] = key
        now = time.time()
        if changed or now - last_write > heartbeat:
            send({"tasks": changed})
            last_write = now
        if all(s["state"] in ("exited", "lost") and s["offset"] >= s["size"]
               for s in doc["tasks"].values()):
            with stopping:   # a stop in progress still gets to answer
                return None
        if not any(s["offset"] < s["size"] for s in doc["tasks"].values()):
            time.sleep(interval)


def stop(rundir, grace):
    run_id = run_id_of(rundir)
    groups = {}
    for task in task_indices(rundir):
        info = read_json(task_file(rundir, task, "pid"))
        if info:
            groups[task] = info["pgid"]
    build = read_json(os.path.join(rundir, BUILD_PID))
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


def cleanup(rundir, grace):
    run_id = run_id_of(rundir)
    real = os.path.realpath(rundir)
    # Delete only a directory that is provably this run's own: <workdir>/runs/<run-id>.
    if os.path.basename(real) != run_id or os.path.basename(os.path.dirname(real)) != "runs":
        raise SystemExit("refusing to delete %s: not a run directory of run %s" % (real, run_id))
    result = stop(rundir, grace)
    if not result["survivors"]:
        import shutil
        shutil.rmtree(real)
        result["removed"] = real
    return result


def main(argv):
    verb, args = argv[0], argv[1:]
    rest = args[args.index("--") + 1:] if "--" in args else []
    if verb == "launch":
        before = args[:args.index("--")] if "--" in args else args
        out = launch(args[0], args[1], args[2], rest, before[3] if len(before) > 3 else None)
    elif verb == "supervise":
        out = supervise(args[0], args[1], rest)
    elif verb == "poll":
        out = poll(args[0], parse_requests(args[1:]))
    elif verb == "follow":
        try:
            out = follow(args[0], parse_requests(args[1:]))
        except BrokenPipeError:
            os._exit(0)
    elif verb == "stop":
        out = stop(args[0], float(args[1]))
    elif verb == "cleanup":
        out = cleanup(args[0], float(args[1]))
    elif verb in ("push", "want", "receive"):
        import tfdeploy_cache
        out = tfdeploy_cache.main(verb, args)
    elif verb in ("envstatus", "setup"):
        import tfdeploy_env
        out = tfdeploy_env.main(verb, args)
    else:
        raise SystemExit("unknown verb %r" % verb)
    if out is not None and verb != "supervise":
        sys.stdout.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
