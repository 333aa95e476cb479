"""The wire between the controller and a host's agent (deploy/host/agent.py), both ways, as
typed values: every request a record with named fields (REQUESTS, by verb), and the answer
type each one gets.

A request travels as {"verb", "fields": {name: value}, "home": [...], "env": {...}} and is
decoded on the host by its class, field by field (decode_request): a field missing, unknown or
of the wrong type is a ProtocolError naming the verb and the field, answered as the request's
error; no word of a request is read by its position. `home` names the fields (or items of a
list field, `argv.0`) that are paths on the host: a leading `~` there is the host's home.
`env` is the environment of a launch's program.

A host is untrusted input: a broken or compromised one can answer anything. Every answer is
decoded where it arrives (deploy/cluster/hostagent.py) by the answer type of the verb it answers
(ANSWERS), field by field: task states from their enum, pids, codes, offsets and sizes
integers (never booleans), times finite numbers, text where text is expected. What does not
fit is a ProtocolError naming the verb and the field, and the value shown escaped (repr), never
a wrong type found later, deep in the controller. Fields the host adds beyond these are
ignored. Standard library only: it travels with the host package.
"""
from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping

from deploy.host.records import Frozen, asdict, field, record
from deploy.host.records import fields as record_fields

# Names the annotations use. Annotations here are never evaluated (their text is read where a
# request is decoded, _parsed), and a host's agent does not import typing.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Optional, Tuple

# A task's state as its host reports it (deploy/host/tasks.py statuses).
STATES = ("pending", "running", "exited", "lost")
FINAL_STATES = ("exited", "lost")
# A task's log is read in chunks of at most this (agent.py), what one frame may carry per
# task: with the few frames a follow may send ahead (agent.py WINDOW), what a flood of logs
# holds in the controller's memory at once.
LOG_CHUNK = 1 << 18
# What a host may list of its GPUs, and of the processes on each.
MAX_GPUS = 64
MAX_GPU_PROCESSES = 256
# Characters of a value quoted in an error: enough to recognise it.
QUOTED = 80


class ProtocolError(ValueError):
    """An answer that is not what its verb answers, or a request that is not what its verb
    takes: names the verb and the field."""

    def __init__(self, verb, where, problem, what="answer"):
        super().__init__("bad %s %s %s: %s %s" % (
            what, "to" if what == "answer" else "for", verb, where or "the " + what, problem))
        self.verb, self.where = verb, where


def quoted(value):
    """A value in an error message: repr (control characters escaped), cut short."""
    text = repr(value)
    return text if len(text) <= QUOTED else text[:QUOTED - 3] + "..."


class Fields:
    """One JSON object of an answer, read field by field; `where` is its path in the answer
    (`tasks.0`), for the errors."""

    def __init__(self, doc, verb, where="", what="answer"):
        if not isinstance(doc, dict):
            raise ProtocolError(verb, where, "is not an object: %s" % quoted(doc), what)
        self.doc, self.verb, self.where, self.what = doc, verb, where, what

    def path(self, key):
        return "%s.%s" % (self.where, key) if self.where else str(key)

    def fail(self, key, problem):
        return ProtocolError(self.verb, self.path(key), problem, self.what)

    def get(self, key, check, default=None, required=True):
        if key not in self.doc or (self.doc[key] is None and not required):
            if required:
                raise self.fail(key, "is missing")
            return default
        return check(self, key, self.doc[key])

    def int(self, key, required=True, default=None):
        return self.get(key, _integer, default, required)

    def number(self, key, required=True, default=None):
        return self.get(key, _number, default, required)

    def text(self, key, required=True, default=None):
        return self.get(key, _text, default, required)

    def flag(self, key, required=True, default=False):
        return self.get(key, _flag, default, required)

    def ints(self, key, required=True):
        return tuple(self.get(key, _list_of(_integer), (), required))

    def texts(self, key, required=True):
        return tuple(self.get(key, _list_of(_text), (), required))

    def object(self, key, required=True):
        """The object in field `key` (None when it may be missing and is)."""
        value = self.get(key, lambda f, k, v: v, None, required)
        if value is None and not required:
            return None
        return Fields(value, self.verb, self.path(key))

    def items(self):
        """(key, value) of every field: for objects keyed by the host (task keys, ports)."""
        return self.doc.items()


def _integer(fields, key, value):
    if isinstance(value, bool) or not isinstance(value, int):
        raise fields.fail(key, "is not an integer: %s" % quoted(value))
    return value


def _number(fields, key, value):
    try:
        number = None if isinstance(value, bool) else float(value) \
            if isinstance(value, (int, float)) else None
    except OverflowError:        # an integer past any float
        number = None
    if number is None or not math.isfinite(number):
        raise fields.fail(key, "is not a finite number: %s" % quoted(value))
    return number


def _text(fields, key, value):
    if not isinstance(value, str):
        raise fields.fail(key, "is not text: %s" % quoted(value))
    return value


def _flag(fields, key, value):
    if not isinstance(value, bool):
        raise fields.fail(key, "is not true or false: %s" % quoted(value))
    return value


def _list_of(check):
    def checked(fields, key, value):
        if not isinstance(value, list):
            raise fields.fail(key, "is not a list: %s" % quoted(value))
        return [check(fields, "%s.%d" % (key, i), item) for i, item in enumerate(value)]
    return checked


def _text_map(fields, key):
    """An object of text keyed by text (bind errors by port)."""
    inner = fields.object(key, required=False)
    return {} if inner is None else {k: inner.text(k) for k, _ in inner.items()}


def _versions(fields, required=True):
    """Package -> version (None: not installed)."""
    inner = fields.object("versions", required=required)
    return {} if inner is None else {k: inner.text(k, required=False) for k, _ in inner.items()}


def _positive(fields, key, value):
    if value < 0:
        raise fields.fail(key, "is negative: %d" % value)
    return value


class Answer(Frozen):
    """An answer type: `decode(doc, verb)` checks a document and returns the value."""

    @classmethod
    def decode(cls, doc, verb):
        raise NotImplementedError

    def document(self):
        """The answer as a plain document again (only its fields, checked)."""
        return {k: v for k, v in asdict(self).items() if v is not None}


@record
class Done(Answer):
    """An answer that says nothing but that the verb was done (and whatever it sends is
    not looked at): a credit's, an unknown verb's."""

    @classmethod
    def decode(cls, doc, verb):
        Fields(doc, verb)
        return cls()


@record
class Beat(Answer):
    """{"beat": time}: the agent is there (every second); on a host running GPU tasks, now
    and then each GPU's [utilisation %, memory in use MiB] by index (`gpus`)."""
    time: float
    gpus: Mapping[str, Tuple[Optional[int], Optional[int]]] = field(default_factory=dict)

    @classmethod
    def decode(cls, doc, verb="beat"):
        fields = Fields(doc, verb)
        sample = fields.object("gpus", required=False)
        gpus = {}
        for index, pair in list(sample.items() if sample else ())[:MAX_GPUS]:
            values = _list_of(lambda f, k, v: None if v is None else _integer(f, k, v))(
                sample, index, pair)
            if len(values) != 2:
                raise sample.fail(index, "is not [utilisation, memory]")
            gpus[index] = tuple(values)
        return cls(fields.number("beat"), gpus)


def error_of(doc, verb):
    """The host's error message when the document is one ({"error": text}), else None. An
    error without words is still an error: it must not read as a success."""
    if not isinstance(doc, dict) or "error" not in doc:
        return None
    return Fields(doc, verb).text("error") or "an error without a message"


@record
class TaskStatus(Frozen):
    """A task as its host sees it, and its log bytes from `offset - len(data)` on."""
    state: str
    size: int
    offset: int
    pid: Optional[int] = None
    started: Optional[float] = None
    code: Optional[int] = None
    ended: Optional[float] = None
    data: bytes = b""

    @classmethod
    def decode(cls, fields):
        state = fields.text("state")
        if state not in STATES:
            raise fields.fail("state", "is not one of %s: %s" % (", ".join(STATES),
                                                                  quoted(state)))
        data = fields.doc.get("data", b"")
        size = _positive(fields, "size", fields.int("size"))
        offset = _positive(fields, "offset", fields.int("offset"))
        if len(data) > offset:
            raise fields.fail("offset", "is before the end of the log bytes it came with")
        return cls(state=state, size=size, offset=offset, data=data,
                   pid=fields.int("pid", required=False), code=fields.int("code", required=False),
                   started=fields.number("started", required=False),
                   ended=fields.number("ended", required=False))


@record
class Tasks(Answer):
    """`poll`, and each frame of a `follow`: task key -> TaskStatus; a follow's last frame
    says `end` instead."""
    tasks: Mapping[str, TaskStatus] = field(default_factory=dict)
    end: bool = False

    @classmethod
    def decode(cls, doc, verb):
        fields = Fields(doc, verb)
        if fields.flag("end", required=False):
            return cls(end=True)
        tasks = fields.object("tasks")
        return cls({key: TaskStatus.decode(Fields(status, verb, tasks.path(key)))
                    for key, status in tasks.items()})


@record
class Launched(Answer):
    pid: int
    pgid: int
    started: float

    @classmethod
    def decode(cls, doc, verb):
        fields = Fields(doc, verb)
        return cls(fields.int("pid"), fields.int("pgid"), fields.number("started"))


@record
class Stopped(Answer):
    """`stop`, `cleanup` (and inv setup's cleanup command): what was signalled (task ->
    signal names), the pids still alive after KILL, the pids of processes that had left
    their group; `absent` when the run was never there or is gone already."""
    signalled: Mapping[str, Tuple[str, ...]] = field(default_factory=dict)
    survivors: Tuple[int, ...] = ()
    escaped: Tuple[int, ...] = ()
    absent: bool = False
    removed: Optional[str] = None
    kept: Optional[str] = None

    @classmethod
    def decode(cls, doc, verb):
        fields = Fields(doc, verb)
        signalled = fields.object("signalled")
        return cls(signalled={k: signalled.texts(k) for k, _ in signalled.items()},
                   survivors=fields.ints("survivors"),
                   escaped=fields.ints("escaped", required=False),
                   absent=fields.flag("absent", required=False),
                   removed=fields.text("removed", required=False),
                   kept=fields.text("kept", required=False))


@record
class Ports(Answer):
    ports: Tuple[int, ...]

    @classmethod
    def decode(cls, doc, verb):
        fields = Fields(doc, verb)
        ports = fields.ints("ports")
        for i, port in enumerate(ports):
            if not 0 < port < 65536:
                raise fields.fail("ports.%d" % i, "is not a port: %d" % port)
        return cls(ports)


@record
class GpuProcess(Frozen):
    """A compute process on a GPU, as nvidia-smi lists it, with its user (from /proc)."""
    pid: int
    user: Optional[str]
    used_memory: Optional[int]          # MiB
    name: str

    @classmethod
    def decode(cls, fields):
        return cls(fields.int("pid"), fields.text("user", required=False),
                   fields.int("used_memory", required=False), fields.text("name"))


@record
class Gpu(Frozen):
    """One GPU of a host (deploy/host/gpus.py query): memory in MiB, utilisation in %; None
    where the board has no value ([N/A], [Not Supported])."""
    index: int
    uuid: str
    name: str
    memory_total: Optional[int]
    memory_used: Optional[int]
    utilization: Optional[int]
    processes: Tuple[GpuProcess, ...] = ()

    @classmethod
    def decode(cls, fields):
        processes = fields.get("processes", _list_of(lambda f, k, v: Fields(v, f.verb,
                                                                          f.path(k))), ())
        return cls(fields.int("index"), fields.text("uuid"), fields.text("name"),
                   fields.int("memory_total", required=False),
                   fields.int("memory_used", required=False),
                   fields.int("utilization", required=False),
                   tuple(GpuProcess.decode(p) for p in processes[:MAX_GPU_PROCESSES]))


def _gpus(fields, key="gpus"):
    found = fields.get(key, _list_of(lambda f, k, v: Fields(v, f.verb, f.path(k))), (),
                       required=False)
    return tuple(Gpu.decode(g) for g in found[:MAX_GPUS])


@record
class Probe(Answer):
    """What `inv check` learns of a host (deploy/host/probe.py probe)."""
    python: str
    executable: str
    versions: Mapping[str, Optional[str]]
    disk_path: str
    disk_free: int
    writable: bool
    ports: Tuple[int, ...]
    ipv6: bool
    workdir_problem: Optional[str] = None
    data_problem: Optional[str] = None
    externally_managed: bool = False       # PEP 668: pip install is refused for it
    gpus: Tuple[Gpu, ...] = ()
    gpu_note: Optional[str] = None         # why it has none ("nvidia-smi not found on ...")

    @classmethod
    def decode(cls, doc, verb):
        fields = Fields(doc, verb)
        return cls(python=fields.text("python"), executable=fields.text("executable"),
                   externally_managed=fields.flag("externally_managed"),
                   gpus=_gpus(fields), gpu_note=fields.text("gpu_note", required=False),
                   versions=_versions(fields),
                   disk_path=fields.text("disk_path"), disk_free=fields.int("disk_free"),
                   writable=fields.flag("writable"), ports=Ports.decode(doc, verb).ports,
                   ipv6=fields.flag("ipv6"),
                   workdir_problem=fields.text("workdir_problem", required=False),
                   data_problem=fields.text("data_problem", required=False))


@record
class MeshListening(Answer):
    """`mesh-listen`, driven by the controller: the ports listened on. A probe that is not
    driven (its spec without `driven`) answers with its result at once (MeshResult)."""
    listening: Tuple[int, ...]
    bind_errors: Mapping[str, str]

    @classmethod
    def decode(cls, doc, verb):
        fields = Fields(doc, verb)
        if "listening" not in doc and "connects" in doc:
            return MeshResult.decode(doc, verb)
        return cls(fields.ints("listening"), _text_map(fields, "bind_errors"))


@record
class MeshDialed(Answer):
    dialed: int

    @classmethod
    def decode(cls, doc, verb):
        return cls(Fields(doc, verb).int("dialed"))


@record
class Connect(Frozen):
    """One dial of the mesh probe: to `host`'s `address`:`port`, answered or why not."""
    address: str
    port: int
    host: str
    ok: bool = False
    error: Optional[str] = None
    detail: str = ""

    @classmethod
    def decode(cls, fields):
        return cls(fields.text("address"), fields.int("port"), fields.text("host"),
                   ok=fields.flag("ok", required=False), error=fields.text("error", required=False),
                   detail=fields.text("detail", required=False, default=""))


@record
class MeshResult(Answer):
    connects: Tuple[Connect, ...]
    accepted: Mapping[str, int]
    bind_errors: Mapping[str, str]

    @classmethod
    def decode(cls, doc, verb):
        fields = Fields(doc, verb)
        connects = fields.get("connects", _list_of(lambda f, k, v: v))
        accepted = fields.object("accepted")
        return cls(tuple(Connect.decode(Fields(c, verb, "connects.%d" % i))
                         for i, c in enumerate(connects)),
                   {k: accepted.int(k) for k, _ in accepted.items()},
                   _text_map(fields, "bind_errors"))


@record
class Pushed(Answer):
    """`push`, `data-push`: what the cache lacks (sha256s) and the room there; `receive`,
    `data-receive`: what came. Push bookkeeping (deploy/push) keeps these as documents."""
    missing: Tuple[str, ...] = ()
    received: Tuple[str, ...] = ()
    files: int = 0
    bytes: Optional[int] = None
    assembled: Optional[bool] = None
    present: Optional[bool] = None
    filesystem: Optional[str] = None
    disk_free: Optional[int] = None
    disk_path: Optional[str] = None

    @classmethod
    def decode(cls, doc, verb):
        fields = Fields(doc, verb)
        return cls(missing=fields.texts("missing", required=verb.endswith("push")),
                   received=fields.texts("received"), files=fields.int("files"),
                   bytes=fields.int("bytes", required=False),
                   assembled=fields.flag("assembled", required=False, default=None),
                   present=fields.flag("present", required=False, default=None),
                   filesystem=fields.text("filesystem", required=False),
                   disk_free=fields.int("disk_free", required=False),
                   disk_path=fields.text("disk_path", required=False))

    def document(self):
        doc = super().document()
        doc["missing"], doc["received"] = list(self.missing), list(self.received)
        return doc


@record
class Archived(Done):
    """`tar-out`: the folder as tar.gz, in the frame's body (on the controller: a file on
    disk, never memory; nothing when the folder does not exist)."""


@record
class BackupFiles(Answer):
    """`backup-out`: whether the backup folder exists, and its files by relative name, each
    as (size, mtime in ns); those that changed come as tar.gz in the frame's body (on the
    controller: a file on disk)."""
    exists: bool = False
    files: Mapping[str, Tuple[int, int]] = field(default_factory=dict)

    @classmethod
    def decode(cls, doc, verb):
        fields = Fields(doc, verb)
        listed, files = fields.object("files", required=False), {}
        for name, pair in (listed.items() if listed else ()):
            values = _list_of(_integer)(listed, name, pair)
            if len(values) != 2 or min(values) < 0:
                raise listed.fail(name, "is not [size, mtime_ns]: %s" % quoted(pair))
            files[_text(listed, name, name)] = tuple(values)
        return cls(fields.flag("exists", required=False), files)


@record
class GpuPlacement(Answer):
    """`gpu-place`: the GPU indices the host's tasks get, leased for the run; or why not."""
    indices: Tuple[int, ...] = ()
    problem: Optional[str] = None

    @classmethod
    def decode(cls, doc, verb):
        fields = Fields(doc, verb)
        return cls(fields.ints("indices")[:MAX_GPUS], fields.text("problem", required=False))


@record
class Tails(Answer):
    """`tail`: the new bytes of a folder's files, as tar.gz in the frame's body (a file on
    the controller), and where each piece starts in its file, by the file's relative name."""
    offsets: Mapping[str, int] = field(default_factory=dict)

    @classmethod
    def decode(cls, doc, verb):
        offsets, checked = Fields(doc, verb).object("offsets"), {}
        for name, offset in offsets.items():
            if _integer(offsets, name, offset) < 0:
                raise offsets.fail(name, "is negative: %d" % offset)
            checked[name] = offset
        return cls(checked)


@record
class Unpacked(Answer):
    """`replace-backup`: the files unpacked, and the members skipped (name, why), the first
    few of `skipped_count`."""
    files: int = 0
    skipped: Tuple[Tuple[str, str], ...] = ()
    skipped_count: int = 0

    @classmethod
    def decode(cls, doc, verb):
        fields = Fields(doc, verb)
        skipped = fields.get("skipped", _list_of(_list_of(_text)), (), required=False)
        if any(len(pair) != 2 for pair in skipped):
            raise fields.fail("skipped", "holds something else than (member, why) pairs")
        return cls(fields.int("files", required=False, default=0),
                   tuple(tuple(pair) for pair in skipped),
                   fields.int("skipped_count", required=False, default=0))


@record
class Freed(Frozen):
    count: int
    bytes: int


@record
class Pruned(Answer):
    """`prune`: what was (or would be) freed, by kind."""
    files: Freed
    envs: Freed
    runs: Freed

    @classmethod
    def decode(cls, doc, verb):
        fields = Fields(doc, verb)

        def freed(kind):
            inner = fields.object(kind)
            return Freed(_positive(inner, "count", inner.int("count")),
                         _positive(inner, "bytes", inner.int("bytes")))
        return cls(freed("files"), freed("envs"), freed("runs"))


@record
class EnvStatus(Answer):
    """inv setup's `env-status`: whether the environment exists (its versions then)."""
    ready: bool
    env: str
    python: str                          # the version of the python it is built with
    versions: Mapping[str, Optional[str]] = field(default_factory=dict)

    @classmethod
    def decode(cls, doc, verb="env-status"):
        fields = Fields(doc, verb)
        return cls(fields.flag("ready"), fields.text("env"), fields.text("python"),
                   _versions(fields, required=False))


@record
class SetupEvent(Answer):
    """One frame of inv setup's build (`env-build`): a step or a log line (`text`), or its end
    (`done`: the environment, reused or built, and its versions). A failed build is the
    request's error."""
    event: str
    text: Optional[str] = None
    reused: bool = False
    env: Optional[str] = None
    versions: Mapping[str, Optional[str]] = field(default_factory=dict)

    @property
    def end(self):
        return self.event == "done"

    @classmethod
    def decode(cls, doc, verb="env-build"):
        fields = Fields(doc, verb)
        return cls(fields.text("event"), text=fields.text("text", required=False),
                   reused=fields.flag("reused", required=False),
                   env=fields.text("env", required=False),
                   versions=_versions(fields, required=False))


# Requests. Each verb's request class, registered with the answer type it gets.

REQUESTS = {}


def _registered(verb, answer):
    def register(cls):
        cls.verb, cls.answer = verb, answer
        REQUESTS[verb] = cls
        return cls
    return register


class HostRequest(Frozen):
    """A request to a host's agent: its fields are the request; `verb` names it on the wire
    and `answer` is the type of its answer."""
    verb = ""
    answer = Done

    def fields(self):
        """The fields as they go on the wire: None left out, tuples as lists."""
        return {f.name: _plain(getattr(self, f.name)) for f in record_fields(self)
                if getattr(self, f.name) is not None}

    @classmethod
    def decode(cls, doc):
        fields = Fields(doc, cls.verb, "fields", what="request")
        checks = _checks(cls)
        for key in doc:
            if key not in checks:
                raise fields.fail(key, "is not a field of %s" % cls.verb)
        values = {}
        for name, (check, optional, required) in checks.items():
            if doc.get(name) is None:
                if required and not (optional and name in doc):
                    raise fields.fail(name, "is missing")
                continue
            values[name] = check(fields, name, doc[name])
        return cls(**values)


_CHECKS = {}


def _checks(cls):
    """A request class's fields: {name: (the check of its value, whether None is allowed,
    whether it must be given)}, made once from the fields' annotations as written."""
    if cls not in _CHECKS:
        checks = {}
        for f in record_fields(cls):
            hint, optional = _unoptional(_parsed(f.type))
            checks[f.name] = (_checker(hint), optional, f.required())
        _CHECKS[cls] = checks
    return _CHECKS[cls]


def _parsed(annotation):
    """An annotation as this module writes them (postponed: text), as (name, (arguments)):
    `Optional[Tuple[int, ...]]` is ("Optional", (("Tuple", (("int", ()), ("...", ()))),)).
    Read here rather than by typing.get_type_hints: importing typing, and evaluating every
    class's hints, would cost each host's agent a tenth of its start."""
    if not isinstance(annotation, str):
        raise TypeError("annotation %r is not text: this module postpones its annotations"
                        % (annotation,))
    tokens = re.findall(r"\.\.\.|[A-Za-z_][\w.]*|\S", annotation)[::-1]

    def node():
        name = tokens.pop() if tokens else ""
        if not re.fullmatch(r"\.\.\.|[A-Za-z_][\w.]*", name):
            raise TypeError("cannot read annotation %r" % annotation)
        args = []
        if tokens and tokens[-1] == "[":
            tokens.pop()
            while True:
                args.append(node())
                separator = tokens.pop() if tokens else None
                if separator == "]":
                    break
                if separator != ",":
                    raise TypeError("cannot read annotation %r" % annotation)
        return (name if name == "..." else name.rpartition(".")[2]), tuple(args)
    parsed = node()
    if tokens:
        raise TypeError("cannot read annotation %r" % annotation)
    return parsed


def _plain(value):
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _unoptional(hint):
    """(the hint without Optional, whether it was Optional)."""
    name, args = hint
    if name == "Optional" and len(args) == 1:
        return args[0], True
    return hint, False


def _checker(hint):
    """The check of a field's value by its type: text, integer, number, flag, a tuple (of
    one type, or of fixed types), a mapping of text to one type."""
    simple = {"str": _text, "int": _integer, "float": _number, "bool": _flag}
    name, args = hint
    if name in simple and not args:
        return simple[name]
    if name in ("Tuple", "tuple") and len(args) == 2 and args[1] == ("...", ()):
        items = _list_of(_checker(args[0]))
        return lambda f, key, value: tuple(items(f, key, value))
    if name in ("Tuple", "tuple") and args:
        checks = [_checker(a) for a in args]

        def fixed(f, key, value):
            if not isinstance(value, list) or len(value) != len(checks):
                raise f.fail(key, "is not a list of %d: %s" % (len(checks), quoted(value)))
            return tuple(check(f, "%s.%d" % (key, i), v)
                         for i, (check, v) in enumerate(zip(checks, value)))
        return fixed
    if name in ("Mapping", "Dict", "dict") and len(args) == 2 and args[0] == ("str", ()):
        check = _checker(args[1])

        def mapping(f, key, value):
            if not isinstance(value, dict):
                raise f.fail(key, "is not an object: %s" % quoted(value))
            return {_text(f, "%s.%s" % (key, k), k): check(f, "%s.%s" % (key, k), v)
                    for k, v in value.items()}
        return mapping
    raise TypeError("no check for %r" % (hint,))


def decode_request(doc):
    """A request frame's header as its typed request, its `home` paths expanded here."""
    verb = doc.get("verb")
    if verb not in REQUESTS:
        raise ValueError("unknown request %s" % quoted(verb))
    cls = REQUESTS[verb]
    fields = dict(doc.get("fields") or {})
    check = Fields(fields, verb, "fields", what="request")
    for path in doc.get("home", []):
        name, _, index = _text(check, "home", path).partition(".")
        value = fields.get(name)
        if index:
            if not isinstance(value, list) or not index.isdigit() or int(index) >= len(value):
                raise check.fail(path, "is named in home but is not an item of a list field")
            value = value[:]
            value[int(index)] = _home(value[int(index)])
            fields[name] = value
        elif isinstance(value, str):
            fields[name] = _home(value)
        else:
            raise check.fail(path, "is named in home but is not a text field")
    return cls.decode(fields)


def _home(path):
    """A path with a leading `~` or `~/` as this host's home, as a shell expands it; `~user/`
    stays as it is, as quoted."""
    if isinstance(path, str) and (path == "~" or path.startswith("~/")):
        return os.path.expanduser(path)
    return path


@_registered("probe", Probe)
@record
class ProbeRequest(HostRequest):
    """What `inv check` learns of a host; `requirements` names the `inv setup` environment
    whose python answers where it exists (deploy/host/probe.py comes as the body then)."""
    workdir: str
    ports: int
    data_dir: Optional[str] = None
    requirements: Optional[str] = None


@_registered("ports", Ports)
@record
class PortsRequest(HostRequest):
    """`count` ports free on this host now."""
    count: int


@_registered("ports-free", Ports)
@record
class PortsFreeRequest(HostRequest):
    """Which of `ports` are free on this host now (an in-place relaunch's port, before it)."""
    ports: Tuple[int, ...]


@_registered("mesh-listen", MeshListening)
@record
class MeshListenRequest(HostRequest):
    """The mesh probe's first phase (deploy/host/probe.py mesh): listen on `listen` (port ->
    callers expected), later dial `targets` ((address, port, host) each)."""
    host: str
    nonce: str
    window: float
    attempt: float
    listen: Mapping[str, int]
    targets: Tuple[Tuple[str, int, str], ...]
    driven: Optional[float] = None


@_registered("mesh-dial", MeshDialed)
@record
class MeshDialRequest(HostRequest):
    pass


@_registered("mesh-close", MeshResult)
@record
class MeshCloseRequest(HostRequest):
    pass


@record
class _Push(HostRequest):
    """The payload's push into `rundir`, by way of the host's file cache. `host` and `tasks`
    (task keys, "worker-0,worker-1"): this host's membership of the run directory, which
    hosts sharing a workdir also share."""
    rundir: str
    cache_dir: str
    host: Optional[str] = None
    tasks: Optional[str] = None


@_registered("push", Pushed)
@record
class PushRequest(_Push):
    """The stage (the body) unpacked, then what the cache lacks."""


@_registered("receive", Pushed)
@record
class ReceiveRequest(_Push):
    """The files the cache lacked, following the request on the channel."""


@record
class _DataPush(HostRequest):
    rundir: str
    data_dir: str
    cache_dir: str


@_registered("data-push", Pushed)
@record
class DataPushRequest(_DataPush):
    """The data manifest (the body) unpacked, then what the data cache lacks."""


@_registered("data-receive", Pushed)
@record
class DataReceiveRequest(_DataPush):
    """The data files the cache lacked, following the request on the channel."""


@_registered("launch", Launched)
@record
class LaunchRequest(HostRequest):
    """Start task `task` (its key) detached: `argv` in `cwd`, with the request's environment;
    by the python of the `inv setup` environment for `requirements` where it exists."""
    rundir: str
    task: str
    cwd: str
    argv: Tuple[str, ...]
    requirements: Optional[str] = None
    # The host's cluster address: NCCL_SOCKET_IFNAME becomes its interface, unless set.
    nccl_address: Optional[str] = None


@record
class _TaskLogs(HostRequest):
    """The tasks of the run in `rundir` named in `offsets`, and their logs from those bytes on
    (task key -> byte)."""
    rundir: str
    offsets: Mapping[str, int]


@_registered("poll", Tasks)
@record
class PollRequest(_TaskLogs):
    """Each task's state, and its log, now."""


@_registered("follow", Tasks)
@record
class FollowRequest(_TaskLogs):
    """A frame per change of the tasks' states or logs, until every task has ended."""


@_registered("credit", Done)
@record
class CreditRequest(HostRequest):
    """One more frame for the follow of request id `follow`."""
    follow: int


@_registered("stop", Stopped)
@record
class StopRequest(HostRequest):
    """TERM to every task, KILL after `grace` seconds."""
    rundir: str
    grace: float


@_registered("cleanup", Stopped)
@record
class CleanupRequest(HostRequest):
    """Stop, then delete the run directory once no other host sharing it (`host`: this one's
    name) still uses it. `run_id`: the run the controller holds it for (teardown.py
    owned_run_id)."""
    rundir: str
    grace: float
    host: Optional[str] = None
    run_id: Optional[str] = None


@_registered("tar-out", Archived)
@record
class TarOutRequest(HostRequest):
    """`folder` as tar.gz, refused past `max_bytes` of files or `max_members` members."""
    folder: str
    max_bytes: int
    max_members: int


@_registered("backup-out", BackupFiles)
@record
class BackupOutRequest(HostRequest):
    """The backup `folder`'s files, and as tar.gz those not as `known` lists them (name ->
    (size, mtime_ns): the controller's copy), refused past `max_bytes` of files or
    `max_members` files: only what changed since the last copy travels."""
    folder: str
    known: Mapping[str, Tuple[int, int]]
    max_bytes: int
    max_members: int


@_registered("gpu-place", GpuPlacement)
@record
class GpuPlaceRequest(HostRequest):
    """GPUs for the host's tasks, each leased for `run_id` (deploy/host/gpus.py place):
    `indices` as listed, or `count` free ones, or (neither) every free one; busy ones refused
    unless `allow_busy`."""
    run_id: str
    indices: Optional[Tuple[int, ...]] = None
    count: Optional[int] = None
    allow_busy: bool = False


@_registered("gpu-release", Done)
@record
class GpuReleaseRequest(HostRequest):
    """Let go of the run's GPU leases on this host (a run refused after some were taken)."""
    run_id: str


@_registered("tail", Tails)
@record
class TailRequest(HostRequest):
    """The bytes of each file under `folder` past its size in `sizes` (by relative name; a
    file not named there: all of it), at most `max_bytes` and `max_members` files a time."""
    folder: str
    sizes: Mapping[str, int]
    max_bytes: int
    max_members: int


@_registered("replace-backup", Unpacked)
@record
class ReplaceBackupRequest(HostRequest):
    """The run's backup/ replaced by the tar.gz that comes as the body, within the limits."""
    rundir: str
    max_bytes: int
    max_members: int


@_registered("prune", Pruned)
@record
class PruneRequest(HostRequest):
    """Free what no run needs (what to keep comes as the body, JSON), older than
    `older_than` days; with `dry_run`, only say what."""
    workdir: str
    host: str
    older_than: float
    dry_run: bool


@_registered("env-status", EnvStatus)
@record
class EnvStatusRequest(HostRequest):
    """inv setup's first step: the stage (run.json and requirements.txt, the body) unpacked
    into `rundir` after the workdir check, then whether this host's environment for those
    requirements is ready."""
    rundir: str


@_registered("env-build", SetupEvent)
@record
class EnvBuildRequest(HostRequest):
    """Build (or reuse) the environment of `rundir`'s requirements.txt, a frame per step and
    pip line; `host` names this host to hosts sharing the workdir that wait for its build;
    `wheelhouse`: install from <rundir>/wheelhouse only."""
    rundir: str
    host: str
    wheelhouse: bool = False

