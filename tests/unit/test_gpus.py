"""A host's GPUs read from nvidia-smi's documented CSV (deploy/host/gpus.py), who is busy, and
the leases that keep two runs off one GPU. Pure: nvidia-smi's answers are given as text, and
the leases live in tmp_path."""
from __future__ import annotations

import json
import os

import pytest

from deploy.host import gpus
from deploy.inventory.load import load_inventory
from deploy.inventory.model import InventoryError
from deploy.plan.planner import Options, plan_run

# As nvidia-smi prints them (`--format=csv,noheader,nounits`), one board lacking a value.
GPUS = """0, GPU-5c5b0001, NVIDIA A100-SXM4-40GB, 40960, 3, 0
1, GPU-5c5b0002, NVIDIA A100-SXM4-40GB, 40960, 20480, 87
2, GPU-5c5b0003, NVIDIA A100-SXM4-40GB, 40960, 5, [N/A]
3, GPU-5c5b0004, NVIDIA A100-SXM4-40GB, 40960, 39000, [Not Supported]
"""
APPS = "4242, GPU-5c5b0002, 20470, /usr/bin/python3\n"


def test_the_documented_csv_with_its_variants():
    found = gpus.parse_gpus(GPUS)
    assert [g["index"] for g in found] == [0, 1, 2, 3]
    assert found[0] == {"index": 0, "uuid": "GPU-5c5b0001", "name": "NVIDIA A100-SXM4-40GB",
                        "memory_total": 40960, "memory_used": 3, "utilization": 0,
                        "processes": []}
    assert found[2]["utilization"] is None and found[3]["utilization"] is None
    # Without `nounits` values carry their units; a model name may hold a comma.
    units = gpus.parse_gpus("0, GPU-x, Tesla V100, SXM2, 16160 MiB, 1 MiB, 7 %\n")
    assert units[0]["name"] == "Tesla V100, SXM2"
    assert (units[0]["memory_total"], units[0]["memory_used"], units[0]["utilization"]) == \
        (16160, 1, 7)
    assert gpus.parse_apps(APPS) == [{"pid": 4242, "uuid": "GPU-5c5b0002", "used_memory": 20470,
                                      "name": "/usr/bin/python3"}]
    assert gpus.parse_gpus("No devices were found\n") == [] and gpus.parse_apps("") == []


def gpu(**fields):
    return {"index": 0, "uuid": "GPU-a", "name": "A100", "memory_total": 40960,
            "memory_used": 3, "utilization": 0, "processes": [], **fields}


def test_busy_is_a_process_or_a_tenth_of_the_memory():
    assert gpus.busy_reason(gpu()) is None
    assert gpus.busy_reason(gpu(memory_used=4096)) is None
    assert gpus.busy_reason(gpu(memory_used=4097)) == \
        "4097 of 40960 MiB in use, no process visible"
    held = gpu(processes=[{"pid": 7, "user": "nobody", "used_memory": 10, "name": "python"}])
    assert gpus.busy_reason(held) == "held by nobody (pid 7)"
    assert gpus.busy_reason(gpu(memory_total=None, memory_used=None)) is None


@pytest.fixture
def host(tmp_path, monkeypatch):
    """A host of four GPUs (GPU 1 held by a process, GPU 3 full), leases in tmp_path."""
    monkeypatch.setattr(gpus, "LEASES", str(tmp_path / "leases"))
    found = gpus.parse_gpus(GPUS)
    found[1]["processes"] = [{"pid": 4242, "user": "nobody", "used_memory": 20470,
                              "name": "python3"}]
    monkeypatch.setattr(gpus, "query", lambda: {"gpus": found, "note": None})
    return found


def test_n_free_gpus_skip_the_busy_and_the_leased(host):
    me = [os.getpid()]
    assert gpus.place(2, "run-a", False, me) == {"indices": [0, 2], "problem": None}
    # A second run at the same moment: GPUs 0 and 2 are leased, 1 and 3 busy.
    second = gpus.place(1, "run-b", False, me)
    assert second["indices"] == [] and second["problem"].startswith("1 GPU(s) wanted, 0 free")
    assert "GPU 0 leased by run run-a" in second["problem"]
    assert gpus.release("run-a") == 2
    assert gpus.place(1, "run-b", False, me)["indices"] == [0]


def test_every_free_gpu_and_a_listed_busy_one(host):
    me = [os.getpid()]
    assert gpus.place("free", "run-a", False, me)["indices"] == [0, 2]
    gpus.release("run-a")
    refused = gpus.place([1], "run-a", False, me)
    assert refused == {"indices": [], "problem": "GPU 1 is busy: held by nobody (pid 4242) "
                                                 "(--allow-busy-gpus runs anyway)"}
    assert gpus.place([1], "run-a", True, me)["indices"] == [1]
    assert gpus.place([7], "run-c", False, me)["problem"] == \
        "GPU 7 does not exist (GPUs: 0, 1, 2, 3)"
    three = gpus.place(3, "run-c", False, me)
    assert three["problem"].startswith("3 GPU(s) wanted, 2 free of 4: GPU 1 ")
    assert gpus.leases_of("run-c") == []          # a refusal leases nothing


def test_a_lease_whose_processes_are_gone_is_stale(host, tmp_path):
    gone = 2 ** 22 + 17                            # past any pid this machine gives
    assert gpus.place([0], "run-old", False, [gone])["indices"] == [0]
    assert gpus.place([0], "run-new", False, [os.getpid()])["indices"] == [0]
    assert [lease["run_id"] for _, lease in gpus.leases_of("run-new")] == ["run-new"]
    gpus.hold("run-new", [os.getpid()])
    (path, lease), = gpus.leases_of("run-new")
    assert json.loads(open(path).read())["pids"] == [os.getpid()]
    assert oct(os.stat(path).st_mode & 0o777) == "0o644"    # whose run holds it: for all


def test_a_link_planted_as_a_lease_holds_the_gpu(host, tmp_path):
    gpus.place("free", "run-a", False, [os.getpid()])
    gpus.release("run-a")
    os.symlink(tmp_path / "elsewhere", gpus._lease_path("GPU-5c5b0001"))
    assert gpus.place(1, "run-a", False, [os.getpid()])["indices"] == [2]
    assert not (tmp_path / "elsewhere").exists()


@pytest.mark.parametrize("gpus_field, workers", [(2, 2), ("free", 1)])
def test_the_gpu_forms_as_written(tmp_path, gpus_field, workers):
    """`gpus: N` plans N tasks, `gpus: free` one placeholder until the host says: each shows
    the GPU as one the host chooses, memory growth on."""
    path = tmp_path / "hosts.yaml"
    path.write_text(json.dumps({"hosts": [{"name": "g", "address": "10.0.0.1",
                                           "gpus": gpus_field}]}))
    inventory = load_inventory(path)
    plan = plan_run(inventory, Options(), "20261204-000000-abcdef")
    assert len(plan.tasks) == workers
    env = {k: v.shown() for k, v in plan.tasks[0].env.items()}
    assert env["CUDA_VISIBLE_DEVICES"] == "<a free GPU>"
    assert env["TF_FORCE_GPU_ALLOW_GROWTH"] == "true"
    assert plan.tasks[0].launch.message.nccl_address == "10.0.0.1"


@pytest.mark.parametrize("field, words", [
    ({"gpus": 0}, "a number of free GPUs must be 1 to 128"),
    ({"gpus": "some"}, "or all, not 'some'"),
    ({"gpus": 2, "workers": 2}, "gpus: 2 gives one task per free GPU, 2 of them"),
    ({"forward_env": "NCCL_*"}, "must be a list of variable names or globs"),
    ({"forward_env": ["TFDEPLOY_RUN_ID"]}, "is set by tfdeploy itself"),
])
def test_bad_gpu_and_forward_env_fields(tmp_path, field, words):
    path = tmp_path / "hosts.yaml"
    path.write_text(json.dumps({"hosts": [{"name": "g", "address": "10.0.0.1", **field}]}))
    with pytest.raises(InventoryError, match=words.replace("*", r"\*").replace("(", r"\(")):
        load_inventory(path)


def test_forward_env_passes_the_controllers_variables_masked(tmp_path, monkeypatch):
    monkeypatch.setenv("NCCL_DEBUG", "INFO")
    monkeypatch.setenv("NCCL_IB_DISABLE", "1")
    monkeypatch.setenv("WANDB_API_KEY", "s3cret")
    monkeypatch.setenv("TFDEPLOY_X", "never")
    path = tmp_path / "hosts.yaml"
    path.write_text(json.dumps({"defaults": {"forward_env": ["NCCL_*", "WANDB_API_KEY",
                                                             "TFDEPLOY_*", "NOT_SET"]},
                                "hosts": [{"name": "g", "address": "10.0.0.1",
                                           "env": {"NCCL_IB_DISABLE": "0"}}]}))
    (host,) = load_inventory(path).hosts
    assert {k: (v.value, v.secret) for k, v in host.env.items()} == {
        "NCCL_DEBUG": ("INFO", True), "NCCL_IB_DISABLE": ("0", False),
        "WANDB_API_KEY": ("s3cret", True)}


def test_the_interface_of_a_loopback_address_and_name():
    """NCCL_SOCKET_IFNAME for a host reached on loopback: an address of 127.0.0.0/8 and a name
    that resolves to one are both the loopback interface's."""
    loopback = gpus.interface_of("127.0.0.1")
    assert loopback is not None
    assert gpus.interface_of("127.0.0.5") == loopback
    assert gpus.interface_of("localhost") == loopback         # /etc/hosts, not DNS


def test_socket_calls_get_an_ascii_host_as_bytes():
    """Given as text, a host goes through the idna codec, which an agent would import for it."""
    from deploy.host.probe import socket_host
    assert socket_host("127.0.0.1") == b"127.0.0.1"
    assert socket_host("gpu-07.lab") == b"gpu-07.lab"
    assert socket_host("bücher.lab") == "bücher.lab"
