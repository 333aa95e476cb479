"""The planner against golden files, and the properties every plan must have.

Goldens live in tests/unit/golden/<case>.txt (plan_text) and <case>.json (plan_document);
`TFDEPLOY_UPDATE_GOLDEN=1 python -m pytest tests/unit/test_planner.py` rewrites them after an
intended change (review the diff before keeping it).
"""
from __future__ import annotations

import dataclasses
import json
import os
import shlex
from pathlib import Path

import pytest

from deploy.inventory.load import load_inventory, parse_inventory
from deploy.plan.planner import (
    AGENT_BOOT, Options, agent_command, cleanup_request, credit_request,
    follow_request, plan_run, poll_request, receive_request, stop_request
)
from deploy.plan.text import plan_document, plan_text

GOLDEN = Path(__file__).with_name("golden")
REPO = Path(__file__).resolve().parents[2]
RUN_ID = "20260101-000000-abcdef"
SECRET_FROM_ENV = "sk-secret-1"
SECRET_IN_FILE = "tok-in-file-42"

# The repo's hosts.yaml with python set, so the golden does not depend on this machine.
LOCAL = """
hosts:
  - name: local
    transport: local
    workers: 2
    python: /opt/venv/bin/python
"""
LAB = f"""
defaults:
  user: researcher
  python: ~/venv/bin/python
hosts:
  - name: a
    address: gpu-a.lab
    cluster_address: 10.1.2.3
    workers: 2
    env:
      DATASET: /data/set one
      API_KEY: ${{LAB_API_KEY}}
      TOKEN: {{value: {SECRET_IN_FILE}, secret: true}}
  - name: b
    address: 10.1.2.4
    port: 2222
    workdir: /scratch/tf
"""
GPUS = """
hosts:
  - name: pair
    address: gpu-1.lab
    gpus: [1, 0]
  - name: big
    address: gpu-2.lab
    gpus: all
  - name: cpu
    address: cpu-1.lab
    env:
      CUDA_VISIBLE_DEVICES: ""
"""
# Per-host data: two local shards (relative to the inventory's directory, tests/unit) and a
# default remote path for the rest.
DATA = """
defaults:
  data: {remote: ~/datasets/mnist}
hosts:
  - name: a
    address: gpu-a.lab
    workers: 2
    data: {local: data_shards/a}
  - name: b
    address: 10.1.2.4
    workdir: /scratch/tf
    data: {local: ./data_shards/b}
  - name: c
    address: 10.1.2.5
"""
# Hosts on a LAN behind gateways: the cluster addresses are the hosts' own, the gateways only
# carry the controller's SSH sessions.
JUMP = """
defaults:
  ssh_config: none
  user: researcher
hosts:
  - name: a
    address: 10.0.0.5
    jump: admin@gw.example:2222
  - name: b
    address: 10.0.0.6
    jump: gw.example,bastion
"""
# IPv6 hosts as an inventory may give them: bare, in brackets (quoted: unquoted YAML reads a
# list), a gateway in brackets, and a name whose cluster address is IPv6.
IPV6 = """
defaults:
  ssh_config: none
  user: researcher
hosts:
  - name: a
    address: 2001:db8::10
    workers: 2
  - name: b
    address: "[2001:db8::11]"
    port: 2222
    jump: admin@[2001:db8::1]:2200
  - name: c
    address: gpu-c.lab
    cluster_address: "[2001:db8::12]"
"""
# A parameter-server cluster: chief, a host with two workers, ps, evaluator (no port).
PS = """
defaults:
  ssh_config: none
  user: researcher
  python: ~/venv/bin/python
hosts:
  - {name: c, address: 10.1.2.3, role: chief}
  - {name: w, address: 10.1.2.4, workers: 2}
  - {name: p, address: 10.1.2.5, role: ps}
  - {name: e, address: 10.1.2.6, role: evaluator}
"""
LAB_PORTS = {0: 20000, 1: 20001, 2: 30000}
CASES = {
    "local": (LOCAL, None, Options()),
    "lab": (LAB, None, Options(args=("--epochs", "5", "--note", "it's $(fine)"))),
    "lab_ports": (LAB, LAB_PORTS, Options(entry="main.py")),
    "gpus": (GPUS, {0: 20000, 1: 20001, 2: 20002, 3: 20003}, Options()),
    # With a requirements.txt: tasks prefer the `inv setup` environment each host resolves.
    "data": (DATA, None, Options(requirements_sha256="5e" * 32)),
    "jump": (JUMP, {0: 20000, 1: 20001}, Options()),
    "ipv6": (IPV6, {0: 20000, 1: 20001, 2: 20002, 3: 20003}, Options()),
    "ps": (PS, {0: 20000, 1: 20001, 2: 20002, 3: 20003}, Options(args=("--strategy", "ps"))),
}

# Clusters of workers only (the ps case has its own test of the same properties, by role).
WORKER_ONLY = sorted(name for name in CASES if name != "ps")


def inventory_of(name):
    # As if the file were in tests/unit: relative data directories are found beside it.
    return parse_inventory(CASES[name][0], str(Path(__file__).with_name(f"{name}.yaml")),
                           environ={"LAB_API_KEY": SECRET_FROM_ENV})


def plan_of(name):
    _, ports, options = CASES[name]
    return plan_run(inventory_of(name), options, RUN_ID, ports)


def check_golden(path: Path, actual: str) -> None:
    if os.environ.get("TFDEPLOY_UPDATE_GOLDEN") == "1":
        path.write_text(actual)
    assert path.exists(), f"missing golden {path}; regenerate with TFDEPLOY_UPDATE_GOLDEN=1"
    expected = path.read_text()
    assert actual == expected, f"{path.name} differs (TFDEPLOY_UPDATE_GOLDEN=1 rewrites it)"


@pytest.mark.parametrize("name", sorted(CASES))
def test_plan_text_matches_golden(name):
    check_golden(GOLDEN / f"{name}.txt", plan_text(plan_of(name)))


@pytest.mark.parametrize("name", sorted(CASES))
def test_plan_document_matches_golden(name):
    check_golden(GOLDEN / f"{name}.json", json.dumps(plan_document(plan_of(name)), indent=2) + "\n")


def test_no_stale_golden_files():
    assert sorted(p.name for p in GOLDEN.iterdir()) == sorted(
        f"{name}.{ext}" for name in CASES for ext in ("txt", "json"))


def test_local_case_is_the_repo_default_with_python_pinned():
    default = load_inventory(REPO / "hosts.yaml", environ={})
    pinned = [dataclasses.replace(h, python="/opt/venv/bin/python", own_python=True)
              for h in default.hosts]
    assert list(inventory_of("local").hosts) == pinned


def test_planning_is_pure_and_repeatable():
    assert plan_text(plan_of("lab")) == plan_text(plan_of("lab"))
    assert plan_of("lab_ports") == plan_of("lab_ports")


@pytest.mark.parametrize("name", WORKER_ONLY)
def test_tasks_follow_the_inventory_and_worker_0_is_chief(name):
    plan = plan_of(name)
    inventory = inventory_of(name)
    expected = [h.name for h in inventory.hosts for _ in range(h.workers)]
    assert [t.host.name for t in plan.tasks] == expected
    assert [t.index for t in plan.tasks] == list(range(len(expected)))
    assert [t.name for t in plan.tasks] == [f"worker-{i}" for i in range(len(expected))]
    assert [hp.host for hp in plan.hosts] == list(inventory.hosts)
    assert plan.chief is plan.tasks[0] and plan.chief.index == 0
    assert f"chief is worker-0 on {inventory.hosts[0].name}" in plan_text(plan)


@pytest.mark.parametrize("name", WORKER_ONLY)
def test_every_tf_config_lists_the_whole_cluster_and_its_own_index(name):
    plan = plan_of(name)
    _, ports, _ = CASES[name]
    cluster = [t.endpoint for t in plan.tasks]
    assert len(set(cluster)) == len(cluster) or ports is None
    for task in plan.tasks:
        config = json.loads(task.env["TF_CONFIG"].value)
        assert config == {"cluster": {"worker": cluster},
                          "task": {"type": "worker", "index": task.index}}
        assert task.tf_config == config
        assert task.port == (ports or {}).get(task.index)


def test_explicit_ports_go_into_endpoints_and_the_cluster():
    plan = plan_of("lab_ports")
    assert [t.endpoint for t in plan.tasks] == ["10.1.2.3:20000", "10.1.2.3:20001",
                                                "10.1.2.4:30000"]
    text = plan_text(plan)
    assert "<port>" not in text and "chosen on each host at launch" not in text


def test_without_ports_the_plan_says_they_are_chosen_at_launch():
    plan = plan_of("lab")
    assert all(t.port is None for t in plan.tasks)
    assert [t.endpoint for t in plan.tasks] == ["10.1.2.3:<port>", "10.1.2.3:<port>",
                                                "10.1.2.4:<port>"]
    assert "chosen on each host at launch" in plan_text(plan)


@pytest.mark.parametrize("name", WORKER_ONLY)
def test_every_task_gets_the_launcher_environment(name):
    plan = plan_of(name)
    for hp in plan.hosts:
        assert hp.run_dir == f"{hp.host.workdir}/runs/{RUN_ID}"
        for task in hp.tasks:
            env = {k: v.value for k, v in task.env.items()}
            assert env["TF_USE_LEGACY_KERAS"] == "1"
            assert env["PYTHONUNBUFFERED"] == "1"
            assert env["TFDEPLOY_RUN_ID"] == RUN_ID
            assert env["TFDEPLOY_TASK_INDEX"] == str(task.index)
            assert env["TFDEPLOY_NUM_WORKERS"] == str(len(plan.tasks))
            assert env["TFDEPLOY_OUTPUT_DIR"] == f"{hp.run_dir}/output"
            assert env["TFDEPLOY_OUTPUT_DIR"].startswith(hp.run_dir + "/")
            # The host's own env comes on top, unchanged.
            for key, value in hp.host.env.items():
                assert task.env[key] == value


def test_requests_name_the_run_dir_and_the_agent_its_command():
    plan = plan_of("lab")
    a, b = plan.hosts
    assert b.run_dir == f"/scratch/tf/runs/{RUN_ID}"
    # One agent per host for the whole run, started by the host's python; it reads its boot
    # and the host package on stdin, then every step as a request.
    assert agent_command(b.host).line == f"~/venv/bin/python -I -S -c {shlex.quote(AGENT_BOOT)}"
    assert f"  agent:  {agent_command(b.host).shown()}" in plan_text(plan).splitlines()
    # The push names the host and its tasks, recorded in the run dir (which hosts may share);
    # the stage comes with it, the files the host lacks with its second half.
    fields = f"rundir={b.run_dir} cache_dir=/scratch/tf/cache host=b tasks=2"
    assert b.push.shown().startswith(f"agent: push {fields}    < ")
    assert receive_request(b.push).shown().startswith(f"agent: receive {fields}    < ")
    # The file cache sits beside runs/, outside every run dir: teardown never deletes it.
    # A ~/ workdir stays unquoted so that the host expands its own home.
    assert a.push.shown().split("    <")[0].endswith(
        " rundir=~/.tfdeploy/runs/" + RUN_ID + " cache_dir=~/.tfdeploy/cache host=a tasks=0,1")
    assert a.push.wire() == {"verb": "push", "home": ["rundir", "cache_dir"], "fields": {
        "rundir": "~/.tfdeploy/runs/" + RUN_ID, "cache_dir": "~/.tfdeploy/cache", "host": "a",
        "tasks": "0,1"}}
    # The port probe is asked of the agent, as `inv check` asks it.
    assert b.ports.shown() == "agent: ports count=5"
    launch = plan.tasks[2].launch.shown()
    assert launch.startswith(f"agent: launch rundir={b.run_dir} task=2 "
                             f"cwd={b.run_dir}/payload argv=[~/venv/bin/python train.py ")
    # The host's python is a path on the host; the rest of argv is literal.
    assert plan.tasks[2].launch.wire()["home"] == ["rundir", "cwd", "argv.0"]
    assert stop_request(b.run_dir, 2.5).shown() == f"agent: stop rundir={b.run_dir} grace=2.5"
    assert poll_request(b.run_dir, {"2": 10}).shown() == \
        f"agent: poll rundir={b.run_dir} offsets='{{\"2\":10}}'"
    assert follow_request(b.run_dir, {"1": 0}).wire()["fields"] == {
        "rundir": b.run_dir, "offsets": {"1": 0}}
    assert credit_request(7).wire() == {"verb": "credit", "fields": {"follow": 7}, "home": []}
    assert cleanup_request(b.host, b.run_dir, 3.0).shown() == \
        f"agent: cleanup rundir={b.run_dir} grace=3.0 host=b"


@pytest.mark.parametrize("name", ["lab", "lab_ports"])
def test_secrets_are_starred_everywhere_they_are_shown(name):
    plan = plan_of(name)
    for task in plan.hosts[0].tasks:
        assert task.env["API_KEY"].value == SECRET_FROM_ENV and task.env["API_KEY"].secret
        assert task.env["TOKEN"].value == SECRET_IN_FILE and task.env["TOKEN"].secret
        assert task.env["DATASET"].value == "/data/set one" and not task.env["DATASET"].secret
    text = plan_text(plan)
    document = plan_document(plan)
    assert "env API_KEY=***" in text and "env TOKEN=***" in text
    assert "env DATASET=/data/set one" in text
    for task_doc in document["hosts"][0]["tasks"]:
        assert task_doc["env"]["API_KEY"] == "***" and task_doc["env"]["TOKEN"] == "***"
    shown = [text, json.dumps(document), json.dumps(document, ensure_ascii=False)]
    # Environment values travel only inside the requests, so nothing shown carries them.
    for hp in plan.hosts:
        shown += [hp.push.shown(), hp.ports.shown(), agent_command(hp.host).shown(),
                  cleanup_request(hp.host, hp.run_dir, 3).shown()]
        shown += [t.launch.shown() for t in hp.tasks] + [repr(t.launch) for t in hp.tasks]
    for secret in (SECRET_FROM_ENV, SECRET_IN_FILE):
        for where in shown:
            assert secret not in where


def test_the_document_is_plain_json_with_the_plan_identity():
    document = plan_document(plan_of("lab"))
    assert json.loads(json.dumps(document)) == document
    assert (document["run_id"], document["entry"], document["args"]) == (
        RUN_ID, "train.py", ["--epochs", "5", "--note", "it's $(fine)"])
    assert [h["name"] for h in document["hosts"]] == ["a", "b"]
    assert [t["task"] for h in document["hosts"] for t in h["tasks"]] == [
        "worker-0", "worker-1", "worker-2"]


def test_update_mode_rewrites_a_golden(tmp_path, monkeypatch):
    golden = tmp_path / "x.txt"
    golden.write_text("old\n")
    with pytest.raises(AssertionError, match="TFDEPLOY_UPDATE_GOLDEN=1"):
        check_golden(golden, "new\n")
    monkeypatch.setenv("TFDEPLOY_UPDATE_GOLDEN", "1")
    check_golden(golden, "new\n")
    assert golden.read_text() == "new\n"


def test_a_task_per_listed_gpu_and_one_task_for_all():
    plan = plan_of("gpus")
    pair, big, cpu = plan.hosts
    assert [(t.index, t.gpus, t.env["CUDA_VISIBLE_DEVICES"].value) for t in pair.tasks] == [
        (0, "1", "1"), (1, "0", "0")]                       # in the order listed
    (whole,) = big.tasks
    assert whole.gpus == "all" and "CUDA_VISIBLE_DEVICES" not in whole.env
    (plain,) = cpu.tasks
    assert plain.gpus is None and plain.env["CUDA_VISIBLE_DEVICES"].value == ""  # its own env
    # Two tasks on one host: distinct ports, and both in the cluster.
    assert [t.endpoint for t in pair.tasks] == ["gpu-1.lab:20000", "gpu-1.lab:20001"]
    assert len(plan.tasks[0].tf_config["cluster"]["worker"]) == 4
    text = plan_text(plan).splitlines()
    assert "  worker-0 at gpu-1.lab:20000, GPU 1" in text
    assert "  worker-1 at gpu-1.lab:20001, GPU 0" in text
    assert "  worker-2 at gpu-2.lab:20002, all GPUs" in text
    assert "  worker-3 at cpu-1.lab:20003" in text
    doc = plan_document(plan)
    assert [t.get("gpus") for h in doc["hosts"] for t in h["tasks"]] == ["1", "0", "all", None]


def test_a_ps_cluster_gives_each_task_its_type_and_index_and_no_evaluator_in_the_cluster():
    plan = plan_of("ps")
    tasks = {t.name: t for t in plan.tasks}
    assert list(tasks) == ["chief-0", "worker-0", "worker-1", "ps-0", "evaluator-0"]
    cluster = {"chief": ["10.1.2.3:20000"], "worker": ["10.1.2.4:20001", "10.1.2.4:20002"],
               "ps": ["10.1.2.5:20003"]}
    for name, task in tasks.items():
        kind, index = name.split("-")
        assert task.tf_config == {"cluster": cluster, "task": {"type": kind, "index": int(index)}}
        assert task.env["TFDEPLOY_TASK_TYPE"].value == kind
        assert task.env["TFDEPLOY_TASK_INDEX"].value == index
        assert task.env["TFDEPLOY_NUM_WORKERS"].value == "2"
    assert tasks["evaluator-0"].port is None and not tasks["evaluator-0"].in_cluster
    assert plan.chief is tasks["chief-0"] and plan.chief_host.host.name == "c"
    # The host verbs name tasks by key; the log files by type and per-type index.
    assert [t.key for t in plan.tasks] == ["chief-0", "0", "1", "ps-0", "evaluator-0"]


def test_every_task_is_told_its_type():
    assert {t.env["TFDEPLOY_TASK_TYPE"].value for t in plan_of("lab_ports").tasks} == {"worker"}
