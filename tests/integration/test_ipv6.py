"""Hosts reached over IPv6: two real sshd on ::1 (the one IPv6 address a test may use here),
each on its own port with its own workdir. Logins (by a bare address, a bracketed one, an ssh
config HostName and through a gateway), the mesh check, and a real two-worker TensorFlow run
whose TF_CONFIG addresses are bracketed."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from procs import wait_until_gone
from sshlab import SshLab, ipv6_loopback_missing


REPO = Path(__file__).resolve().parents[2]
QUICK = "--epochs 2 --steps-per-epoch 5"


def inv(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=REPO, text=True,
                          capture_output=True, timeout=300,
                          env={**os.environ, "COLUMNS": "200"})     # the check table whole


def row(out: str, name: str) -> str:
    return next(line for line in out.splitlines() if f" {name} " in line)


@pytest.fixture(scope="module")
def v6_lab(tmp_path_factory):
    missing = ipv6_loopback_missing()
    if missing:
        pytest.skip(missing)
    with SshLab(tmp_path_factory.mktemp("v6lab")) as lab:
        yield lab, lab.start(2, ipv6=True)


def test_two_hosts_on_ipv6_check_and_train_with_bracketed_tf_config(v6_lab, tmp_path):
    lab, (h1, h2) = v6_lab
    assert h1.address == h2.address == "::1" and h1.port != h2.port
    # h1 by an ssh config alias whose HostName is ::1, h2 by its address in brackets.
    config = tmp_path / "ssh_config"
    config.write_text(f"Host v6-{h1.name}\n    HostName ::1\n    Port {h1.port}\n")
    inventory = lab.write_inventory(tmp_path / "v6.yaml", [h1, h2], ssh_config=str(config),
                                    per_host={h1.name: {"address": f"v6-{h1.name}",
                                                        "port": None},
                                              h2.name: {"address": "[::1]"}})

    plan = inv("train", "--hosts", str(inventory), "--dry-run")
    assert plan.returncode == 0, plan.stdout + plan.stderr
    text = " ".join(plan.stdout.split())
    assert 'cluster: {"worker":["[::1]:<port>","[::1]:<port>"]}' in text
    assert f"(ssh {lab.user}@[::1]:{h1.port} (alias v6-{h1.name}))" in text
    assert f"(ssh {lab.user}@[::1]:{h2.port})" in text

    check = inv("check", "--hosts", str(inventory))
    assert check.returncode == 0, check.stdout + check.stderr
    assert "all checks passed" in check.stdout
    assert "(cluster ::1)" in row(check.stdout, h1.name)
    assert " ok " in row(check.stdout, h1.name) and " ok " in row(check.stdout, h2.name)

    runs = tmp_path / "runs"
    done = inv("train", "--hosts", str(inventory), "--runs-dir", str(runs), "--args", QUICK)
    assert done.returncode == 0, done.stdout + done.stderr
    (run_dir,) = [p for p in runs.iterdir() if p.is_dir()]
    plan_doc = json.loads((run_dir / "plan.json").read_text())
    tasks = [t for h in plan_doc["hosts"] for t in h["tasks"]]
    cluster = tasks[0]["tf_config"]["cluster"]["worker"]
    assert len(cluster) == 2 and all(w.startswith("[::1]:") for w in cluster), cluster
    assert len({w.rsplit(":", 1)[1] for w in cluster}) == 2        # one port per task
    for i, task in enumerate(tasks):                               # what each task was given
        assert json.loads(task["env"]["TF_CONFIG"]) == {
            "cluster": {"worker": cluster}, "task": {"type": "worker", "index": i}}
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["exit_code"] == 0 and [t["exit_code"] for t in summary["tasks"]] == [0, 0]
    assert summary["losses_agree"] is True
    losses = [t["losses"] for t in summary["tasks"]]
    assert len(losses[0]) == 2 and losses[0] == losses[1]
    assert wait_until_gone(run_dir.name, timeout=5) == []
    for host in (h1, h2):
        assert not (Path(host.workdir) / "runs" / run_dir.name).exists(), host


def test_a_host_behind_an_ipv6_gateway_is_checked_through_it(v6_lab, tmp_path):
    lab, (h1, h2) = v6_lab
    jump = f"{lab.user}@[::1]:{h1.port}"
    inventory = lab.write_inventory(tmp_path / "v6gw.yaml", [h2], ssh_config="none", jump=jump,
                                    workdir=str(tmp_path / "work"))
    logins = h1.log.read_text().count("Accepted publickey")
    check = inv("check", "--hosts", str(inventory))
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"via {jump}" in row(check.stdout, h2.name)
    assert h1.log.read_text().count("Accepted publickey") == logins + 1   # the gateway login
