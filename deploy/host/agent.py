"""The agent: one Python process per host per run, started once on the run's one channel (an
SSH session, or a pipe for `transport: local`), that takes every later step as a request.

Requests come on stdin as frames (frames.py): {"id", "verb", "fields", "home", "env"} and a
body, each decoded into its typed request (protocol.py) and handed to the handler of its type
(HANDLERS). Each is answered by frames carrying its "id": the verb's document, or
{"error": ...}; a follow answers with a frame per change and then {"end": true}. Every BEAT
seconds the agent also sends {"beat": ...}, whatever else it is doing, so the controller can
tell a host that stopped answering from one with nothing to say.

Requests run in threads of their own, so that a stop is never queued behind a slow step; only
`receive` runs in the reading thread, because its files follow it on the same stdin. When
stdin ends (the controller is gone) the agent ends; the tasks it started run in sessions of
their own and go on.
"""
import io
import itertools
import json
import os
import queue
import shutil
import subprocess
import sys
import threading
import time

from deploy.host import (
    archive, cache, datatree, envkey, gpus, probe, prune, tasks, teardown, venv
)
from deploy.host.frames import FrameError, read_frame, write_frame
from deploy.host.layout import BACKUP, checked_task_key, in_run
from deploy.host.hosterror import HostError
from deploy.host.protocol import (
    BackupOutRequest, CleanupRequest, CreditRequest, DataPushRequest, DataReceiveRequest,
    EnvBuildRequest, EnvStatusRequest, FollowRequest, GpuPlaceRequest, GpuReleaseRequest,
    LaunchRequest, MeshCloseRequest, MeshDialRequest, MeshListenRequest, PollRequest,
    PortsFreeRequest, PortsRequest, ProbeRequest, PruneRequest, PushRequest, ReceiveRequest,
    ReplaceBackupRequest, StopRequest, TailRequest, TarOutRequest, decode_request
)
from deploy.host.rundir import run_id_of
from deploy.host.stage import StageError, unpack_stage

BEAT = 1.0
# Every this many beats, the GPUs of a host running GPU tasks are sampled (nvidia-smi).
GPU_SAMPLE_BEATS = 5
# Follow frames sent ahead of the controller's credits: a controller that falls behind stops
# the follow here, and the logs wait on this host's disk, not in the controller's memory.
WINDOW = 4
# How much lower a follow runs than the tasks (yield_to_tasks).
FOLLOW_NICENESS = 10
# Errors a verb reports as its answer; anything else is a bug, reported with its type.
EXPECTED = (OSError, ValueError, KeyError, HostError, cache.CacheError, StageError,
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


def beat(channel, agent):
    """A beat every BEAT seconds; once the agent has started a task on a GPU, every
    GPU_SAMPLE_BEATS beats carry each GPU's utilisation and memory (the live view's)."""
    for count in itertools.count():
        doc = {"beat": time.time()}
        if agent.gpu_tasks and count % GPU_SAMPLE_BEATS == 0:
            doc["gpus"] = gpus.sample()
        channel.send(doc)
        time.sleep(BEAT)


class Call:
    """One request as its handler sees it: the typed request, its id, the bytes that came with
    it and the launch's environment, and what the agent keeps between requests."""

    def __init__(self, agent, id, request, body, env):
        self.agent, self.id, self.request, self.body, self.env = agent, id, request, body, env

    def send(self, doc, chunks=None):
        """A frame of this request's answer (a follow's, a mesh phase's), before its last."""
        self.agent.channel.send(dict(doc, id=self.id), chunks)


class Agent:
    """What lives between requests: the channel, the mesh probe being driven, and the
    credits of each running follow (by the follow's request id)."""

    def __init__(self, channel, keep_code=None):
        self.channel, self.follows = channel, {}
        # Writes the package's compiled code into the host's cache (boot.py); once, at the
        # first push: the checks have allowed writing there by then.
        self.keep_code = keep_code
        self.mesh_lines, self.mesh_asking = queue.Queue(), None
        self.gpu_tasks = False           # a task it started has GPUs: its beats sample them


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


def probe_host(call):
    """The probe, by this host's `inv setup` environment's interpreter where one was built for
    the requirements named (what the tasks will run: its package versions count), else by
    this one."""
    request = call.request
    env_python = envkey.env_python(request.workdir, request.requirements) \
        if request.requirements else None
    if env_python and os.access(env_python, os.X_OK):
        asked = {"workdir": request.workdir, "count": request.ports, "data": request.data_dir}
        done = subprocess.run([env_python, "-I", "-", json.dumps(asked)], input=call.body,
                              capture_output=True, timeout=120)
        if done.returncode:
            raise HostError("%s: %s" % (env_python, done.stderr.decode("utf-8", "replace")
                                        .strip().splitlines()[-1:] or done.returncode))
        answer = json.loads(done.stdout)
    else:
        answer = probe.probe(request.workdir, request.ports, request.data_dir)
    found = gpus.query()
    answer.update(gpus=found["gpus"], gpu_note=found["note"])
    return answer


def ports(call):
    return {"ports": probe.free_ports(call.request.count)}


def ports_free(call):
    return {"ports": probe.ports_free(call.request.ports)}


def mesh_listen(call):
    """The mesh probe of `inv check`, driven in phases by requests: listen (starts it), dial,
    close. Each phase's request is answered by what the probe says next."""
    agent = call.agent
    agent.mesh_asking = call.id

    def say(doc):
        agent.channel.send(dict(doc, id=agent.mesh_asking))
    spec = {f: getattr(call.request, f) for f in (
        "host", "nonce", "window", "attempt", "listen", "targets", "driven")}
    done = probe.mesh(spec, agent.mesh_lines, say)
    agent.channel.send(dict(done, id=agent.mesh_asking))


def mesh_next(call):
    call.agent.mesh_asking = call.id
    call.agent.mesh_lines.put("dial" if isinstance(call.request, MeshDialRequest) else "close")


def payload_push(call):
    """A push's stage: unpack it, then answer what the cache lacks and the room left where the
    files would go: the controller sends nothing to a host without room for what it lacks."""
    request = call.request
    riders = unpack_stage(request.rundir, call.body)
    member = (request.host, request.tasks or "") if request.host else None
    answer = pushing("payload", call, request.cache_dir, lambda: cache.want(
        request.rundir, request.cache_dir, member, riders))
    keep_code, call.agent.keep_code = call.agent.keep_code, None
    if keep_code is not None:
        keep_code()
    return dict(answer, **cache.room(request.cache_dir))


def data_push(call):
    request = call.request
    unpack_stage(request.rundir, call.body)
    answer = pushing("data", call, request.cache_dir, lambda: datatree.want(
        request.rundir, request.data_dir, request.cache_dir))
    return dict(answer, **cache.room(request.cache_dir))


def receive(call, stream):
    """The files a push lacked, read from the channel itself (they follow the request)."""
    request = call.request
    if isinstance(request, ReceiveRequest):
        return pushing("payload", call, request.cache_dir,
                       lambda: cache.receive(request.rundir, request.cache_dir, stream))
    return pushing("data", call, request.cache_dir, lambda: datatree.receive(
        request.rundir, request.data_dir, request.cache_dir, stream))


def pushing(what, call, cache_dir, work):
    """`work`'s answer; a failure in words a user acts on (a full disk names where)."""
    try:
        return work()
    except (cache.CacheError, OSError, ValueError, KeyError) as exc:
        host = getattr(call.request, "host", None)
        raise StageError(cache.failure(what, call.request.verb, exc, cache_dir,
                                       *([host] if host else []))) from None


def launch(call):
    request, env = call.request, dict(call.env)
    if request.nccl_address and "NCCL_SOCKET_IFNAME" not in env and \
            "NCCL_SOCKET_IFNAME" not in os.environ:
        # NCCL picks an interface of its own otherwise, often one the other hosts cannot
        # reach: the one that carries the cluster address is the one the tasks meet on.
        interface = gpus.interface_of(request.nccl_address)
        if interface:
            env["NCCL_SOCKET_IFNAME"] = interface
    started = tasks.launch(request.rundir, checked_task_key(request.task), request.cwd,
                           list(request.argv), request.requirements, env)
    if "CUDA_VISIBLE_DEVICES" in env:
        gpus.hold(run_id_of(request.rundir), [started["pid"]])
        call.agent.gpu_tasks = True
    return started


def gpu_place(call):
    request = call.request
    want = list(request.indices) if request.indices is not None else (
        request.count if request.count is not None else "free")
    return gpus.place(want, request.run_id, request.allow_busy, [os.getpid()])


def gpu_release(call):
    gpus.release(call.request.run_id)
    return {}


def offsets(request):
    return {checked_task_key(task): offset for task, offset in request.offsets.items()}


def poll(call):
    known = tasks.statuses(call.request.rundir, offsets(call.request))
    return {"tasks": {task: status for task, (status, _) in known.items()},
            "chunks": {task: data for task, (_, data) in known.items() if data}}


def follow(call):
    yield_to_tasks()
    follows = call.agent.follows
    credits = follows[call.id] = threading.Semaphore(WINDOW)

    def send(doc, chunks):
        credits.acquire()
        call.send(doc, chunks)
    try:
        tasks.follow(call.request.rundir, offsets(call.request), send)
    finally:
        follows.pop(call.id, None)
    return {"end": True}


def credit(call):
    # Sent for a frame the follow sent, so after it started; it may have ended since.
    credits = call.agent.follows.get(call.request.follow)
    if credits is not None:
        credits.release()


def ending(call):
    """Stop (or clean up) the run here. A host that never got the run (its push failed), or
    whose teardown is done already, has nothing to end, and says so."""
    request = call.request
    if not os.path.isdir(request.rundir):
        return {"signalled": {}, "survivors": [], "absent": True}
    if isinstance(request, StopRequest):
        return teardown.stop(request.rundir, request.grace)
    run_id = teardown.owned_run_id(request.rundir, request.run_id)
    done = teardown.cleanup(request.rundir, request.grace, request.host, request.run_id)
    if not done["survivors"]:
        gpus.release(run_id)                         # the run's GPUs are free again
    return done


def tar_out(call):
    request = call.request
    return {"body": archive.pack(request.folder,
                                 archive.Limits(request.max_bytes, request.max_members))}


def backup_out(call):
    request = call.request
    body, files = archive.pack_changed(request.folder, request.known,
                                       archive.Limits(request.max_bytes, request.max_members))
    return {"body": body, "exists": files is not None, "files": files or {}}


def tail(call):
    request = call.request
    body, offsets = archive.pack_tails(request.folder, request.sizes,
                                       archive.Limits(request.max_bytes, request.max_members))
    return {"body": body, "offsets": offsets}


def replace_backup(call):
    """Replace the run's backup/ with the tar.gz that came with the request (another host's:
    unpacked as archive.py unpacks, nothing outside backup/); only <rundir>/backup is deleted,
    inside a directory that is provably a run's. Answers what was unpacked and what was
    skipped."""
    request = call.request
    run_id_of(request.rundir)
    backup = in_run(request.rundir, BACKUP)
    shutil.rmtree(backup, ignore_errors=True)
    done = archive.unpack(io.BytesIO(call.body), backup,
                          archive.Limits(request.max_bytes, request.max_members))
    return {"files": done.files, "skipped": done.skipped, "skipped_count": done.skipped_count}


def pruning(call):
    request = call.request
    return prune.prune(request.workdir, request.host, json.loads(call.body),
                       request.older_than, dry=request.dry_run)


def env_status(call):
    """inv setup's stage unpacked (after the workdir check), then whether this host's
    environment for its requirements.txt is ready."""
    unpack_stage(call.request.rundir, call.body)
    return venv.envstatus(call.request.rundir)


def env_build(call):
    request = call.request
    return venv.setup(request.rundir, request.host, request.wheelhouse, call.send)


# Each request type's handler: it returns the answer's document, or None when it answered by
# itself (the mesh phases) or needs no answer (a credit).
HANDLERS = {
    ProbeRequest: probe_host, PortsRequest: ports, PortsFreeRequest: ports_free,
    MeshListenRequest: mesh_listen, MeshDialRequest: mesh_next, MeshCloseRequest: mesh_next,
    PushRequest: payload_push, DataPushRequest: data_push,
    LaunchRequest: launch, PollRequest: poll, FollowRequest: follow, CreditRequest: credit,
    StopRequest: ending, CleanupRequest: ending,
    TarOutRequest: tar_out, BackupOutRequest: backup_out, TailRequest: tail,
    ReplaceBackupRequest: replace_backup,
    GpuPlaceRequest: gpu_place, GpuReleaseRequest: gpu_release,
    PruneRequest: pruning,
    EnvStatusRequest: env_status, EnvBuildRequest: env_build,
}
# Requests whose files follow them on the channel: handled in the reading thread.
STREAMED = (ReceiveRequest, DataReceiveRequest)


def respond(frame, channel, work):
    """Run `work` and send its answer (or the error) under the request's id; the answer's
    "body" and "chunks" (task -> log bytes) travel as bytes (frames.py). None: the request
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
    channel.send(dict(doc, id=frame.get("id")), chunks, body)
    return "error" not in doc


def serve(stdin, stdout, keep_code=None):
    # Nothing the tool makes on a host is for other users' eyes: run dirs, logs, the cache.
    os.umask(0o077)
    channel = Channel(stdout)
    agent = Agent(channel, keep_code)
    threading.Thread(target=beat, args=(channel, agent), daemon=True).start()
    while True:
        try:
            frame = read_frame(stdin)
        except (FrameError, OSError):
            break
        if frame is None:
            break
        try:
            call = Call(agent, frame.get("id"), decode_request(frame), frame.get("body", b""),
                        dict(frame.get("env") or {}))
        except (ValueError, KeyError, TypeError) as exc:
            # A request this agent cannot read: its error, and the agent serves on. One
            # whose files would follow leaves them to be read as requests: stop reading.
            respond(frame, channel, lambda exc=exc: {"error": str(exc)})
            if frame.get("verb") in ("receive", "data-receive"):
                break
            continue
        if isinstance(call.request, STREAMED):
            # Its files follow on stdin: read here, before the next request. When they fail,
            # the rest of them would be read as requests: the agent stops reading instead
            # (the controller starts another for what follows).
            if not respond(frame, channel, lambda: receive(call, stdin)):
                break
            continue
        handler = HANDLERS[type(call.request)]
        threading.Thread(target=respond, daemon=True,
                         args=(frame, channel, lambda c=call, h=handler: h(c))).start()
    sys.stdout.flush()
    os._exit(0)
