"""`--hosts slurm` and `inv submit` as pure logic: an allocation's variables read as Slurm
writes them (docs/slurm-lab.md has what a real salloc gave), and the batch script."""
from __future__ import annotations

import shlex

import pytest

from deploy.errors import BadInput
from deploy.inventory import slurm
from deploy.inventory.slurm import (
    SlurmError, allocation_inventory, expand_hostlist, gpus_per_node, node_addresses,
    srun_argv, tasks_per_node
)
from deploy.plan.batch import BatchRequest, batch_script

SCONTROL = ("NodeName=n1 Arch=x86_64 CoresPerSocket=4 NodeAddr=127.0.5.1 NodeHostName=vm "
            "OS=Linux 6.1 #1 SMP Port=6818\n"
            "NodeName=n2 Arch=x86_64 NodeAddr=127.0.5.2 NodeHostName=vm Port=6819\n")


@pytest.mark.parametrize("text, names", [
    ("n1", ["n1"]),
    ("n[1-2]", ["n1", "n2"]),
    ("n1,n2", ["n1", "n2"]),
    ("gpu[01-03,07],cpu1", ["gpu01", "gpu02", "gpu03", "gpu07", "cpu1"]),
    ("node[8-11]", ["node8", "node9", "node10", "node11"]),
    ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
    ("a[1],b.lab", ["a1", "b.lab"]),
])
def test_hostlists_expand_as_slurm_expands_them(text, names):
    assert expand_hostlist(text) == names


@pytest.mark.parametrize("text", ["n[1-2", "n1-2]", "n[a-b]", "n[3-1]", "n[1-2-3]", "n1,,n2",
                                  "n[1-999999]"])
def test_a_broken_hostlist_is_refused_naming_it(text):
    with pytest.raises(SlurmError, match="hostlist"):
        expand_hostlist(text)


@pytest.mark.parametrize("text, nodes, counts", [
    ("1(x2)", 2, [1, 1]),
    ("2(x3),1", 4, [2, 2, 2, 1]),
    ("4,1", 2, [4, 1]),
    ("3", 1, [3]),
])
def test_tasks_per_node(text, nodes, counts):
    assert tasks_per_node(text, nodes) == counts


@pytest.mark.parametrize("text, nodes", [("1(x2)", 3), ("2(x)", 2), ("0", 1), ("x", 1),
                                         ("129", 1)])
def test_tasks_per_node_refuses_what_does_not_fit(text, nodes):
    with pytest.raises(SlurmError, match="SLURM_TASKS_PER_NODE"):
        tasks_per_node(text, nodes)


def test_gpus_per_node_takes_a_count_with_or_without_a_type():
    assert gpus_per_node({}) is None
    assert gpus_per_node({"SLURM_GPUS_PER_NODE": "4"}) == 4
    assert gpus_per_node({"SLURM_GPUS_PER_NODE": "a100:2"}) == 2
    with pytest.raises(SlurmError):
        gpus_per_node({"SLURM_GPUS_PER_NODE": "a100"})


def test_node_addresses_read_scontrols_one_line_per_node():
    assert node_addresses(SCONTROL) == {"n1": "127.0.5.1", "n2": "127.0.5.2"}


ALLOCATION = {"SLURM_JOB_ID": "29684412", "SLURM_JOB_NODELIST": "n[1-2]",
              "SLURM_TASKS_PER_NODE": "2,1"}


def test_an_allocation_becomes_a_host_per_node_reached_by_srun():
    asked = []
    inventory = allocation_inventory(ALLOCATION, "outside",
                                     lambda nodes, env: asked.append(nodes) or SCONTROL)
    assert asked == ["n[1-2]"]
    assert [(h.name, h.address, h.workers, h.transport, h.slurm_job) for h in inventory.hosts] \
        == [("n1", "127.0.5.1", 2, "slurm", "29684412"), ("n2", "127.0.5.2", 1, "slurm",
                                                          "29684412")]
    assert srun_argv(inventory.hosts[1])[:7] == ["srun", "--jobid=29684412", "--overlap",
                                                 "-N1", "-n1", "-w", "n2"]
    assert "-u" in srun_argv(inventory.hosts[1])


def test_gpus_per_node_make_a_task_per_gpu():
    inventory = allocation_inventory({**ALLOCATION, "SLURM_GPUS_PER_NODE": "2"}, "outside",
                                     lambda nodes, env: SCONTROL)
    assert [(h.workers, h.gpus) for h in inventory.hosts] == [(2, 2), (2, 2)]


def test_outside_an_allocation_the_given_words_are_the_error():
    with pytest.raises(SlurmError, match="^use salloc$"):
        allocation_inventory({"SLURM_CONF": "/etc/slurm.conf"}, "use salloc")


@pytest.mark.parametrize("environ, words", [
    ({"SLURM_JOB_ID": "12; rm -rf ~", "SLURM_JOB_NODELIST": "n1"}, "not a Slurm job id"),
    ({"SLURM_JOB_ID": "12"}, "no SLURM_JOB_NODELIST"),
    ({"SLURM_JOB_ID": "12", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_TASKS_PER_NODE": "1"},
     "gives 1 node"),
    ({"SLURM_JOB_ID": "12", "SLURM_JOB_NODELIST": "-oProxyCommand=x"}, "node"),
])
def test_bad_allocation_variables_are_refused_naming_them(environ, words):
    with pytest.raises(SlurmError, match=words):
        allocation_inventory(environ, "outside", lambda nodes, env: SCONTROL)


def test_a_node_scontrol_does_not_know_is_refused():
    with pytest.raises(SlurmError, match="no NodeAddr for node 'n3'"):
        allocation_inventory({**ALLOCATION, "SLURM_JOB_NODELIST": "n[1-3]",
                              "SLURM_TASKS_PER_NODE": "1(x3)"}, "outside",
                             lambda nodes, env: SCONTROL)


def test_without_scontrol_the_names_stand_for_the_addresses():
    inventory = allocation_inventory(ALLOCATION, "outside", scontrol=None)
    assert [h.address for h in inventory.hosts] == ["n1", "n2"]


REQUEST = BatchRequest(run_id="20261205-120000-abcdef", nodes=2,
                       program=("/venv/bin/python", "-m", "invoke"),
                       train_args=("--payload", "/home/ann/my payload", "--args",
                                   "--epochs 5 --name 'x y'"),
                       workdir="/home/ann/proj", output="/home/ann/runs/x/slurm-%j.out")


def test_the_batch_script_runs_train_on_slurm_with_the_runs_id():
    script = batch_script(REQUEST)
    lines = script.splitlines()
    assert lines[0] == "#!/bin/sh"
    options = [line.split(" ", 1)[1] for line in lines if line.startswith("#SBATCH ")]
    assert options == ["--job-name=tfdeploy-20261205-120000-abcdef", "--nodes=2",
                       "--output=/home/ann/runs/x/slurm-%j.out", "--open-mode=append",
                       "--ntasks-per-node=1"]
    assert "cd /home/ann/proj || exit 1" in lines
    (command,) = [line for line in lines if line.startswith("exec ")]
    assert shlex.split(command)[1:] == [
        "/venv/bin/python", "-m", "invoke", "train", "--hosts", "slurm", "--run-id",
        "20261205-120000-abcdef", "--payload", "/home/ann/my payload", "--args",
        "--epochs 5 --name 'x y'"]


def test_gpus_time_partition_and_account_become_sbatch_options():
    script = batch_script(BatchRequest(**{**REQUEST.__dict__, "gpus_per_node": "a100:2",
                                          "time": "1-12:00:00", "partition": "gpu",
                                          "account": "lab-x"}))
    options = [line.split(" ", 1)[1] for line in script.splitlines()
               if line.startswith("#SBATCH ")]
    assert options[4:] == ["--gpus-per-node=a100:2", "--time=1-12:00:00", "--partition=gpu",
                           "--account=lab-x"]


@pytest.mark.parametrize("field, value, flag", [
    ("nodes", 0, "--nodes"), ("time", "2h", "--time"), ("time", "1\n#SBATCH --x", "--time"),
    ("partition", "gpu --account=y", "--partition"), ("account", "", None),
    ("gpus_per_node", "0", "--gpus-per-node"),
    ("output", "/home/ann/my runs/slurm-%j.out", "--runs-dir"),
])
def test_values_sbatch_would_misread_are_refused_naming_the_flag(field, value, flag):
    request = BatchRequest(**{**REQUEST.__dict__, field: value})
    if flag is None:
        assert batch_script(request)
        return
    with pytest.raises(BadInput, match=flag):
        batch_script(request)


def test_the_outside_message_names_salloc_and_submit():
    text = slurm.OUTSIDE.format(train="tfdeploy train", submit="tfdeploy submit")
    assert "salloc -N2 tfdeploy train --hosts slurm" in text and "tfdeploy submit" in text
