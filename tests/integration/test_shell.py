"""Quoting: hostile values reach the program literally through a real POSIX shell (/bin/sh,
run locally as a subprocess; nothing here touches the network), and through the host's agent,
whose requests carry words as JSON values (deploy/host/agent.py), shown as a shell would quote
them."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hostpkg
from deploy.errors import BadInput
from deploy.host.archive import Limits
from deploy.host.protocol import LaunchRequest, Stopped, decode_request
from deploy.inventory.load import parse_inventory
from deploy.inventory.model import EnvValue, Inventory
from deploy.plan.command import Command, HostPath, Request, Shell, split_args
from deploy.plan.planner import (
    Options, cleanup_request, fetch_backup_request, plan_run, replace_backup_request
)

HOSTILE = ["a b", "it's", '"dq"', "$(touch /tmp/tfdeploy-pwned)", "`id`", "; rm -rf ~",
           "line\nbreak", "trailing\n", "\n", "naïve ☃ 日本", "$HOME", "${HOME}", "*", "?",
           "[a]", "-n", "-e", "--", "", " ", "\\", "\\n", "'\"'\"'", "a|b&c>d<e", "#comment",
           "~", "~/x", "%s%d", "\t", "\x7f\x01", "!", "{a,b}"]
# Any text a str can hold, except NUL (no argv can carry it) and lone surrogates (no bytes).
texts = st.text(st.characters(exclude_characters="\0", exclude_categories=("Cs",)))
HOME = os.path.expanduser("~")


def quoted(word: str) -> str:
    """One word as a command line writes it."""
    return Command((word,)).line


def through_shell(command: str) -> bytes:
    return subprocess.run(["/bin/sh", "-c", command], capture_output=True, check=True,
                          timeout=10).stdout


def printf_words(words: str) -> list[bytes]:
    """What `printf '%s\\0' WORDS` gives: each word the shell made, NUL-terminated."""
    out = through_shell(f"printf '%s\\0' {words}")
    assert out.endswith(b"\0")
    return out[:-1].split(b"\0")


@settings(max_examples=150, deadline=None)
@given(texts)
def test_any_value_survives_a_real_shell(value):
    assert through_shell(f"printf %s {quoted(value)}") == value.encode()


@pytest.mark.parametrize("value", HOSTILE)
def test_hostile_values_are_not_executed(value, tmp_path):
    canary = tmp_path / "pwned"
    value = value.replace("/tmp/tfdeploy-pwned", str(canary))
    assert through_shell(f"printf %s {quoted(value)}") == value.encode()
    assert not canary.exists()


@settings(max_examples=60, deadline=None)
@given(st.lists(texts, max_size=5))
def test_quoted_words_stay_separate_words(words):
    assert printf_words("x " + Command(tuple(words)).line) == [b"x"] + [
        w.encode() for w in words]


def test_nul_is_refused():
    for value in ("a\0b", "\0", "end\0"):
        with pytest.raises(BadInput, match="NUL"):
            Command((value,))
    with pytest.raises(BadInput, match="NUL"):
        Command((HostPath("~/a\0b"),))


def test_a_host_path_lets_the_host_expand_its_home():
    assert through_shell(f"printf %s {quoted(HostPath('~/x y'))}") == f"{HOME}/x y".encode()
    assert through_shell(f"printf %s {quoted(HostPath('~'))}") == HOME.encode()
    assert through_shell(f"printf %s {quoted(HostPath('~/'))}") == f"{HOME}/".encode()
    # Only a leading ~/ is the host's home; anything else is literal.
    assert through_shell(f"printf %s {quoted(HostPath('/tmp/$(id)'))}") == b"/tmp/$(id)"
    assert through_shell(f"printf %s {quoted(HostPath('/a/~/b'))}") == b"/a/~/b"
    assert through_shell(f"printf %s {quoted(HostPath('~root/x'))}") == b"~root/x"
    assert through_shell(f"printf %s {quoted(HostPath('~/~/x'))}") == f"{HOME}/~/x".encode()


def sent_argv(words) -> list[str]:
    """Words as a launch's argv, as the agent decodes them (protocol.py decode_request)."""
    wire = Request(LaunchRequest("/r", "0", "/c", tuple(words))).wire()
    return list(decode_request(json.loads(json.dumps(wire))).argv)


def test_a_host_path_in_a_request_is_expanded_by_the_agent_as_a_shell_would():
    """The agent (protocol.py decode_request) gives a HostPath word the meaning the shell
    gave it: only a leading ~/ (or ~ alone) is the host's home; every other word is
    literal."""
    words = (HostPath("~/x y"), HostPath("~"), HostPath("/tmp/$(id)"), HostPath("/a/~/b"),
             HostPath("~root/x"), HostPath("~/~/x"), "~/literal", "~")
    assert sent_argv(words) == [
        f"{HOME}/x y", HOME, "/tmp/$(id)", "/a/~/b", "~root/x", f"{HOME}/~/x", "~/literal", "~"]
    for word in words:
        assert through_shell(f"printf %s {quoted(word)}").decode() == \
            sent_argv([word])[0]


@settings(max_examples=80, deadline=None)
@given(texts)
def test_a_host_path_under_home_is_literal_after_the_tilde(rest):
    assert through_shell(f"printf %s {quoted(HostPath('~/' + rest))}") == (
        f"{HOME}/{rest}".encode())


def test_split_args_like_a_shell_and_refuses_unbalanced_quotes():
    assert split_args("--epochs 3 --name 'a b'") == ["--epochs", "3", "--name", "a b"]
    assert split_args('--x "it\'s" --y a\\ b') == ["--x", "it's", "--y", "a b"]
    assert split_args("") == [] and split_args("   ") == []
    assert split_args("--note '$(id)'") == ["--note", "$(id)"]
    for bad in ("--name 'open", '--name "open', "trailing\\"):
        with pytest.raises(BadInput, match="cannot split --args"):
            split_args(bad)


@settings(max_examples=80, deadline=None)
@given(st.lists(texts, max_size=5))
def test_split_args_undoes_the_quoting(words):
    assert split_args(Command(tuple(words)).line) == words


# ---- the planned launch command, as the host's shell sees it --------------------------------

SECRET = "s3cr3t-$(touch /tmp/tfdeploy-pwned)-`id`-'q'"


def local_plan(args, env_values):
    inventory = parse_inventory("hosts:\n  - {name: h, transport: local, python: /py}\n",
                                "h.yaml", environ={})
    (host,) = inventory.hosts
    host = dataclasses.replace(host, env={f"V{i}": EnvValue(v, secret=(i == 0))
                                          for i, v in enumerate(env_values)})
    plan = plan_run(Inventory("h.yaml", (host,)), Options(args=tuple(args)), "r1", {0: 1})
    return plan.tasks[0]


def launch_tail(task) -> str:
    """The launch's argv as --dry-run shows it (`argv=[...]`): interpreter, entry script and
    the script's args."""
    shown = task.launch.shown()
    assert shown.count(" argv=[") == 1 and shown.endswith("]")
    return shown.split(" argv=[", 1)[1][:-1]


def sent_tail(task) -> list[str]:
    """The same words as the agent receives them (after its expansion of the host's paths)."""
    return list(decode_request(json.loads(json.dumps(task.launch.wire()))).argv)


@settings(max_examples=60, deadline=None)
@given(st.lists(texts, max_size=4), st.lists(texts, max_size=3))
def test_launch_arguments_arrive_literally(args, env_values):
    task = local_plan(args, env_values)
    assert sent_tail(task) == ["/py", "train.py"] + list(args)
    words = printf_words(launch_tail(task))        # what is shown is what is sent
    assert words == [b"/py", b"train.py"] + [a.encode() for a in args]
    # Environment values are not among the words at all: they go in the request's env.
    assert task.launch.wire()["env"] == {k: v.value for k, v in task.env.items()}
    for i, value in enumerate(env_values):
        assert task.env[f"V{i}"].value == value


def test_hostile_args_and_env_in_a_planned_launch(tmp_path):
    canary = str(tmp_path / "pwned")
    args = [a.replace("/tmp/tfdeploy-pwned", canary) for a in HOSTILE]
    secret = SECRET.replace("/tmp/tfdeploy-pwned", canary)
    task = local_plan(args, [secret, "$(touch %s)" % canary, "multi\nline"])
    assert sent_tail(task) == ["/py", "train.py"] + args
    assert printf_words(launch_tail(task)) == [b"/py", b"train.py"] + [a.encode() for a in args]
    assert secret not in task.launch.shown() and "multi\nline" not in task.launch.shown()
    assert secret not in repr(task.launch)
    # The fields before argv are the agent's own and also come out as they should.
    assert task.launch.shown().startswith(
        "agent: launch rundir=~/.tfdeploy/runs/r1 task=0 cwd=~/.tfdeploy/runs/r1/payload ")
    sent = decode_request(json.loads(json.dumps(task.launch.wire())))
    rundir = f"{HOME}/.tfdeploy/runs/r1"
    assert (sent.rundir, sent.task, sent.cwd) == (rundir, "0", f"{rundir}/payload")
    assert not os.path.exists(canary)


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


def test_requests_work_in_a_hostile_run_dir(tmp_path):
    """The backup's fetch and replace, and the cleanup of a run that never arrived, with a
    run dir whose name a shell would expand if it ever reached one."""
    canary = tmp_path / "pwned"
    chief = tmp_path / f"chief $(touch {canary})"
    (chief / "backup").mkdir(parents=True)
    (chief / "backup" / "state").write_text("epoch 2")
    other = tmp_path / "runs" / f"other `touch {canary}`; x"
    other.mkdir(parents=True)
    (other / "run.json").write_text(json.dumps({"run_id": other.name}))
    host = hostpkg.local_host()
    with hostpkg.LocalAgent(host) as local:
        archive = hostpkg.fetched(local.agent, fetch_backup_request(str(chief), Limits(), {}),
                                  tmp_path)
        local.agent.ask(replace_backup_request(str(other), Limits()), "replace",
                        archive).wait(30)
        assert (other / "backup" / "state").read_text() == "epoch 2"
        answer = local.agent.ask(cleanup_request(host, str(tmp_path / "never $(id)"), 1),
                                 "cleanup").wait(30)
    assert answer == Stopped(absent=True)
    assert not canary.exists()
