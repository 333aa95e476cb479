"""Command values: each kind of word quoted as it says, through a real /bin/sh (run locally;
nothing here touches the network); secrets masked wherever a command is shown; the launch's
environment as the bytes on its stdin."""
from __future__ import annotations

import dataclasses
import json
import subprocess

import pytest
from test_shell import HOME, HOSTILE, printf_words, through_shell

from deploy.errors import BadInput
from deploy.inventory.load import parse_inventory
from deploy.inventory.model import EnvValue, Inventory
from deploy.plan.command import Command, HostPath, Shell
from deploy.plan.planner import (
    Options, cleanup_command, fetch_backup_command, plan_run, replace_backup_command
)
from deploy.plan.text import plan_document, plan_text
from deploy.ssh.session import Session
from deploy.ssh.transport import CommandResult

SECRET = "hunter2-$(id)"
ENV = {"PLAIN": EnvValue("a b"), "TOKEN": EnvValue(SECRET, secret=True)}


def test_each_kind_of_word_is_quoted_as_it_says():
    assert Command(("tar", "-C", "a b", "it's", "")).line == "tar -C 'a b' 'it'\"'\"'s' ''"
    assert Command((HostPath("~/a b"), HostPath("~"), HostPath("~/"), HostPath("/x y"),
                    HostPath("~root/x"))).line == "~/'a b' ~ ~/ '/x y' '~root/x'"
    assert Command(("true", Shell("&&"), "false", Shell("; fi"))).line == "true && false ; fi"
    # The same text is syntax only as Shell: as a value it is one literal word.
    assert Command(("printf", "%s", "&&", "~/x")).line == "printf %s '&&' '~/x'"


def test_shell_words_are_syntax_and_values_are_not():
    assert through_shell(Command(("echo", "a", Shell("&&"), "echo", "b")).line) == b"a\nb\n"
    assert through_shell(Command(("echo", "a", "&&", "echo", "b")).line) == b"a && echo b\n"


@pytest.mark.parametrize("kind", [str, HostPath])
def test_hostile_words_of_every_kind_arrive_literally(kind, tmp_path):
    canary = tmp_path / "pwned"
    values = [v.replace("/tmp/tfdeploy-pwned", str(canary)) for v in HOSTILE]
    words = [kind(v) for v in values if kind is str or not v.startswith("~")]
    assert printf_words(Command(tuple(words)).line) == [w.encode() for w in words]
    under_home = [HostPath("~/" + v) for v in values]
    assert printf_words(Command(tuple(under_home)).line) == [
        f"{HOME}/{v}".encode() for v in values]
    assert not canary.exists()


def test_a_nul_is_refused_when_the_command_is_made():
    for word in ("a\0b", HostPath("~/a\0b"), Shell("\0")):
        with pytest.raises(BadInput, match="NUL"):
            Command(("printf", word))


def test_composite_commands_work_in_a_hostile_run_dir(tmp_path):
    """The backup's fetch and replace, and the cleanup of a run that never arrived, with a
    run dir whose name a shell would expand if it were not quoted."""
    canary = tmp_path / "pwned"
    chief = tmp_path / f"chief $(touch {canary})"
    (chief / "backup").mkdir(parents=True)
    (chief / "backup" / "state").write_text("epoch 2")
    other = tmp_path / f"other `touch {canary}`; x"
    archive = through_shell(fetch_backup_command(str(chief)).line)
    subprocess.run(["/bin/sh", "-c", replace_backup_command(str(other)).line], input=archive,
                   check=True)
    assert (other / "backup" / "state").read_text() == "epoch 2"
    host = parse_inventory("hosts:\n  - {name: h, transport: local}\n", "h.yaml",
                           environ={}).hosts[0]
    answer = through_shell(cleanup_command(host, str(tmp_path / "never $(id)"), 1).line)
    assert json.loads(answer) == {"survivors": [], "absent": True}
    assert not canary.exists()


def test_secrets_are_masked_wherever_a_command_is_shown():
    command = Command(("python3", "-I", "agent.zip"), ENV, stdin="environment as JSON")
    assert command.shown() == "python3 -I agent.zip    < environment as JSON"
    assert command.shown_env() == {"PLAIN": "a b", "TOKEN": "***"}
    for shown in (command.line, command.shown(), repr(command), str(command),
                  json.dumps(command.shown_env())):
        assert SECRET not in shown
    assert "'TOKEN': '***'" in repr(command)
    assert Command(("true",)).shown() == "true"          # reads nothing: nothing after <


def test_the_environment_goes_on_stdin_as_json_with_the_real_values():
    command = Command(("agent",), ENV, stdin="environment as JSON")
    assert json.loads(command.env_stdin()) == {"env": {"PLAIN": "a b", "TOKEN": SECRET}}
    assert json.loads(command.env_stdin(TFDEPLOY_ATTEMPT="2")) == {
        "env": {"PLAIN": "a b", "TOKEN": SECRET, "TFDEPLOY_ATTEMPT": "2"}}
    assert Command(("agent",)).env_stdin() == b'{"env": {}}'


def local_plan():
    inventory = parse_inventory("hosts:\n  - {name: h, transport: local, python: /py}\n",
                                "h.yaml", environ={})
    host = dataclasses.replace(inventory.hosts[0], env=ENV)
    return plan_run(Inventory("h.yaml", (host,)), Options(args=("--x", "$(id)")), "r1", {0: 1})


class Recording:
    """A transport that keeps what it is given and answers as the agent does."""
    def __init__(self):
        self.sent: list[tuple[str, bytes]] = []

    def run(self, line, stdin=b"", timeout=None):
        self.sent.append((line, stdin))
        return CommandResult(0, b'{"started": true}\n', b"")


def test_the_session_sends_the_launch_line_and_its_environment_with_the_attempt():
    plan = local_plan()
    transport = Recording()
    Session({"h": transport}).launch(plan, attempt=2)
    ((line, stdin),) = transport.sent
    (task,) = plan.tasks
    assert line == task.launch.line and SECRET not in line
    assert json.loads(stdin)["env"] == {**{k: v.value for k, v in task.env.items()},
                                        "TFDEPLOY_ATTEMPT": "2"}


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
