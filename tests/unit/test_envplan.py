"""Where `inv setup` builds environments and how `inv train` finds them; pure planning, plus
the host-side pieces that need no network (ready check, relocation, launch preference)."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from deploy.host import env as hostenv
from deploy.inventory.load import parse_inventory
from deploy.plan.planner import Options, env_dir, env_python, plan_run
from deploy.plan.setup import plan_setup
from deploy.plan.text import plan_document, plan_text

RUN_ID = "20260101-000000-abcdef"
REQ = "a" * 64
INVENTORY = """
hosts:
  - name: plain
    address: 10.0.0.1
  - name: pinned
    address: 10.0.0.2
    python: /opt/py/bin/python
  - name: other
    address: 10.0.0.3
    workdir: /scratch/tf
"""


@pytest.fixture
def inventory():
    return parse_inventory(INVENTORY, "h.yaml", environ={})


def test_env_dir_is_keyed_by_requirements_and_python(inventory):
    plain, pinned, other = inventory.hosts
    assert env_dir(plain, REQ).startswith("~/.tfdeploy/envs/")
    assert env_dir(other, REQ).startswith("/scratch/tf/envs/")
    assert env_dir(plain, REQ) != env_dir(plain, "b" * 64)        # a changed file: a new env
    assert env_dir(plain, REQ).rsplit("/", 1)[1] != env_dir(pinned, REQ).rsplit("/", 1)[1]
    assert env_dir(plain, REQ) == env_dir(plain, REQ)


def test_train_prefers_the_env_unless_the_host_names_its_python(inventory):
    plain, pinned, other = inventory.hosts
    assert env_python(plain, REQ) == env_dir(plain, REQ) + "/bin/python"
    assert env_python(pinned, REQ) is None
    assert env_python(plain, None) is None                      # no requirements.txt
    plan = plan_run(inventory, Options(requirements_sha256=REQ), RUN_ID)
    a, b, c = plan.hosts
    assert f" launch {a.run_dir} 0 {a.run_dir}/payload {env_python(plain, REQ)} -- python3 " \
        in a.tasks[0].launch.shown()
    assert a.tasks[0].launch.args[3] == env_python(plain, REQ)        # a path on the host
    assert 3 in a.tasks[0].launch.wire()["home"]
    assert " launch " in b.tasks[0].launch.shown() and "envs/" not in b.tasks[0].launch.shown()
    text = plan_text(plan)
    assert (f"  python: {env_python(plain, REQ)} if `inv setup` built it, else python3"
            in text.splitlines())
    assert text.count("if `inv setup` built it") == 2           # not for the pinned host
    doc = plan_document(plan)
    assert [h.get("env_python") for h in doc["hosts"]] == [a.env_python, None, c.env_python]


def test_setup_plan_commands(inventory):
    plan = plan_setup(inventory, REQ, "setup-" + RUN_ID, wheelhouse=True)
    plain = plan.hosts[0]
    assert plain.run_dir == f"~/.tfdeploy/runs/setup-{RUN_ID}"
    assert plain.status.line.startswith(f"mkdir -p {plain.run_dir} && tar -xzf - -C ")
    assert plain.status.line.endswith(f" envstatus {plain.run_dir} {plain.env_dir}")
    assert plain.build.line.endswith(f" setup {plain.run_dir} {plain.env_dir} wheelhouse")
    assert plain.wheels.line == f"tar -xf - -C {plain.run_dir}"
    assert f" cleanup {plain.run_dir} " in plain.cleanup.line
    bare = plan_setup(inventory, REQ, "setup-" + RUN_ID, wheelhouse=False).hosts[0]
    assert bare.build.line.endswith(f" setup {plain.run_dir} {plain.env_dir}")


def fake_env(root: Path, want: dict) -> Path:
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "python").symlink_to(sys.executable)
    (root / hostenv.MARKER).write_text(json.dumps(want))
    return root


def test_an_env_is_ready_only_for_the_same_requirements_and_python(tmp_path):
    rundir = tmp_path / "run"
    rundir.mkdir()
    (rundir / "requirements.txt").write_text("tinypkg==1.0\n")
    want = hostenv.wanted(str(rundir))
    env = fake_env(tmp_path / "env", want)
    assert hostenv.ready(str(env), want)
    assert not hostenv.ready(str(env), dict(want, python="3.0.0"))   # python upgraded
    (rundir / "requirements.txt").write_text("tinypkg==2.0\n")
    assert not hostenv.ready(str(env), hostenv.wanted(str(rundir)))
    (env / hostenv.MARKER).unlink()                                   # an unfinished build
    assert not hostenv.ready(str(env), want)
    assert hostenv.envstatus(str(rundir), str(tmp_path / "missing")) == {
        "ready": False, "env": str(tmp_path / "missing")}


def test_relocate_points_scripts_at_the_final_place(tmp_path):
    env = tmp_path / "envs" / "key"
    (env / "bin").mkdir(parents=True)
    build = "/work/runs/x/env-build"
    (env / "bin" / "pip").write_text(f"#!{build}/bin/python\nimport pip\n")
    (env / "bin" / "activate").write_text(f'VIRTUAL_ENV="{build}"\n')
    (env / "pyvenv.cfg").write_text(f"home = /usr/bin\ncommand = python -m venv {build}\n")
    (env / "bin" / "python").symlink_to(sys.executable)
    hostenv.relocate(str(env), build)
    assert (env / "bin" / "pip").read_text().startswith(f"#!{env}/bin/python\n")
    assert build not in (env / "bin" / "activate").read_text()
    assert build not in (env / "pyvenv.cfg").read_text()
    assert os.readlink(env / "bin" / "python") == sys.executable
