"""Hostile values through a REAL remote shell: hypothesis-generated env values, `--args` and
workdir names go over SSH to a lab host (one connection for every example), through the
planner's launch request and the host's agent, into a tiny entry that prints its argv and env
as JSON. They must arrive literally and never be executed."""
from __future__ import annotations

import dataclasses
import json
import os
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from rich.console import Console

from deploy.inventory.load import load_inventory, workdir_problem
from deploy.inventory.model import EnvValue, Inventory
from deploy.plan.planner import Options, plan_run
from deploy.push.payload import PayloadPush
from deploy.cluster.session import Session
from deploy.state.record import new_run_id


CANARY = Path(tempfile.gettempdir()) / f"tfdeploy-quoting-canary-{os.getpid()}"
DUMP = ("import json, os, sys\n"
        "print(json.dumps({'argv': sys.argv[1:], 'cwd': os.getcwd(),\n"
        "                  'env': {k: v for k, v in os.environ.items() if k.startswith('WEIRD')}}))\n")
# Any text but NUL (no argv or environment can carry it) and lone surrogates (no bytes).
texts = st.text(st.characters(exclude_characters="\0", exclude_categories=("Cs",)), max_size=40)
dir_names = st.text(st.characters(exclude_characters="\0/\n", exclude_categories=("Cs",)),
                    min_size=1, max_size=20).filter(lambda s: s not in (".", ".."))
HOSTILE = [f"$(touch {CANARY})", f"`touch {CANARY}`", f"; touch {CANARY}", "a b", "it's",
           '"dq"', "line\nbreak", "naïve ☃ 日本", "$HOME", "*", "-n", "", "\\", "#x"]


@pytest.fixture(scope="module")
def remote(ssh_lab, tmp_path_factory):
    """One lab host, one SSH connection for every example, and a payload that dumps."""
    base = tmp_path_factory.mktemp("quoting")
    payload = base / "payload"
    payload.mkdir()
    (payload / "dump.py").write_text(DUMP)
    lab_host = ssh_lab.hosts[0]
    (host,) = load_inventory(ssh_lab.write_inventory(base / "hosts.yaml", [lab_host])).hosts
    session, errors = Session.open_each([host], 10, False)
    try:
        assert not errors, errors
        yield session, host, payload
    finally:
        session.close()


def run_remotely(session: Session, host, payload: Path, args, env, workdir: str) -> dict:
    host = dataclasses.replace(host, workdir=workdir, env={
        "WEIRD_PLAIN": EnvValue(env[0]), "WEIRD_SECRET": EnvValue(env[1], secret=True)})
    run_id = new_run_id()
    plan = plan_run(Inventory("quoting.yaml", (host,)),
                    Options(payload=str(payload), entry="dump.py", args=tuple(args)), run_id,
                    ports={0: 1})
    try:
        PayloadPush(payload, "dump.py", run_id).send(session, plan, Console(quiet=True).status,
                                                      lambda line: None)
        session.launch(plan)
        deadline = time.monotonic() + 30
        log = b""
        while time.monotonic() < deadline:
            answers, errors = session.poll(plan, {0: len(log)})
            assert not errors, errors
            log += answers[0].data
            if answers[0].state == "exited" and answers[0].offset >= answers[0].size:
                assert answers[0].code == 0, log
                return json.loads(log.decode().strip().splitlines()[-1])
            time.sleep(0.05)
        raise AssertionError(f"the dump task did not end: {log!r}")
    finally:
        assert session.cleanup(plan) == {}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(args=st.lists(texts, max_size=4), env=st.tuples(texts, texts), name=dir_names)
@example(args=HOSTILE, env=(f"$(touch {CANARY})", f"`touch {CANARY}`\n;x"), name="we ird $(x)")
def test_values_reach_the_remote_process_literally(remote, args, env, name):
    session, host, payload = remote
    workdir = f"{host.workdir}/{name}"
    assert workdir_problem(workdir) is None
    got = run_remotely(session, host, payload, args, env, workdir)
    assert got["argv"] == list(args)
    assert got["env"] == {"WEIRD_PLAIN": env[0], "WEIRD_SECRET": env[1]}
    assert got["cwd"].startswith(os.path.realpath(workdir) + "/runs/")
    assert not CANARY.exists(), "a value was executed by a shell"
