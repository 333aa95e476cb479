"""The agent: one Python process per host per run, started once on the run's one channel (an
SSH session, or a pipe for `transport: local`), that takes every later step as a request.

Requests come on stdin as frames (frames.py): {"id", "verb", "args", "home", "env"} and a body.
`home` lists the args that are paths on this host (a leading ~ is this host's home). Each is
answered by frames carrying its "id": the verb's document, or {"error": ...}; a follow answers
with a frame per change and then {"end": true}. Every BEAT seconds the agent also sends
{"beat": ...}, whatever else it is doing, so the controller can tell a host that stopped
answering from one with nothing to say.

Requests run in threads of their own, so that a stop is never queued behind a slow step; only
`receive` runs in the reading thread, because its files follow it on the same stdin. When
stdin ends (the controller is gone) the agent ends; the tasks it started run in sessions of
their own and go on.
"""
import io
import json
import os
import queue
import shutil
import subprocess
import sys
import threading
import time

from deploy.host import archive, cache, datatree, envkey, probe, prune, tasks, teardown
from deploy.host.frames import FrameError, read_frame, write_frame
from deploy.host.layout import BACKUP, in_run
from deploy.host.main import parse_offsets, task_arg
from deploy.host.rundir import run_id_of
from deploy.host.stage import StageError, unpack_stage

BEAT = 1.0
# Follow frames sent ahead of the controller's credits: a controller that falls behind stops
# the follow here, and the logs wait on this host's disk, not in the controller's memory.
WINDOW = 4
# How much lower a follow runs than the tasks (yield_to_tasks).
FOLLOW_NICENESS = 10
# Errors a verb reports as its answer; anything else is a bug, reported with its type.
EXPECTED = (OSError, ValueError, KeyError, SystemExit, cache.CacheError, StageError,
            subprocess.SubprocessError, archive.Refused)


class Channel:
    """The agent's stdout: one frame at a time, whichever thread writes. A controller that is
    gone ends the agent."""

    def __init__(self, out):
        self.out, self.lock = out, threading.Lock()

    def send(self, doc, chunks=None, body=b""):
        try:
            with self.lock:
                write_frame(self.out, doc, chunks, body)
        except (OSError, ValueError):
            os._exit(0)


def beat(channel):
    while True:
        channel.send({"beat": time.time()})
        time.sleep(BEAT)


class Mesh:
    """The mesh probe of `inv check`, driven in phases by requests: listen (starts it), dial,
    close. Each phase's request is answered by what the probe says next."""

    def __init__(self, channel):
        self.channel, self.lines, self.asking = channel, queue.Queue(), None

    def say(self, doc):
        self.channel.send(dict(doc, id=self.asking))

    def listen(self, request, spec):
        self.asking = request
        done = probe.mesh(spec, self.lines, self.say)
        self.channel.send(dict(done, id=self.asking))

    def next(self, request, phase):
        self.asking = request
        self.lines.put(phase)


def yield_to_tasks():
    """Run this thread (a follow, which can read and send logs as fast as the tasks write them)
    at a lower priority than the tasks: on a host whose cores are all training, shipping a
    flood of logs must not slow the training down. Linux gives each thread its own nice value;
    the tasks, started by other threads, keep theirs."""
    if sys.platform.startswith("linux"):
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), FOLLOW_NICENESS)
        except OSError:
            pass


def expanded(request):
    """The request's words, its paths (HostPath, plan/command.py) with a leading `~` or `~/`
    as this host's home, as a shell expands them; `~user/` stays as it is, as quoted."""
    args = [str(a) for a in request.get("args", [])]
    for i in request.get("home", []):
        if args[i] == "~" or args[i].startswith("~/"):
            args[i] = os.path.expanduser(args[i])
    return args


def probe_host(args, body):
    """The probe, by this host's `inv setup` environment's interpreter where one was built for
    the requirements named (what the tasks will run: its package versions count), else by
    this one."""
    workdir, count, data_dir, requirements = args
    data_dir = data_dir or None
    env_python = envkey.env_python(workdir, requirements) if requirements else None
    if env_python and os.access(env_python, os.X_OK):
        done = subprocess.run([env_python, "-I", "-", "probe", workdir, count] +
                              ([data_dir] if data_dir else []), input=body,
                              capture_output=True, timeout=120)
        if done.returncode:
            raise ValueError("%s: %s" % (env_python, done.stderr.decode("utf-8", "replace")
                                         .strip().splitlines()[-1:] or done.returncode))
        return json.loads(done.stdout)
    return probe.probe(workdir, int(count), data_dir)


def stage(verb, args, body):
    """A push's stage: unpack it, then answer what the cache lacks (`push`: the payload,
    `data-push`: a data directory) and the room left where the files would go: the
    controller sends nothing to a host without room for what it lacks."""
    rundir = args[0]
    riders = unpack_stage(rundir, body)
    if verb == "push":
        cache_dir = args[1]
        answer = pushing("payload", verb, cache_dir, args[2:3],
                         lambda: cache.want(rundir, cache_dir, args[2:4] or None, riders))
    else:
        cache_dir = args[2]
        answer = pushing("data", verb, cache_dir, (),
                         lambda: datatree.want(rundir, args[1], cache_dir))
    return dict(answer, **cache.room(cache_dir))


def receive(verb, args, stream):
    if verb == "receive":
        return pushing("payload", verb, args[1], args[2:3],
                       lambda: cache.receive(args[0], args[1], stream))
    return pushing("data", verb, args[2], (),
                   lambda: datatree.receive(args[0], args[1], args[2], stream))


def pushing(what, verb, cache_dir, host, work):
    """`work`'s answer; a failure in words a user acts on (a full disk names where)."""
    try:
        return work()
    except (cache.CacheError, OSError, ValueError, KeyError) as exc:
        raise StageError(cache.failure(what, verb, exc, cache_dir, *host)) from None


def replace_backup(rundir, limits, body):
    """Replace the run's backup/ with the tar.gz `body` (another host's: unpacked as
    archive.py unpacks, nothing outside backup/); only <rundir>/backup is deleted, inside a
    directory that is provably a run's. Answers what was unpacked and what was skipped."""
    run_id_of(rundir)
    backup = in_run(rundir, BACKUP)
    shutil.rmtree(backup, ignore_errors=True)
    done = archive.unpack(io.BytesIO(body), backup, limits)
    return {"files": done.files, "skipped": done.skipped, "skipped_count": done.skipped_count}


def ending(verb, args):
    """Stop (or clean up) the run here. A host that never got the run (its push failed), or
    whose teardown is done already, has nothing to end, and says so."""
    rundir = args[0]
    if not os.path.isdir(rundir):
        return {"signalled": {}, "survivors": [], "absent": True}
    if verb == "stop":
        return teardown.stop(rundir, float(args[1]))
    return teardown.cleanup(rundir, float(args[1]), *args[2:3])


def answer(request, args, channel, mesh, follows):
    verb, body = request.get("verb"), request.get("body", b"")
    if verb == "probe":
        return probe_host(args, body)
    if verb == "ports":
        return {"ports": probe.free_ports(int(args[0]))}
    if verb == "mesh-listen":
        return mesh.listen(request["id"], json.loads(args[0]))
    if verb in ("mesh-dial", "mesh-close"):
        return mesh.next(request["id"], verb[len("mesh-"):])
    if verb in ("push", "data-push"):
        return stage(verb, args, body)
    if verb == "launch":
        env = dict(request.get("env", {}))
        rundir, task, cwd = args[0], task_arg(args[1]), args[2]
        tail = args[args.index("--") + 1:]
        head = args[:args.index("--")]
        return tasks.launch(rundir, task, cwd, tail, head[3] if len(head) > 3 else None, env)
    if verb == "poll":
        known = tasks.statuses(args[0], parse_offsets(args[1:]))
        return {"tasks": {task: status for task, (status, _) in known.items()},
                "chunks": {task: data for task, (_, data) in known.items() if data}}
    if verb == "follow":
        yield_to_tasks()
        credits = follows[request["id"]] = threading.Semaphore(WINDOW)

        def send(doc, chunks):
            credits.acquire()
            doc["id"] = request["id"]
            channel.send(doc, chunks)
        try:
            tasks.follow(args[0], parse_offsets(args[1:]), send)
        finally:
            follows.pop(request["id"], None)
        return {"end": True}
    if verb == "credit":
        # Sent for a frame the follow sent, so after it started; it may have ended since.
        credits = follows.get(int(args[0]))
        if credits is not None:
            credits.release()
        return None
    if verb in ("stop", "cleanup"):
        return ending(verb, args)
    if verb == "tar-out":
        return {"body": archive.pack(args[0], archive.Limits.of_words(args[1:3]))}
    if verb == "replace-backup":
        return replace_backup(args[0], archive.Limits.of_words(args[1:3]), body)
    if verb == "prune":
        return prune.prune(args[0], args[1], json.loads(body), float(args[2]),
                           dry=args[3] == "dry")
    raise ValueError("unknown request %r" % verb)


def respond(request, channel, work):
    """Run `work` and send its answer (or the error) under the request's id; the answer's
    "body" and "chunks" (task -> log bytes) travel as bytes (frames.py). None: the verb
    answers by itself (the mesh phases) or not at all (a credit). False when it failed."""
    try:
        doc = work()
    except EXPECTED as exc:
        text = str(exc) if not isinstance(exc, OSError) or not exc.filename else \
            "%s: %s" % (exc.strerror, exc.filename)
        doc = {"error": text or type(exc).__name__}
    except Exception as exc:  # a bug here: the controller reports it as such
        doc = {"error": "%s: %s" % (type(exc).__name__, exc)}
    if doc is None:
        return True
    body, chunks = doc.pop("body", b""), doc.pop("chunks", None)
    channel.send(dict(doc, id=request["id"]), chunks, body)
    return "error" not in doc


def serve(stdin, stdout):
    # Nothing the tool makes on a host is for other users' eyes: run dirs, logs, the cache.
    os.umask(0o077)
    channel = Channel(stdout)
    threading.Thread(target=beat, args=(channel,), daemon=True).start()
    mesh = Mesh(channel)
    follows = {}      # a running follow's id -> its credits
    while True:
        try:
            request = read_frame(stdin)
        except (FrameError, OSError):
            break
        if request is None:
            break
        args = expanded(request)
        if request.get("verb") in ("receive", "data-receive"):
            # Its files follow on stdin: read here, before the next request. When they fail,
            # the rest of them would be read as requests: the agent stops reading instead
            # (the controller starts another for what follows).
            if not respond(request, channel, lambda: receive(request["verb"], args, stdin)):
                break
            continue
        threading.Thread(target=respond, daemon=True, args=(
            request, channel, lambda r=request, a=args: answer(r, a, channel, mesh, follows))).start()
    sys.stdout.flush()
    os._exit(0)
