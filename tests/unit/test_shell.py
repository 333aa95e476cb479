"""Quoting: hostile values reach the program literally through a real POSIX shell."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from hypothesis import given, settings, strategies as st

from deploy.inventory import parse_inventory
from deploy.planner import Options, plan_run
from deploy.shell import quote, quote_path, split_args

HOSTILE = ["a b", "it's", '"dq"', "$(touch /tmp/pwned)", "`id`", "; rm -rf ~", "line\nbreak",
           "naïve ☃", "$HOME", "*", "-n", "", "\\", "'\"'\"'"]
texts = st.text(st.characters(blacklist_characters="\0", blacklist_categories=("Cs",)))


def through_shell(command: str) -> bytes:
    return subprocess.run(["/bin/sh", "-c", command], capture_output=True, check=True).stdout


@settings(max_examples=150, deadline=None)
@given(texts)
def test_any_value_survives_a_real_shell(value):
    assert through_shell(f"printf %s {quote(value)}") == value.encode()


@pytest.mark.parametrize("value", HOSTILE)
def test_hostile_values_are_not_executed(value):
    assert through_shell(f"printf %s {quote(value)}") == value.encode()


def test_nul_is_refused():
    with pytest.raises(ValueError):
        quote("a\0b")


def test_quote_path_lets_the_host_expand_its_home():
    home = os.path.expanduser("~")
    assert through_shell(f"printf %s {quote_path('~/x y')}") == f"{home}/x y".encode()
    assert through_shell(f"printf %s {quote_path('/tmp/$(id)')}") == b"/tmp/$(id)"
    assert quote_path("~") == "~"


def test_split_args_like_a_shell_and_refuses_unbalanced_quotes():
    assert split_args("--epochs 3 --name 'a b'") == ["--epochs", "3", "--name", "a b"]
    with pytest.raises(ValueError, match="cannot split --args"):
        split_args("--name 'open")


@settings(max_examples=60, deadline=None)
@given(st.lists(texts, max_size=4))
def test_launch_arguments_arrive_literally(args):
    """The launch line's argv tail, run by a shell, gives the script exactly these args."""
    inventory = parse_inventory("hosts:\n  - {name: h, transport: local, python: /py}\n",
                                "h.yaml", environ={})
    plan = plan_run(inventory, Options(args=tuple(args)), "r1", {0: 1})
    tail = plan.tasks[0].launch.line.split(" -- ", 1)[1]
    # Replace the interpreter and script with a program that prints its argv.
    words = tail.split(" ", 2)
    rest = words[2] if len(words) > 2 else ""
    echo = f"{quote(sys.executable)} -c 'import sys, json; print(json.dumps(sys.argv[1:]))'"
    out = through_shell(f"{echo} {rest}")
    assert json.loads(out) == args
