"""Where `inv setup` builds environments and how `inv train` finds them; pure planning, plus
the host-side pieces that need no network (the environment's name from the host's facts,
ready check, relocation)."""
from __future__ import annotations

import json
import os
import platform
import sys

import pytest

from deploy.host import venv as hostenv
from hostpkg import fake_env
from deploy.host import envkey
from deploy.host.envkey import env_dir, env_name, env_python, host_facts, host_key
from deploy.host.layout import RUN_ID as RUN_ID_PATTERN
from deploy.host.layout import host_run_id
from deploy.inventory.load import parse_inventory
from deploy.plan.planner import Options, plan_run
from deploy.plan.envbuild import plan_setup
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


FACTS = {"python": "3.11.7 (main, May  9 2026, 07:35:25) [GCC 12.2.0]", "cache_tag": "cpython-311",
         "abi": [".cpython-311-x86_64-linux-gnu.so", ".abi3.so", ".so"],
         "base": "/usr/bin/python3.11", "system": "Linux", "machine": "x86_64",
         "libc": "glibc 2.36"}


def test_the_host_key_is_the_same_for_the_same_facts_only():
    assert host_key(FACTS) == host_key(dict(FACTS)) == host_key(dict(reversed(FACTS.items())))
    others = [
        dict(FACTS, machine="aarch64",
             abi=[".cpython-311-aarch64-linux-gnu.so", ".abi3.so", ".so"]),   # another arch
        dict(FACTS, machine="aarch64"),                               # the machine alone
        dict(FACTS, libc=" ", abi=[".cpython-311-x86_64-linux-musl.so", ".abi3.so", ".so"]),
        dict(FACTS, libc="glibc 2.31"),                               # an older glibc
        dict(FACTS, python="3.11.9 (main, Apr  2 2024, 08:00:00) [GCC 12.2.0]"),   # a patch
        dict(FACTS, python="3.11.7 (main, Jan  1 2026, 00:00:00) [Clang 16.0.0]"),  # a rebuild
        dict(FACTS, cache_tag="pypy39", abi=[".pypy39-pp73-x86_64-linux-gnu.so", ".so"]),
        dict(FACTS, abi=[".cpython-311t-x86_64-linux-gnu.so", ".so"]),    # free-threaded
        dict(FACTS, base="/opt/python/bin/python3.11"),               # another install
    ]
    keys = {host_key(f) for f in others}
    assert len(keys) == len(others) and host_key(FACTS) not in keys
    assert all(len(k) == 16 and set(k) <= set("0123456789abcdef") for k in keys)


def test_host_facts_are_this_interpreters():
    facts = host_facts()
    assert facts["python"] == sys.version and facts["cache_tag"] == sys.implementation.cache_tag
    assert facts["machine"] == platform.machine()
    assert facts["libc"] == os.confstr("CS_GNU_LIBC_VERSION")          # a glibc machine
    assert facts["base"] == os.path.realpath(sys.executable)
    assert host_key() == host_key(facts)
    assert json.loads(json.dumps(facts)) == facts       # what is hashed is all of it


def test_env_dir_is_keyed_by_requirements_and_the_host(inventory):
    plain, _, other = inventory.hosts
    key = host_key()
    assert env_dir(plain.workdir, REQ) == f"~/.tfdeploy/envs/{REQ[:16]}-{key}"
    assert env_dir(other.workdir, REQ).startswith("/scratch/tf/envs/")
    assert env_dir(plain.workdir, REQ) != env_dir(plain.workdir, "b" * 64)   # a new file: a new env
    assert env_name(REQ) != env_name(REQ, host_key(dict(FACTS, machine="aarch64")))
    assert env_dir(plain.workdir, REQ) == env_dir(plain.workdir, REQ)
    assert env_python(plain.workdir, REQ) == env_dir(plain.workdir, REQ) + "/bin/python"
    with pytest.raises(ValueError):
        env_name("../" + "a" * 61)                  # it becomes a path: only a sha256 will do
    assert envkey.built_from(env_name(REQ), [REQ]) and envkey.built_from(env_name(REQ, "f" * 16),
                                                                        [REQ])
    assert not envkey.built_from(env_name(REQ), ["b" * 64]) and not envkey.built_from("mine", [REQ])


def test_train_prefers_the_env_unless_the_host_names_its_python(inventory):
    plan = plan_run(inventory, Options(requirements_sha256=REQ), RUN_ID)
    a, b, c = plan.hosts
    assert (a.env_requirements, b.env_requirements) == (REQ, None)
    assert a.env_python == f"~/.tfdeploy/envs/{REQ[:16]}-<host key>/bin/python"
    assert f" launch rundir={a.run_dir} task=0 cwd={a.run_dir}/payload argv=[python3 " \
        in a.tasks[0].launch.shown()
    assert a.tasks[0].launch.message.requirements == REQ
    assert " launch " in b.tasks[0].launch.shown() and REQ not in b.tasks[0].launch.shown()
    assert plan_run(inventory, Options(), RUN_ID).hosts[0].env_python is None   # no requirements
    text = plan_text(plan)
    assert (f"  python: {a.env_python} if `inv setup` built it, else python3 (<host key>: of "
            "the host's Python build, machine and libc, resolved on the host)"
            in text.splitlines())
    assert text.count("if `inv setup` built it") == 2           # not for the pinned host
    doc = plan_document(plan)
    assert [h.get("env_python") for h in doc["hosts"]] == [a.env_python, None, c.env_python]


def test_setup_plan_commands(inventory):
    plan = plan_setup(inventory, "setup-" + RUN_ID, wheelhouse=True)
    plain = plan.hosts[0]
    # Each host a directory of its own: hosts sharing a workdir never build in one.
    assert plain.run_id == f"setup-{RUN_ID}-plain" and RUN_ID_PATTERN.match(plain.run_id)
    assert len({hp.run_dir for hp in plan.hosts}) == len(plan.hosts)
    assert plain.run_dir == f"~/.tfdeploy/runs/setup-{RUN_ID}-plain"
    # Every step is a request to the host's agent, which checks the workdir before the status
    # request's stage is written; only the wheelhouse streams into `tar`.
    assert plain.status.shown() == (f"agent: env-status rundir={plain.run_dir}    "
                                    "< tar.gz of run.json and requirements.txt")
    assert plain.build.shown() == \
        f"agent: env-build rundir={plain.run_dir} host=plain wheelhouse=true"
    assert plain.build.wire()["home"] == ["rundir"]
    assert plain.wheels.line == f"tar -xf - -C {plain.run_dir}"
    assert plain.cleanup.shown() == f"agent: cleanup rundir={plain.run_dir} grace=1.0 host=plain"
    bare = plan_setup(inventory, "setup-" + RUN_ID, wheelhouse=False).hosts[0]
    assert bare.build.message.wheelhouse is False


def test_a_host_run_id_is_a_run_id_whatever_the_host_is_called():
    assert host_run_id("setup-1", "h1") == "setup-1-h1"
    long = host_run_id("setup-" + RUN_ID, "h" * 200)
    assert RUN_ID_PATTERN.match(long) and long != host_run_id("setup-" + RUN_ID, "h" * 201)


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
        "ready": False, "env": str(tmp_path / "missing"), "python": sys.version.split()[0]}


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


