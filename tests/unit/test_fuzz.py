"""Property-based fuzzing of every front door: generated and mutated inventories, ignore files,
flag values, run records, host answers and whatever comes on a host agent's channel each end
in success or the tool's own error (BadInput, exit 2; Failure, exit 1, for a host's answer),
never another exception.

Time-boxed: every test sets max_examples and a deadline, about 2,150 examples in all."""
from __future__ import annotations

import io
import json
import tempfile
import threading
from pathlib import Path

import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import tasks
from deploy.errors import BadInput, Failure
from deploy.host.protocol import PollRequest, Tasks
from deploy.inventory.load import load_inventory, parse_inventory
from deploy.inventory.model import Host
from deploy.plan.command import Request, split_args
from deploy.plan.planner import Options, plan_run
from deploy.push.ignore import IgnoreRules, read_ignore_file
from deploy.cluster.hostagent import HostAgent
from deploy.transport.base import CommandResult
from deploy.state.record import RunRecord, RunState, load_record

FUZZ = settings(max_examples=250, deadline=5000,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])

GOOD_INVENTORY = """\
defaults:
  workdir: ~/.tfdeploy
  env: {EPOCHS: 3}
hosts:
  - name: a
    address: 127.0.0.2
    port: 2222
    user: train
    workers: 2
  - name: b
    transport: local
    gpus: [0, 1]
    env:
      TOKEN: {value: s3cret, secret: true}
    data: {remote: /srv/data}
"""


def mutated(data: bytes, edits) -> bytes:
    """`data` with each edit applied: (position, kind, byte) -> replace, insert or delete."""
    out = bytearray(data)
    for position, kind, byte in edits:
        if not out:
            break
        i = position % len(out)
        if kind == 0:
            out[i] = byte
        elif kind == 1:
            out.insert(i, byte)
        else:
            del out[i]
    return bytes(out)


edits = st.lists(st.tuples(st.integers(0, 10 ** 6), st.integers(0, 2), st.integers(0, 255)),
                 min_size=1, max_size=8)

# Values of the kinds YAML gives, and the inventory's own field names as keys.
scalars = st.one_of(st.none(), st.booleans(), st.integers(-2 ** 40, 2 ** 40),
                    st.floats(allow_nan=True), st.text(max_size=12),
                    st.sampled_from(["local", "ssh", "all", "~/x", "/tmp", "127.0.0.1",
                                     "accept-new", "${HOME}", "${NOPE}", "a b", ".."]))
FIELDS = ["name", "address", "transport", "port", "user", "workers", "gpus", "env", "data",
          "workdir", "python", "cluster_address", "host_key_policy", "jump", "local",
          "remote", "value", "secret", "hosts", "defaults", "identity_file", "known_hosts"]
documents = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.sampled_from(FIELDS), inner, max_size=5)),
    max_leaves=20)
host_entries = st.dictionaries(st.sampled_from(FIELDS[:14]), documents, max_size=6)


def refused_or_loaded(call):
    try:
        return call()
    except BadInput:
        return None


@FUZZ
@given(st.one_of(documents, st.fixed_dictionaries({"hosts": st.lists(host_entries, max_size=3)}),
                 st.fixed_dictionaries({"defaults": host_entries,
                                        "hosts": st.lists(host_entries, min_size=1, max_size=3)})))
def test_generated_inventories_load_or_are_refused(document):
    text = yaml.safe_dump(document)
    inventory = refused_or_loaded(lambda: parse_inventory(text, "fuzz.yaml", {"HOME": "/h"}))
    if inventory is not None:
        plan_run(inventory, Options(), "20260101-000000-abcdef")


@FUZZ
@given(edits)
def test_mutated_inventory_files_load_or_are_refused(changes):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "hosts.yaml"
        path.write_bytes(mutated(GOOD_INVENTORY.encode(), changes))
        refused_or_loaded(lambda: load_inventory(path, {}))


ignore_text = st.text(st.sampled_from("ab/*?[]!^-\\#: \r\n\t.é:alpha"), max_size=40)
paths = st.text(st.sampled_from("ab/.é*[]\\ "), min_size=1, max_size=12)


@FUZZ
@given(ignore_text, st.lists(st.tuples(paths, st.booleans()), max_size=5))
def test_ignore_files_parse_or_are_refused_and_match_without_error(text, probes):
    rules = refused_or_loaded(lambda: IgnoreRules.parse(text, source="fuzz/.tfdeployignore"))
    for path, is_dir in probes if rules else ():
        assert rules.ignored(path, is_dir) in (True, False)


@FUZZ
@given(st.binary(max_size=200))
def test_ignore_file_bytes_are_read_or_refused(data):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / ".tfdeployignore"
        path.write_bytes(data)
        text = refused_or_loaded(lambda: read_ignore_file(path))
        if text is not None:
            refused_or_loaded(lambda: IgnoreRules.parse(text, source=str(path)))


flag_text = st.one_of(st.text(max_size=30), st.sampled_from(
    ["-1", "nan", "inf", "1e309", "0x10", "１２", "²", "9" * 5000, "3.5", " 7", "1_000"]))


@settings(max_examples=300, deadline=5000)
@given(flag_text)
def test_flag_values_parse_or_are_refused(text):
    seconds = refused_or_loaded(lambda: tasks.seconds("--grace", text))
    assert seconds is None or 0 <= seconds <= tasks.MAX_SECONDS
    number = refused_or_loaded(lambda: tasks.count("--restarts", text, tasks.MAX_RESTARTS))
    assert number is None or 0 <= number <= tasks.MAX_RESTARTS
    refused_or_loaded(lambda: split_args(text))


def a_record_document() -> dict:
    inventory = parse_inventory(GOOD_INVENTORY, "good.yaml", {})
    plan = plan_run(inventory, Options(entry="main.py", args=("--epochs", "5")),
                    "20260101-000000-abcdef", {0: 20000, 1: 20001, 2: 20002, 3: 20003})
    return RunRecord.of(plan, RunState.DETACHED, 1.0).document()


RECORD = a_record_document()
json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-2 ** 64, 2 ** 64), st.floats(),
              st.text(max_size=8)),
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=8)


def paths_in(doc, prefix=()):
    """Every key path of a JSON document."""
    yield prefix
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    for key, value in items:
        yield from paths_in(value, prefix + (key,))


RECORD_PATHS = list(paths_in(RECORD))[1:]


def replaced(doc, path, value):
    if not path:
        return value
    copy = dict(doc) if isinstance(doc, dict) else list(doc)
    copy[path[0]] = replaced(copy[path[0]], path[1:], value)
    return copy


def dropped(doc, path):
    copy = dict(doc) if isinstance(doc, dict) else list(doc)
    if len(path) == 1:
        del copy[path[0]]
    else:
        copy[path[0]] = dropped(copy[path[0]], path[1:])
    return copy


@FUZZ
@given(st.lists(st.tuples(st.sampled_from(RECORD_PATHS), st.booleans(), json_values),
                min_size=1, max_size=3))
def test_damaged_run_records_are_read_or_refused(changes):
    doc = RECORD
    for path, drop, value in changes:
        try:
            doc = dropped(doc, path) if drop else replaced(doc, path, value)
        except (KeyError, IndexError, TypeError):
            continue                    # an earlier change removed or replaced that path
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "record.json").write_text(json.dumps(doc))
        record = refused_or_loaded(lambda: load_record(Path(tmp)))
        if record is not None:
            refused_or_loaded(record.plan)


@settings(max_examples=100, deadline=5000)
@given(st.binary(max_size=300))
def test_record_files_of_any_bytes_are_read_or_refused(data):
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "record.json").write_bytes(data)
        refused_or_loaded(lambda: load_record(Path(tmp)))


HOST = Host(name="h1", address="127.0.0.2")
answers = st.one_of(
    st.binary(max_size=200),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.tuples(st.binary(max_size=40), json_values).map(
        lambda p: p[0] + b"\n" + json.dumps(p[1]).encode()),
    st.integers(1, 3000).map(lambda n: b"[" * n))


def test_the_record_used_for_fuzzing_reads_back():
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "record.json").write_text(json.dumps(RECORD))
        assert load_record(Path(tmp)).plan().run_id == "20260101-000000-abcdef"


class ScriptedChannel:
    """An agent's channel that, once the first request is sent, answers with `data` and ends."""

    def __init__(self, data: bytes):
        self.data, self.asked = io.BytesIO(data), threading.Event()

    def send(self, data: bytes) -> None:
        if data.startswith(b"{"):
            self.asked.set()

    def readline(self, limit: int = -1) -> bytes:
        self.asked.wait(10)
        return self.data.readline(limit)

    def read(self, size: int) -> bytes:
        return self.data.read(size)

    def outcome(self) -> CommandResult:
        return CommandResult(0, b"", b"")

    def close(self) -> None:
        pass


class Scripted:
    def __init__(self, data: bytes):
        self.data = data

    def stream(self, line: str) -> ScriptedChannel:
        return ScriptedChannel(self.data)


frames = st.one_of(
    answers,
    json_values.map(lambda v: json.dumps({"id": 1, "tasks": v}).encode() + b"\n"),
    st.tuples(json_values, st.binary(max_size=40)).map(
        lambda p: json.dumps({"id": 1, "length": p[0]}).encode() + b"\n" + p[1]),
    json_values.map(lambda v: json.dumps({"id": 1, "error": v}).encode() + b"\n"),
    json_values.map(lambda v: json.dumps({"id": v}).encode() + b"\n"))


@FUZZ
@given(frames)
@example(b'{"id":1,"error":""}\n')       # an error without words is no answer
def test_whatever_an_agent_sends_its_step_is_answered_or_fails_naming_the_host(data):
    agent = HostAgent(HOST, Scripted(data))
    try:
        doc = agent.ask(Request(PollRequest("/r", {})), "poll").wait(10)
    except Failure as exc:
        assert "h1" in str(exc)
    else:
        assert isinstance(doc, Tasks)
