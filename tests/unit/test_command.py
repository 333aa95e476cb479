"""Command and Request values: each kind of word quoted as it says (through a real /bin/sh in
tests/integration/test_shell.py); secrets masked wherever a command or request is shown; the
launch's environment only in the request as it goes on the wire."""
from __future__ import annotations

import dataclasses
import json
import queue

import pytest

from deploy.errors import BadInput
from deploy.host.protocol import LaunchRequest, MeshDialRequest
from deploy.inventory.load import parse_inventory
from deploy.inventory.model import EnvValue, Inventory
from deploy.plan.command import Command, HostPath, Request, Shell
from deploy.plan.planner import Options, agent_command, plan_run
from deploy.plan.text import plan_document, plan_text
from deploy.cluster.hostagent import HostAgent
from deploy.cluster.session import Session
from deploy.transport.base import CommandResult

SECRET = "hunter2-$(id)"
ENV = {"PLAIN": EnvValue("a b"), "TOKEN": EnvValue(SECRET, secret=True)}


def test_each_kind_of_word_is_quoted_as_it_says():
    assert Command(("tar", "-C", "a b", "it's", "")).line == "tar -C 'a b' 'it'\"'\"'s' ''"
    assert Command((HostPath("~/a b"), HostPath("~"), HostPath("~/"), HostPath("/x y"),
                    HostPath("~root/x"))).line == "~/'a b' ~ ~/ '/x y' '~root/x'"
    assert Command(("true", Shell("&&"), "false", Shell("; fi"))).line == "true && false ; fi"
    # The same text is syntax only as Shell: as a value it is one literal word.
    assert Command(("printf", "%s", "&&", "~/x")).line == "printf %s '&&' '~/x'"


def test_a_nul_is_refused_when_the_command_is_made():
    for word in ("a\0b", HostPath("~/a\0b"), Shell("\0")):
        with pytest.raises(BadInput, match="NUL"):
            Command(("printf", word))


def test_a_command_shows_what_it_reads():
    assert Command(("python3", "-I", "-c", "x"), stdin="a zip").shown() == \
        "python3 -I -c x    < a zip"
    assert Command(("true",)).shown() == "true"          # reads nothing: nothing after <


def test_secrets_are_masked_wherever_a_request_is_shown():
    request = Request(LaunchRequest(HostPath("~/runs/r1"), "0", "$(id)", ("a b",)), ENV,
                      body="nothing")
    assert request.shown() == \
        "agent: launch rundir=~/runs/r1 task=0 cwd='$(id)' argv=['a b']    < nothing"
    assert request.shown_env() == {"PLAIN": "a b", "TOKEN": "***"}
    for shown in (request.shown(), repr(request), str(request),
                  json.dumps(request.shown_env())):
        assert SECRET not in shown
    assert "'TOKEN': '***'" in repr(request)
    assert Request(MeshDialRequest()).shown() == "agent: mesh-dial"    # nothing comes with it


def test_the_environment_goes_on_the_wire_with_the_real_values():
    request = Request(LaunchRequest(HostPath("~/r"), "0", "~/literal", (HostPath("~/py"), "~/x")),
                      ENV)
    assert request.wire() == {
        "verb": "launch", "fields": {"rundir": "~/r", "task": "0", "cwd": "~/literal",
                                     "argv": ["~/py", "~/x"]},
        "home": ["rundir", "argv.0"], "env": {"PLAIN": "a b", "TOKEN": SECRET}}
    assert request.wire(TFDEPLOY_ATTEMPT="2")["env"] == {
        "PLAIN": "a b", "TOKEN": SECRET, "TFDEPLOY_ATTEMPT": "2"}
    assert Request(MeshDialRequest()).wire() == {"verb": "mesh-dial", "fields": {}, "home": []}
    assert json.loads(json.dumps(request.wire())) == request.wire()     # JSON as it is


def local_plan():
    inventory = parse_inventory("hosts:\n  - {name: h, transport: local, python: /py}\n",
                                "h.yaml", environ={})
    host = dataclasses.replace(inventory.hosts[0], env=ENV)
    return plan_run(Inventory("h.yaml", (host,)), Options(args=("--x", "$(id)")), "r1", {0: 1})


class RecordingStream:
    """An agent's channel that keeps what it is sent and answers every request as an agent
    does (a frame with the request's id)."""

    def __init__(self):
        self.sent: list[bytes] = []
        self.answers: queue.Queue[bytes] = queue.Queue()

    def send(self, data: bytes) -> None:
        self.sent.append(bytes(data))
        if data.startswith(b"{"):
            self.answers.put(json.dumps({"id": json.loads(data)["id"], "pid": 1, "pgid": 1,
                                         "started": 1.0}).encode() + b"\n")

    def readline(self, limit: int = -1) -> bytes:
        return self.answers.get()

    def read(self, size: int) -> bytes:
        return b""

    def outcome(self) -> CommandResult:
        return CommandResult(0, b"", b"")

    def close(self) -> None:
        self.answers.put(b"")


class Recording:
    """A transport that keeps the command lines it is given; each starts a RecordingStream."""

    def __init__(self):
        self.lines: list[str] = []
        self.streams: list[RecordingStream] = []

    def stream(self, line: str) -> RecordingStream:
        self.lines.append(line)
        self.streams.append(RecordingStream())
        return self.streams[-1]

    def close(self) -> None:
        pass


def test_the_session_sends_the_launch_request_and_its_environment_with_the_attempt():
    plan = local_plan()
    (hp,) = plan.hosts
    transport = Recording()
    session = Session({"h": transport}, {"h": HostAgent(hp.host, transport)})
    try:
        session.launch(plan, attempt=2)
    finally:
        session.close()
    (line,) = transport.lines
    (stream,) = transport.streams
    assert line == agent_command(hp.host).line and SECRET not in line
    boot, header = stream.sent
    assert not boot.startswith(b"{")             # the agent's boot and package come first
    (task,) = plan.tasks
    sent = json.loads(header)
    assert sent["verb"] == "launch" and sent["fields"] == task.launch.message.fields()
    assert sent["env"] == {**{k: v.value for k, v in task.env.items()}, "TFDEPLOY_ATTEMPT": "2"}


def test_the_dry_run_prints_each_command_as_shown():
    plan = local_plan()
    (hp,) = plan.hosts
    (task,) = hp.tasks
    text = plan_text(plan)
    for command in (hp.push, hp.ports, task.launch):
        assert command.shown() in text
    assert "    env TOKEN=***" in text and SECRET not in text
    document = plan_document(plan)
    assert document["hosts"][0]["tasks"][0]["launch"] == task.launch.shown()
    assert document["hosts"][0]["tasks"][0]["env"]["TOKEN"] == "***"
    assert SECRET not in json.dumps(document)
