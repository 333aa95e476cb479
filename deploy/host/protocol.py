"""The agent's answers (deploy/host/agent.py) as typed values.

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
from dataclasses import asdict, dataclass, field
from typing import Mapping, Optional, Tuple

# A task's state as its host reports it (deploy/host/tasks.py statuses).
STATES = ("pending", "running", "exited", "lost")
FINAL_STATES = ("exited", "lost")
# A task's log is read in chunks of at most this (agent.py), what one frame may carry per
# task: with the few frames a follow may send ahead (agent.py WINDOW), what a flood of logs
# holds in the controller's memory at once.
LOG_CHUNK = 1 << 18
# Characters of a value quoted in an error: enough to recognise it.
QUOTED = 80


class ProtocolError(ValueError):
    """An answer that is not what its verb answers: names the verb and the field."""

    def __init__(self, verb, where, problem):
        super().__init__("bad answer to %s: %s %s" % (verb, where or "the answer", problem))
        self.verb, self.where = verb, where


def quoted(value):
    """A value in an error message: repr (control characters escaped), cut short."""
    text = repr(value)
    return text if len(text) <= QUOTED else text[:QUOTED - 3] + "..."


class Fields:
    """One JSON object of an answer, read field by field; `where` is its path in the answer
    (`tasks.0`), for the errors."""

    def __init__(self, doc, verb, where=""):
        if not isinstance(doc, dict):
            raise ProtocolError(verb, where, "is not an object: %s" % quoted(doc))
        self.doc, self.verb, self.where = doc, verb, where

    def path(self, key):
        return "%s.%s" % (self.where, key) if self.where else str(key)

    def fail(self, key, problem):
        return ProtocolError(self.verb, self.path(key), problem)

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


class Answer:
    """An answer type: `decode(doc, verb)` checks a document and returns the value."""

    @classmethod
    def decode(cls, doc, verb):
        raise NotImplementedError

    def document(self):
        """The answer as a plain document again (only its fields, checked)."""
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass(frozen=True)
class Done(Answer):
    """An answer that says nothing but that the verb was done (and whatever it sends is
    not looked at): a credit's, an unknown verb's."""

    @classmethod
    def decode(cls, doc, verb):
        Fields(doc, verb)
        return cls()


@dataclass(frozen=True)
class Beat(Answer):
    """{"beat": time}: the agent is there (every second)."""
    time: float

    @classmethod
    def decode(cls, doc, verb="beat"):
        return cls(Fields(doc, verb).number("beat"))


def error_of(doc, verb):
    """The host's error message when the document is one ({"error": text}), else None. An
    error without words is still an error: it must not read as a success."""
    if not isinstance(doc, dict) or "error" not in doc:
        return None
    return Fields(doc, verb).text("error") or "an error without a message"


@dataclass(frozen=True)
class TaskStatus:
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


@dataclass(frozen=True)
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


@dataclass(frozen=True)
class Launched(Answer):
    pid: int
    pgid: int
    started: float

    @classmethod
    def decode(cls, doc, verb):
        fields = Fields(doc, verb)
        return cls(fields.int("pid"), fields.int("pgid"), fields.number("started"))


@dataclass(frozen=True)
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


@dataclass(frozen=True)
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


@dataclass(frozen=True)
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

    @classmethod
    def decode(cls, doc, verb):
        fields = Fields(doc, verb)
        return cls(python=fields.text("python"), executable=fields.text("executable"),
                   versions=_versions(fields),
                   disk_path=fields.text("disk_path"), disk_free=fields.int("disk_free"),
                   writable=fields.flag("writable"), ports=Ports.decode(doc, verb).ports,
                   ipv6=fields.flag("ipv6"),
                   workdir_problem=fields.text("workdir_problem", required=False),
                   data_problem=fields.text("data_problem", required=False))


@dataclass(frozen=True)
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


@dataclass(frozen=True)
class MeshDialed(Answer):
    dialed: int

    @classmethod
    def decode(cls, doc, verb):
        return cls(Fields(doc, verb).int("dialed"))


@dataclass(frozen=True)
class Connect:
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


@dataclass(frozen=True)
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


@dataclass(frozen=True)
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


@dataclass(frozen=True)
class Archived(Done):
    """`tar-out`: the folder as tar.gz, in the frame's body (on the controller: a file on
    disk, never memory; nothing when the folder does not exist)."""


@dataclass(frozen=True)
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


@dataclass(frozen=True)
class Freed:
    count: int
    bytes: int


@dataclass(frozen=True)
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


@dataclass(frozen=True)
class EnvStatus(Answer):
    """inv setup's `envstatus`: whether the environment exists (its versions then)."""
    ready: bool
    env: str
    versions: Mapping[str, Optional[str]] = field(default_factory=dict)

    @classmethod
    def decode(cls, doc, verb="envstatus"):
        fields = Fields(doc, verb)
        return cls(fields.flag("ready"), fields.text("env"), _versions(fields, required=False))


@dataclass(frozen=True)
class SetupEvent(Answer):
    """One line of inv setup's build: a step or a log line (`text`), its end (`done`: the
    environment, reused or built, and its versions) or its failure (`error`: `message`)."""
    event: str
    text: Optional[str] = None
    message: Optional[str] = None
    reused: bool = False
    env: Optional[str] = None
    versions: Mapping[str, Optional[str]] = field(default_factory=dict)

    @classmethod
    def decode(cls, doc, verb="setup"):
        fields = Fields(doc, verb)
        return cls(fields.text("event"), text=fields.text("text", required=False),
                   message=fields.text("message", required=False),
                   reused=fields.flag("reused", required=False),
                   env=fields.text("env", required=False),
                   versions=_versions(fields, required=False))


# The answer type of each verb of the agent (deploy/host/agent.py answer()).
ANSWERS = {
    "probe": Probe, "ports": Ports,
    "mesh-listen": MeshListening, "mesh-dial": MeshDialed, "mesh-close": MeshResult,
    "push": Pushed, "data-push": Pushed, "receive": Pushed, "data-receive": Pushed,
    "launch": Launched, "poll": Tasks, "follow": Tasks,
    "stop": Stopped, "cleanup": Stopped,
    "tar-out": Archived, "replace-backup": Unpacked, "prune": Pruned,
}


def answer_type(verb):
    return ANSWERS.get(verb, Done)
