"""The wire as typed values (deploy/host/protocol.py): every answer type decodes what a host
sends and refuses, naming the verb and the field, any field of the wrong type; every request
arrives on the host as it was made, its host paths at the host's home, and one with a field
wrong, missing or unknown is refused naming the verb and the field; and
the controller's reader (deploy/cluster/hostagent.py) applies them where answers arrive, with frames
bounded by the request they answer."""
from __future__ import annotations

import io
import json
import os
import threading

import pytest

from deploy.host import protocol
from deploy.host.frames import Bounds, FrameError, read_frame
from deploy.host.protocol import (
    REQUESTS, BackupFiles, BackupOutRequest, Beat, CleanupRequest, Connect, CreditRequest,
    DataPushRequest, DataReceiveRequest, EnvBuildRequest, EnvStatus, EnvStatusRequest,
    FollowRequest, Freed, GpuPlaceRequest, GpuReleaseRequest, HostRequest, LaunchRequest, Launched,
    MeshCloseRequest, MeshDialRequest, MeshDialed, MeshListenRequest, MeshListening, MeshResult,
    PollRequest, PortsFreeRequest, PortsRequest, Probe, ProbeRequest, ProtocolError, PruneRequest,
    Pruned, PushRequest, Pushed, ReceiveRequest, ReplaceBackupRequest, SetupEvent, StopRequest,
    Stopped, TailRequest, TarOutRequest, TaskStatus, Tasks, Unpacked, decode_request, error_of
)
from deploy.host.records import MISSING, fields, is_record
from deploy.inventory.model import Host
from deploy.plan.command import HostPath, Request
from deploy.cluster.hostagent import HostAgent, StepFailed
from deploy.transport.base import CommandResult

TASK = {"state": "exited", "size": 3, "offset": 3, "pid": 41, "started": 1.5, "code": 0,
        "ended": 2.5}
# A document of each answer, as the host's agent sends it, and what it decodes to.
GOOD = {
    "probe": ({"python": "3.11.2", "executable": "/usr/bin/python3",
               "versions": {"tensorflow": "2.21.0", "numpy": None}, "disk_path": "/srv",
               "disk_free": 1 << 30, "writable": True, "ports": [20001], "ipv6": False,
               "workdir_problem": None, "data_problem": "does not exist",
               "externally_managed": True},
              Probe("3.11.2", "/usr/bin/python3", {"tensorflow": "2.21.0", "numpy": None},
                    "/srv", 1 << 30, True, (20001,), False, None, "does not exist", True)),
    "ports": ({"ports": [1, 65535]}, None),
    "mesh-listen": ({"listening": [20001], "bind_errors": {"20002": "in use"}},
                    MeshListening((20001,), {"20002": "in use"})),
    "mesh-dial": ({"dialed": 3}, MeshDialed(3)),
    "mesh-close": ({"connects": [{"ok": True, "address": "10.0.0.2", "port": 1, "host": "b"},
                                 {"error": "wrong-host", "detail": "c", "address": "10.0.0.3",
                                  "port": 2, "host": "c"}],
                    "accepted": {"20001": 2}, "bind_errors": {}},
                   MeshResult((Connect("10.0.0.2", 1, "b", ok=True),
                               Connect("10.0.0.3", 2, "c", error="wrong-host", detail="c")),
                              {"20001": 2}, {})),
    "push": ({"missing": ["ab"], "received": [], "files": 2, "filesystem": "f0",
              "disk_free": 9, "disk_path": "/w"},
             Pushed(("ab",), (), 2, filesystem="f0", disk_free=9, disk_path="/w")),
    "data-receive": ({"received": ["ab"], "bytes": 5, "files": 1, "present": False},
                     Pushed((), ("ab",), 1, bytes=5, present=False)),
    "launch": ({"pid": 7, "pgid": 7, "started": 3.25}, Launched(7, 7, 3.25)),
    "poll": ({"tasks": {"0": TASK, "ps-0": {"state": "pending", "size": 0, "offset": 0}}},
             Tasks({"0": TaskStatus(**TASK), "ps-0": TaskStatus("pending", 0, 0)})),
    "follow": ({"end": True}, Tasks(end=True)),
    "stop": ({"signalled": {"0": ["SIGTERM", "SIGKILL"]}, "survivors": [], "escaped": [9]},
             Stopped({"0": ("SIGTERM", "SIGKILL")}, (), (9,))),
    "cleanup": ({"signalled": {}, "survivors": [], "absent": True}, Stopped(absent=True)),
    "replace-backup": ({"files": 2, "skipped": [["escape", "a symbolic link"]],
                        "skipped_count": 1},
                       Unpacked(2, (("escape", "a symbolic link"),), 1)),
    "backup-out": ({"exists": True, "files": {"chief/checkpoint": [75, 10 ** 18]}},
                   BackupFiles(True, {"chief/checkpoint": (75, 10 ** 18)})),
    "prune": ({kind: {"count": 1, "bytes": 10} for kind in ("files", "envs", "runs")},
              Pruned(Freed(1, 10), Freed(1, 10), Freed(1, 10))),
}


@pytest.mark.parametrize("verb", sorted(GOOD))
def test_each_answer_decodes_what_the_agent_sends(verb):
    doc, expected = GOOD[verb]
    answer = REQUESTS[verb].answer.decode(json.loads(json.dumps(doc)), verb)
    if expected is not None:
        assert answer == expected
    assert type(answer) is REQUESTS[verb].answer or verb == "mesh-listen"


def wrong(value):
    """A value of the wrong type for whatever `value` is: an object for a scalar or a list, a
    number for an object."""
    return 7 if isinstance(value, dict) else {"not": "this"}


def mutations(doc, path=()):
    """(path, document) with one field, at any depth, of the wrong type."""
    items = doc.items() if isinstance(doc, dict) else enumerate(doc)
    for key, value in items:
        changed = json.loads(json.dumps(doc))
        changed[key] = wrong(value)
        yield path + (str(key),), changed
        if isinstance(value, (dict, list)) and value:
            for inner, sub in mutations(value, path + (str(key),)):
                whole = json.loads(json.dumps(doc))
                whole[key] = sub
                yield inner, whole


@pytest.mark.parametrize("verb", sorted(GOOD))
def test_any_field_of_the_wrong_type_is_refused_naming_the_verb_and_the_field(verb):
    doc, _ = GOOD[verb]
    for path, changed in mutations(doc):
        if verb == "follow" and path == ("end",):
            continue     # an `end` that is not true is a frame without tasks: refused below
        with pytest.raises(ProtocolError) as refused:
            REQUESTS[verb].answer.decode(changed, verb)
        message = str(refused.value)
        assert message.startswith(f"bad answer to {verb}: "), message
        assert ".".join(path[:2]) in message or path[0] in message, (path, message)


@pytest.mark.parametrize("field, value, words", [
    ("state", "sleeping", "tasks.0.state is not one of pending, running, exited, lost"),
    ("state", "\x1b]52;c;aGk=\x1b\\", r"'\x1b]52;c;aGk=\x1b\\'"),   # shown escaped
    ("pid", True, "tasks.0.pid is not an integer: True"),           # a bool is not a number
    ("code", 1.5, "tasks.0.code is not an integer"),
    ("started", "x", "tasks.0.started is not a finite number: 'x'"),
    ("ended", float("nan"), "tasks.0.ended is not a finite number: nan"),
    ("ended", 10 ** 400, "tasks.0.ended is not a finite number: 1000"),
    ("size", None, "tasks.0.size is not an integer: None"),
    ("size", -1, "tasks.0.size is negative"),
    ("offset", 2, "tasks.0.offset is before the end of the log bytes"),
])
def test_task_statuses_are_checked_field_by_field(field, value, words):
    status = {**TASK, field: value, "data": b"abc"}
    with pytest.raises(ProtocolError) as refused:
        Tasks.decode({"tasks": {"0": status}}, "poll")
    assert words in str(refused.value)


def test_an_object_that_is_null_or_missing_is_refused():
    for doc in ({"tasks": None}, {}, {"tasks": {"0": None}}, {"tasks": []}):
        with pytest.raises(ProtocolError, match="bad answer to poll: tasks"):
            Tasks.decode(doc, "poll")
    with pytest.raises(ProtocolError, match="bad answer to stop: signalled is not an object"):
        Stopped.decode({"signalled": None, "survivors": []}, "stop")


def test_beats_errors_and_setup_lines_are_checked_too():
    assert Beat.decode({"beat": 1.0}) == Beat(1.0)
    with pytest.raises(ProtocolError, match="beat is not a finite number"):
        Beat.decode({"beat": "soon"})
    assert error_of({"error": "no space"}, "push") == "no space"
    assert error_of({"ok": 1}, "push") is None
    with pytest.raises(ProtocolError, match="bad answer to push: error is not text"):
        error_of({"error": ["x"]}, "push")
    assert EnvStatus.decode({"ready": False, "env": "/e", "python": "3.8.18"}) == \
        EnvStatus(False, "/e", "3.8.18")
    done = SetupEvent.decode({"event": "done", "reused": True, "env": "/e",
                              "versions": {"numpy": "2"}})
    assert done == SetupEvent("done", reused=True, env="/e", versions={"numpy": "2"})
    assert done.end and not SetupEvent("log", text="Collecting numpy").end
    with pytest.raises(ProtocolError, match=r"text is not text: \['\\x1b\[2J'\]"):
        SetupEvent.decode({"event": "step", "text": ["\x1b[2J"]})


# --- the reader -------------------------------------------------------------------------------

HOST = Host(name="h1", address="127.0.0.2")


class Channel:
    """An agent's channel that answers each request with the next of `scripts` (bytes with
    {id} for the request's id), then waits, as an idle agent does."""

    def __init__(self, scripts: list[bytes]):
        self.scripts, self.buffer, self.more = list(scripts), io.BytesIO(), threading.Condition()
        self.closed = False
        self.read_sizes: list[int] = []

    def send(self, data: bytes) -> None:
        if data.startswith(b"{") and self.scripts:
            number = json.loads(data)["id"]
            with self.more:
                rest = self.buffer.read()
                self.buffer = io.BytesIO(rest + self.scripts.pop(0).replace(
                    b"{id}", str(number).encode()))
                self.more.notify_all()

    def readline(self, limit: int = -1) -> bytes:
        with self.more:
            while True:
                line = self.buffer.readline(limit)
                if line or self.closed:
                    return line
                self.more.wait(0.1)

    def read(self, size: int) -> bytes:
        self.read_sizes.append(size)
        with self.more:
            return self.buffer.read(size)

    def outcome(self) -> CommandResult:
        return CommandResult(0, b"", b"")

    def close(self) -> None:
        with self.more:
            self.closed = True
            self.more.notify_all()


class Scripted:
    def __init__(self, channel: Channel):
        self.channel = channel

    def stream(self, line: str) -> Channel:
        return self.channel


def frame(doc: dict, body: bytes = b"") -> bytes:
    return json.dumps(doc).replace('"ID"', "{id}").encode() + b"\n" + body


POLL = Request(PollRequest("/r", {"0": 0}))


def test_a_badly_typed_answer_fails_its_step_naming_host_and_field_and_the_channel_goes_on():
    channel = Channel([frame({"id": "ID", "tasks": {"0": {**TASK, "started": "x"}}}),
                       frame({"id": "ID", "ports": [5]})])
    agent = HostAgent(HOST, Scripted(channel))
    try:
        with pytest.raises(StepFailed) as failed:
            agent.ask(POLL, "poll").wait(10)
        assert str(failed.value) == ("h1 (127.0.0.2): poll failed: bad answer to poll: "
                                     "tasks.0.started is not a finite number: 'x'")
        assert agent.ask(Request(PortsRequest(1)), "ports").wait(10).ports == (5,)
    finally:
        agent.close()


@pytest.mark.parametrize("script, words", [
    # A task that was not asked about: refused before its bytes are read.
    (frame({"id": "ID", "tasks": {"9": {**TASK, "length": 3}}}, b"abc"),
     "a frame about task '9', which was not asked about"),
    # More log bytes than a chunk holds.
    (frame({"id": "ID", "tasks": {"0": {**TASK, "length": (1 << 18) + 1}}}),
     "log bytes of 262145 bytes, more than the 262144 allowed"),
    # A beat, or an answer that has none, with a body: a gigabyte announced, none read.
    (frame({"beat": 1.0, "length": 1 << 30}), "a body of 1073741824 bytes, more than the 0"),
    (frame({"id": "ID", "tasks": {}, "length": 1 << 30}), "a body of 1073741824 bytes"),
    (frame({"beat": "x"}), "bad answer to beat: beat is not a finite number"),
])
def test_a_frame_past_its_bounds_is_refused_before_its_bytes_are_read(script, words):
    channel = Channel([script])
    agent = HostAgent(HOST, Scripted(channel))
    try:
        with pytest.raises(StepFailed) as failed:
            agent.ask(POLL, "poll").wait(10)
        assert words in str(failed.value) and str(failed.value).startswith("h1 (127.0.0.2): ")
        assert all(size <= 1 << 18 for size in channel.read_sizes)
        assert channel.closed            # nothing more is read from a host that did that
    finally:
        agent.close()


class Sink:
    def __init__(self, limit: int):
        self.limit, self.pieces, self.length = limit, [], None

    def begin(self, length: int) -> None:
        self.length = length

    def write(self, piece: bytes) -> None:
        self.pieces.append(piece)


def test_an_archive_body_goes_to_its_file_in_pieces_never_whole():
    body = bytes(range(256)) * 20_000                  # 5 MB
    stream = io.BytesIO(frame({"id": 3}, b"").replace(b"}", b', "length": %d}' % len(body))
                        + body)
    sink = Sink(10 << 20)
    doc = read_frame(stream, lambda doc: Bounds(body=sink.limit, into=sink))
    assert doc == {"id": 3, "body": b""}
    assert sink.length == len(body) and b"".join(sink.pieces) == body
    assert max(len(p) for p in sink.pieces) <= 1 << 20
    with pytest.raises(FrameError, match="more than the 1048576 allowed"):
        read_frame(io.BytesIO(b'{"id": 3, "length": 1048577}\n'),
                   lambda doc: Bounds(body=1 << 20, into=Sink(1 << 20)))


# -- requests -------------------------------------------------------------------------------

# One request of each verb, as the planner makes them (paths on the host are HostPaths).
SAMPLES = [
    ProbeRequest(HostPath("~/w"), 3, HostPath("~/data"), "e" * 64),
    PortsRequest(2), PortsFreeRequest((20001, 20002)),
    MeshListenRequest("a", "n0", 2.0, 0.5, {"20001": 2}, (("10.0.0.2", 20002, "b"),), 30.0),
    MeshDialRequest(), MeshCloseRequest(),
    PushRequest(HostPath("~/w/runs/r1"), HostPath("~/w/cache"), "a", "0,1"),
    ReceiveRequest(HostPath("/w/runs/r1"), "/w/cache"),
    DataPushRequest(HostPath("~/w/runs/r1"), HostPath("~/w/data/x"), HostPath("~/w/cache")),
    DataReceiveRequest("/w/runs/r1", "/w/data/x", "/w/cache"),
    LaunchRequest(HostPath("~/w/runs/r1"), "ps-0", HostPath("~/w/runs/r1/payload"),
                  (HostPath("~/py"), "train.py", "~/literal", "$(id)"), "e" * 64),
    PollRequest("/w/runs/r1", {"0": 10, "ps-0": 0}),
    FollowRequest(HostPath("~/w/runs/r1"), {}),
    CreditRequest(7),
    StopRequest("/w/runs/r1", 2.5), CleanupRequest("/w/runs/r1", 1.0, "a"),
    TarOutRequest("/w/runs/r1/output", 1 << 30, 10000),
    BackupOutRequest(HostPath("~/w/runs/r1/backup"), {"chief/checkpoint": (75, 10 ** 18)},
                     1 << 30, 10000),
    TailRequest(HostPath("~/w/runs/r1/output/tensorboard"), {"train/events.1": 10}, 1 << 26, 100),
    GpuPlaceRequest("20261204-1-a", (0, 2), allow_busy=True), GpuReleaseRequest("20261204-1-a"),
    ReplaceBackupRequest("/w/runs/r1", 1 << 30, 10000),
    PruneRequest(HostPath("~/w"), "a", 7.0, True),
    EnvStatusRequest(HostPath("~/w/runs/setup-1-a")),
    EnvBuildRequest(HostPath("~/w/runs/setup-1-a"), "a", True),
]


def on_the_wire(request: HostRequest) -> dict:
    return json.loads(json.dumps(Request(request).wire()))


def at_home(value):
    """A request's value as the host reads it: a HostPath's leading ~/ is the host's home."""
    if isinstance(value, tuple):
        return tuple(at_home(v) for v in value)
    if isinstance(value, HostPath) and value.startswith("~/"):
        return os.path.expanduser(value)
    return value


def test_every_verb_has_a_request_type_and_one_sample():
    assert len(REQUESTS) >= 8
    assert sorted(type(r).verb for r in SAMPLES) == sorted(REQUESTS)
    assert all(is_record(cls) for cls in REQUESTS.values())


@pytest.mark.parametrize("request_", SAMPLES, ids=lambda r: r.verb)
def test_a_request_arrives_as_it_was_made_its_host_paths_at_the_hosts_home(request_):
    got = decode_request(on_the_wire(request_))
    assert type(got) is type(request_)
    assert got == type(request_)(**{f.name: at_home(getattr(request_, f.name))
                                    for f in fields(request_)})
    if isinstance(request_, LaunchRequest):         # only the words that are paths
        assert got.argv[2:] == ("~/literal", "$(id)")


def request_mutations():
    """(verb, field, wire document) with one field of the wrong type, one missing, one too
    many."""
    for request_ in SAMPLES:
        doc = on_the_wire(request_)
        for name, value in doc["fields"].items():
            changed = json.loads(json.dumps(doc))
            changed["fields"][name] = 7 if isinstance(value, (str, list, dict)) else "seven"
            yield request_.verb, name, changed
            required = [f for f in fields(request_) if f.name == name and f.default is MISSING]
            if required:
                del changed["fields"][name]
                yield request_.verb, name, changed
        extra = json.loads(json.dumps(doc))
        extra["fields"]["surplus"] = 1
        yield request_.verb, "surplus", extra


@pytest.mark.parametrize("verb, name, doc", list(request_mutations()),
                         ids=lambda v: v if isinstance(v, str) else "")
def test_a_request_with_a_field_wrong_missing_or_unknown_is_refused_naming_verb_and_field(
        verb, name, doc):
    with pytest.raises(ProtocolError, match=f"^bad request for {verb}: fields.{name}"):
        decode_request(doc)


def test_an_unknown_verb_or_a_bad_home_is_refused():
    with pytest.raises(ValueError, match="unknown request 'explode'"):
        decode_request({"verb": "explode", "fields": {}})
    doc = on_the_wire(PortsRequest(2))
    doc["home"] = ["count"]                       # not text: no home to expand
    with pytest.raises(ProtocolError, match="fields.count is named in home"):
        decode_request(doc)
    doc = on_the_wire(LaunchRequest("/r", "0", "/c", ("a",)))
    doc["home"] = ["argv.5"]
    with pytest.raises(ProtocolError, match="fields.argv.5 is named in home"):
        decode_request(doc)


def test_every_request_has_one_handler_on_the_host():
    """The agent dispatches by the request's type (deploy/host/agent.py HANDLERS), never by
    the position of a word."""
    from deploy.host.agent import HANDLERS, STREAMED
    assert set(HANDLERS) | set(STREAMED) == set(REQUESTS.values())
    assert not set(HANDLERS) & set(STREAMED)


@pytest.mark.parametrize("annotation, parsed", [
    ("int", ("int", ())),
    ("typing.Optional[str]", ("Optional", (("str", ()),))),
    ("Optional[Tuple[int, ...]]", ("Optional", (("Tuple", (("int", ()), ("...", ()))),))),
    ("Mapping[str, Tuple[int, int]]",
     ("Mapping", (("str", ()), ("Tuple", (("int", ()), ("int", ())))))),
])
def test_a_requests_annotation_is_read_from_its_text(annotation, parsed):
    assert protocol._parsed(annotation) == parsed


@pytest.mark.parametrize("annotation", ["Tuple[int", "Tuple[int]]", "Tuple[]", "Tuple[int;]",
                                        "List[int]", "Mapping[int, str]", "Optional[]"])
def test_an_annotation_without_a_check_is_refused(annotation):
    with pytest.raises(TypeError, match="cannot read annotation|no check for"):
        protocol._checker(protocol._unoptional(protocol._parsed(annotation))[0])
