"""`inv check` and the checks `inv train` runs first, against real sshd servers: a healthy lab,
a host where nothing listens, a connect that hangs, a host without its python, and a
network-namespace host whose mesh link is cut while SSH still reaches it."""
from __future__ import annotations

import socket
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from netns import NetnsHost, NetnsUnavailable

from sshlab import SshLab, unreachable_entry


REPO = Path(__file__).resolve().parents[2]


def inv(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=REPO, text=True,
                          capture_output=True, timeout=timeout,
                          env={"COLUMNS": "200", "PATH": "/usr/bin:/bin", "HOME": str(Path.home())})


def flat(text: str) -> str:
    return " ".join(text.split())


def nothing_written(host) -> bool:
    return not Path(host.workdir).exists()


def tree(host) -> dict[str, tuple[int, int]] | None:
    """Every file and folder under a host's workdir with its size and modification time;
    None when there is no workdir. The session's lab is shared, so earlier tests may have
    left a workdir behind: a check must leave it as it found it."""
    top = Path(host.workdir)
    if not top.exists():
        return None
    return {str(p.relative_to(top)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in [top, *top.rglob("*")]}


def test_healthy_lab_passes_with_versions_in_the_table(ssh_lab, tmp_path):
    hosts = ssh_lab.hosts[:2]
    inventory = ssh_lab.write_inventory(tmp_path / "lab.yaml", hosts, per_host={
        hosts[1].name: {"workers": 2}})
    before = [tree(h) for h in hosts]
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
    assert [tree(h) for h in hosts] == before, "checking writes nothing on the hosts"


def test_nothing_listening_and_missing_python_are_named(tmp_path):
    with SshLab(tmp_path / "lab") as lab:
        (host,) = lab.start(1)
        gone = unreachable_entry()
        inventory = lab.write_inventory(tmp_path / "hosts.yaml", [host], extra=[gone, {
            "name": "nopy", "address": host.address, "port": host.port,
            "workdir": tmp_path / "w2", "python": "/nonexistent/python3"}])
        done = inv("check", "--hosts", str(inventory), "--connect-timeout", "3")
        out = flat(done.stdout)
        assert done.returncode == 1, done.stdout + done.stderr
        assert f"gone (127.0.0.9): cannot connect to port {gone['port']}" in out
        assert (f"nopy ({host.address}): python '/nonexistent/python3' does not run there: "
                in out and "No such file or directory" in out)
        # The healthy host still got its row and checked its ports.
        assert metadata.version("tensorflow") in done.stdout
        assert nothing_written(host)


def test_a_connect_that_hangs_ends_at_a_fraction_of_a_second_timeout(tmp_path):
    """A listener whose accept queue is full: the kernel drops further SYNs, so a connect to
    it hangs until its timeout (a loopback stand-in for a firewalled host). A timeout under one
    second must still be one: rounded down to 0 it would be none, and the command would hang
    for the kernel's SYN retries (minutes), past this test's limit."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(0)
        port = server.getsockname()[1]
        fillers = [socket.socket() for _ in range(3)]
        try:
            for filler in fillers:
                filler.setblocking(False)
                filler.connect_ex(("127.0.0.1", port))
            inventory = tmp_path / "stuck.yaml"
            inventory.write_text("hosts:\n  - {name: stuck, address: 127.0.0.1, port: %d, "
                                 "ssh_config: none}\n" % port)
            done = inv("check", "--hosts", str(inventory), "--connect-timeout", "0.5",
                       timeout=60)
        finally:
            for filler in fillers:
                filler.close()
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"stuck (127.0.0.1): no answer on port {port} (timed out)" in flat(done.stdout)


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
        done = inv("check", "--hosts", str(inventory))
        out = flat(done.stdout)
        assert done.returncode == 1, done.stdout + done.stderr
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


def test_bad_input_exits_2_and_contacts_no_host(tmp_path):
    missing = inv("check", "--hosts", str(tmp_path / "nope.yaml"))
    assert missing.returncode == 2 and "nope.yaml: cannot read inventory" in flat(missing.stdout)
    duplicate = tmp_path / "dup.yaml"
    # SSH addresses on loopback where nothing listens: even a lint that let this through
    # would dial nothing but this machine (cluster addresses are dialled only by hosts).
    duplicate.write_text(
        "hosts:\n  - {name: a, address: 127.0.0.9, port: 1, cluster_address: 10.1.2.3}\n"
        "  - {name: b, address: 127.0.0.10, port: 1, cluster_address: 10.1.2.3}\n")
    done = inv("check", "--hosts", str(duplicate))
    assert done.returncode == 2, done.stdout + done.stderr
    assert "host 'b': cluster address '10.1.2.3' is also that of host 'a'" in flat(done.stdout)
    assert "cannot connect" not in done.stdout      # refused before any connection
    local = tmp_path / "local.yaml"
    local.write_text("hosts:\n  - {name: here, transport: local}\n")
    timeout = inv("check", "--hosts", str(local), "--connect-timeout", "soon")
    assert timeout.returncode == 2
    assert "--connect-timeout takes a number of seconds" in timeout.stdout
    assert "not 'soon'" in timeout.stdout


def test_sixteen_hosts_check_their_whole_mesh(tmp_path):
    """Many hosts take longer to start their probes than a probe's window: every listener
    stays open until every host has dialed (deploy/run/mesh.py)."""
    with SshLab(tmp_path / "lab") as lab:
        hosts = lab.start(16)
        inventory = lab.write_inventory(tmp_path / "hosts.yaml", hosts)
        done = inv("check", "--hosts", str(inventory))
        assert done.returncode == 0, done.stdout + done.stderr
        assert "all checks passed" in done.stdout
        for host in hosts:
            row = next(line for line in done.stdout.splitlines() if f" {host.name} " in line)
            assert " ok " in row
