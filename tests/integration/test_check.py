"""`inv check` and the checks `inv train` runs first, against real sshd servers: a healthy lab,
a host where nothing listens, a host without its python, and a network-namespace host whose
mesh link is cut while SSH still reaches it."""
from __future__ import annotations

import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

import pytest

from netns import NetnsHost, NetnsUnavailable
from sshlab import SshLab, unreachable_entry

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def inv(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=REPO, text=True,
                          capture_output=True, timeout=300,
                          env={"COLUMNS": "200", "PATH": "/usr/bin:/bin", "HOME": str(Path.home())})


def flat(text: str) -> str:
    return " ".join(text.split())


def nothing_written(host) -> bool:
    return not Path(host.workdir).exists()


def test_healthy_lab_passes_with_versions_in_the_table(ssh_lab, tmp_path):
    hosts = ssh_lab.hosts[:2]
    inventory = ssh_lab.write_inventory(tmp_path / "lab.yaml", hosts, per_host={
        hosts[1].name: {"workers": 2}})
    done = inv("check", "--hosts", str(inventory))
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    for host in hosts:
        row = next(line for line in out.splitlines() if f" {host.name} " in line)
        assert host.address in row
        for package in ("tensorflow", "tf_keras", "numpy"):
            assert metadata.version(package) in row
        assert " ok " in row           # mesh and problems
    assert "all checks passed" in out
    assert all(nothing_written(h) for h in hosts), "checking writes nothing on the hosts"


def test_nothing_listening_and_missing_python_are_named_in_seconds(tmp_path):
    with SshLab(tmp_path / "lab") as lab:
        (host,) = lab.start(1)
        gone = unreachable_entry()
        inventory = lab.write_inventory(tmp_path / "hosts.yaml", [host], extra=[gone, {
            "name": "nopy", "address": host.address, "port": host.port,
            "workdir": tmp_path / "w2", "python": "/nonexistent/python3"}])
        started = time.monotonic()
        done = inv("check", "--hosts", str(inventory), "--connect-timeout", "3")
        took = time.monotonic() - started
        out = flat(done.stdout)
        assert done.returncode == 1, done.stdout + done.stderr
        assert took < 30, took
        assert f"gone (127.0.0.9): cannot connect to port {gone['port']}" in out
        assert (f"nopy ({host.address}): python '/nonexistent/python3' does not run there: "
                in out and "No such file or directory" in out)
        # The healthy host still got its row and checked its ports.
        assert metadata.version("tensorflow") in done.stdout
        assert nothing_written(host)


@pytest.fixture
def netns_host():
    try:
        with NetnsHost() as ns:
            yield ns
    except NetnsUnavailable as exc:
        pytest.skip(str(exc))


def test_cut_mesh_link_is_named_and_train_starts_nothing(netns_host, tmp_path):
    ns = netns_host
    with SshLab(tmp_path / "lab", first_octet=40) as lab:
        (a,) = lab.start(1)
        b = lab.start_in_netns(ns.name, ns.ctl_ns)
        inventory = lab.write_inventory(tmp_path / "hosts.yaml", [a, b], per_host={
            a.name: {"cluster_address": ns.mesh_root}, b.name: {"cluster_address": ns.mesh_ns}})
        # Healthy first: the namespace host is reachable over the mesh link.
        done = inv("check", "--hosts", str(inventory))
        assert done.returncode == 0, done.stdout + done.stderr

        ns.cut_mesh()
        started = time.monotonic()
        done = inv("check", "--hosts", str(inventory))
        took = time.monotonic() - started
        out = flat(done.stdout)
        assert done.returncode == 1, done.stdout + done.stderr
        assert took < 30, took
        assert f"{b.name} ({ns.mesh_ns}): port " in out and f"not reachable from {a.name}" in out
        assert f"{a.name} ({ns.mesh_root}): port " in out and f"not reachable from {b.name}" in out

        runs = tmp_path / "runs"
        done = inv("train", "--hosts", str(inventory), "--runs-dir", str(runs),
                   "--args", "--epochs 1 --steps-per-epoch 2")
        assert done.returncode == 1, done.stdout + done.stderr
        assert f"not reachable from {a.name}" in flat(done.stdout)
        assert "nothing was started" in flat(done.stdout)
        assert not runs.exists()
        assert nothing_written(a) and nothing_written(b)
