"""The inventory's `data:` on real sshd servers with real TensorFlow: per-host local shards
pushed once and kept on each host by content (a second run sends nothing and finds the same
directory), a remote data path that is not there (the check names host and field, nothing
starts), and a two-task host on SSH (two ports, both tasks train, on the host's remote data)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from procs import wait_until_gone


REPO = Path(__file__).resolve().parents[2]
TINY = "--epochs 1 --steps-per-epoch 2"


def inv(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=REPO, text=True,
                          capture_output=True, timeout=300, env={**os.environ, "COLUMNS": "400"})


def flat(text: str) -> str:
    return " ".join(text.split())


def write_shard(path: Path, examples: int, seed: int) -> None:
    """An .npz shard in the payload's format: x (examples x 20 features), y (labels 0..3)."""
    rng = np.random.default_rng(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, x=rng.standard_normal((examples, 20)).astype("float32"),
             y=rng.integers(0, 4, examples))


def train(inventory: Path, runs: Path) -> tuple[subprocess.CompletedProcess, Path]:
    before = set(runs.iterdir()) if runs.exists() else set()
    done = inv("train", "--hosts", str(inventory), "--runs-dir", str(runs), "--args", TINY)
    (run_dir,) = {p for p in runs.iterdir() if p.is_dir()} - before
    assert wait_until_gone(run_dir.name, timeout=5) == []
    return done, run_dir


def data_events(run_dir: Path, task: int) -> list[dict]:
    lines = (run_dir / f"worker-{task}.log").read_text().splitlines()
    return [json.loads(line) for line in lines if line.startswith('{"event": "data"')]


def test_each_host_trains_on_its_own_shard_and_the_second_run_sends_no_data(ssh_lab, tmp_path):
    hosts = ssh_lab.hosts[:2]
    workdirs = {h.name: tmp_path / f"work-{h.name}" for h in hosts}
    write_shard(tmp_path / "shards" / "a" / "shard-a.npz", 48, seed=1)
    write_shard(tmp_path / "shards" / "b" / "shard-b.npz", 80, seed=2)
    # Relative to the inventory file's directory.
    inventory = ssh_lab.write_inventory(tmp_path / "lab.yaml", hosts, per_host={
        h.name: {"workdir": str(workdirs[h.name]), "data": {"local": f"shards/{shard}"}}
        for h, shard in zip(hosts, "ab")})
    runs = tmp_path / "runs"

    first, run_dir = train(inventory, runs)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "data: 2 of 2 file(s) new" in first.stdout and "→ 2 of 2 host(s)" in first.stdout
    # Each task trained on its own host's shard: the payload says which file and how many.
    for task, (name, examples) in enumerate([("shard-a.npz", 48), ("shard-b.npz", 80)]):
        (event,) = data_events(run_dir, task)
        assert (event["files"], event["examples"], event["synthetic"]) == ([name], examples, False)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert [t["exit_code"] for t in summary["tasks"]] == [0, 0] and summary["losses_agree"]
    sent = json.loads((run_dir / "data.json").read_text())["hosts"]
    inodes = {}
    for host, shard in zip(hosts, "ab"):
        record = sent[host.name]
        size = (tmp_path / "shards" / shard / f"shard-{shard}.npz").stat().st_size
        assert record["source"] == f"local shards/{shard}" and record["present"] is False
        assert len(record["received"]) == 1 and record["bytes"] == size
        # Kept outside the run directory, which teardown removed.
        data_dir = workdirs[host.name] / "data" / record["tree"]
        assert record["dir"] == str(data_dir)
        assert (data_dir / f"shard-{shard}.npz").stat().st_size == size
        assert list((workdirs[host.name] / "runs").iterdir()) == []
        inodes[host.name] = data_dir.stat().st_ino

    second, run_dir = train(inventory, runs)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "data: 0 of 2 file(s) new (0 B) → 0 of 2 host(s)" in second.stdout
    sent_again = json.loads((run_dir / "data.json").read_text())["hosts"]
    for task, host in enumerate(hosts):
        record = sent_again[host.name]
        assert record["present"] is True and record["received"] == [] and record["bytes"] == 0
        assert record["tree"] == sent[host.name]["tree"]
        data_dir = workdirs[host.name] / "data" / record["tree"]
        assert data_dir.stat().st_ino == inodes[host.name]          # found, not copied again
        assert [p.name for p in (workdirs[host.name] / "data").iterdir()] == [record["tree"]]
        assert data_events(run_dir, task)[0]["examples"] == (48, 80)[task]


def test_a_missing_remote_data_path_fails_the_check_and_nothing_starts(ssh_lab, tmp_path):
    hosts = ssh_lab.hosts[:2]
    workdirs = {h.name: tmp_path / f"work-{h.name}" for h in hosts}
    missing = tmp_path / "no-such-dataset"
    inventory = ssh_lab.write_inventory(tmp_path / "lab.yaml", hosts, per_host={
        hosts[0].name: {"workdir": str(workdirs[hosts[0].name])},
        hosts[1].name: {"workdir": str(workdirs[hosts[1].name]),
                        "data": {"remote": str(missing)}}})
    problem = (f"{hosts[1].name} ({hosts[1].address}): field 'data': remote path {missing} "
               "does not exist on the host")

    checked = inv("check", "--hosts", str(inventory))
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert problem in flat(checked.stdout)
    assert f"{hosts[0].name} ({hosts[0].address}): field 'data'" not in flat(checked.stdout)

    runs = tmp_path / "runs"
    done = inv("train", "--hosts", str(inventory), "--runs-dir", str(runs), "--args", TINY)
    assert done.returncode == 1, done.stdout + done.stderr
    assert problem in flat(done.stdout) and "nothing was started" in flat(done.stdout)
    for workdir in workdirs.values():
        assert not workdir.exists()               # the checks write nothing on any host
    assert not missing.exists()


def test_a_two_task_host_on_ssh_gets_two_ports_and_both_tasks_train(ssh_lab, tmp_path):
    (host,) = ssh_lab.hosts[:1]
    workdir = tmp_path / "work"
    dataset = tmp_path / "on-the-host" / "dataset"     # "already on the host": a remote path
    write_shard(dataset / "part-0.npz", 40, seed=3)
    write_shard(dataset / "part-1.npz", 24, seed=4)
    inventory = ssh_lab.write_inventory(tmp_path / "lab.yaml", [host], workers=2,
                                        workdir=str(workdir), data={"remote": str(dataset)})
    runs = tmp_path / "runs"
    done, run_dir = train(inventory, runs)
    assert done.returncode == 0, done.stdout + done.stderr
    plan = json.loads((run_dir / "plan.json").read_text())
    (host_doc,) = plan["hosts"]
    configs = [t["tf_config"] for t in host_doc["tasks"]]
    cluster = configs[0]["cluster"]["worker"]
    assert len(cluster) == 2 and len({e.rsplit(":", 1)[1] for e in cluster}) == 2
    assert [c["task"]["index"] for c in configs] == [0, 1]
    assert all(c["cluster"]["worker"] == cluster for c in configs)
    assert host_doc["data"] == {"source": f"remote {dataset}", "dir": str(dataset)}
    summary = json.loads((run_dir / "summary.json").read_text())
    assert [(t["exit_code"], t["host"]) for t in summary["tasks"]] == [(0, host.name)] * 2
    assert summary["losses_agree"] is True and all(len(t["losses"]) == 1
                                                   for t in summary["tasks"])
    for task in (0, 1):
        assert f"[worker-{task} {host.name}]" in done.stdout
        (event,) = data_events(run_dir, task)
        assert (event["files"], event["examples"]) == (["part-0.npz", "part-1.npz"], 64)
    assert not (run_dir / "data.json").read_text().count('"received"')   # nothing pushed
    assert list((workdir / "runs").iterdir()) == [] and not (workdir / "data").exists()
