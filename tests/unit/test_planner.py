"""The planner against golden files, and the properties every plan must have."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from deploy.inventory import parse_inventory
from deploy.planner import Options, plan_run
from deploy.plantext import plan_document, plan_text

GOLDEN = Path(__file__).with_name("golden")
RUN_ID = "20260101-000000-abcdef"

LOCAL = """
hosts:
  - name: local
    transport: local
    workers: 2
    python: /opt/venv/bin/python
"""
LAB = """
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
      API_KEY: ${LAB_API_KEY}
  - name: b
    address: 10.1.2.4
    port: 2222
    workdir: /scratch/tf
"""
CASES = {
    "local": (LOCAL, None, Options()),
    "lab": (LAB, None, Options(args=("--epochs", "5", "--note", "it's $(fine)"))),
    "lab_ports": (LAB, {0: 20000, 1: 20001, 2: 30000}, Options(entry="main.py")),
}


def plan_of(name):
    text, ports, options = CASES[name]
    inventory = parse_inventory(text, f"{name}.yaml", environ={"LAB_API_KEY": "sk-secret-1"})
    return plan_run(inventory, options, RUN_ID, ports)


def check_golden(path: Path, actual: str) -> None:
    if os.environ.get("TFDEPLOY_UPDATE_GOLDEN") == "1":
        path.write_text(actual)
    assert path.exists(), f"missing golden {path}; regenerate with TFDEPLOY_UPDATE_GOLDEN=1"
    assert actual == path.read_text(), f"{path.name} differs (TFDEPLOY_UPDATE_GOLDEN=1 rewrites)"


@pytest.mark.parametrize("name", sorted(CASES))
def test_plan_matches_golden_files(name):
    plan = plan_of(name)
    check_golden(GOLDEN / f"{name}.txt", plan_text(plan))
    check_golden(GOLDEN / f"{name}.json", json.dumps(plan_document(plan), indent=2) + "\n")


def test_tasks_follow_the_inventory_and_worker_0_is_chief():
    plan = plan_of("lab_ports")
    assert [(t.index, t.host.name) for t in plan.tasks] == [(0, "a"), (1, "a"), (2, "b")]
    assert plan.chief.index == 0
    cluster = ["10.1.2.3:20000", "10.1.2.3:20001", "10.1.2.4:30000"]
    for task in plan.tasks:
        config = json.loads(task.env["TF_CONFIG"].value)
        assert config == {"cluster": {"worker": cluster},
                          "task": {"type": "worker", "index": task.index}}
        assert task.tf_config == config


def test_every_task_gets_the_launcher_environment():
    plan = plan_of("lab_ports")
    for hp in plan.hosts:
        for task in hp.tasks:
            env = {k: v.value for k, v in task.env.items()}
            assert env["TF_USE_LEGACY_KERAS"] == "1"
            assert env["PYTHONUNBUFFERED"] == "1"
            assert env["TFDEPLOY_RUN_ID"] == RUN_ID
            assert env["TFDEPLOY_TASK_INDEX"] == str(task.index)
            assert env["TFDEPLOY_NUM_WORKERS"] == "3"
            assert env["TFDEPLOY_OUTPUT_DIR"] == f"{hp.run_dir}/output"
            assert hp.run_dir == f"{hp.host.workdir}/runs/{RUN_ID}"


def test_secrets_never_appear_in_what_is_shown():
    plan = plan_of("lab")
    assert plan.tasks[0].env["API_KEY"].value == "sk-secret-1"
    shown = plan_text(plan) + json.dumps(plan_document(plan))
    assert "sk-secret-1" not in shown
    assert "API_KEY=***" in plan_text(plan)
    # Environment values travel on stdin, so no command line carries them.
    for task in plan.tasks:
        assert "sk-secret-1" not in task.launch.line


def test_without_ports_the_plan_says_they_are_chosen_at_launch():
    plan = plan_of("lab")
    assert all(t.port is None for t in plan.tasks)
    assert "<port>" in plan.tasks[0].env["TF_CONFIG"].value
    assert "chosen on each host at launch" in plan_text(plan)
