"""The lab itself: real sshd servers reachable with strict host key checking, and procs.py."""
from __future__ import annotations

import getpass
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import paramiko
import pytest
import yaml

from procs import processes_of_run, wait_until_gone
from sshlab import LabHost, SshLab


def connect(host: LabHost) -> paramiko.SSHClient:
    """A strict client: only the lab's known_hosts, unknown hosts rejected, only the lab key."""
    client = paramiko.SSHClient()
    client.load_host_keys(str(host.known_hosts))
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    client.connect(host.address, port=host.port, username=getpass.getuser(),
                   key_filename=str(host.identity_file), look_for_keys=False,
                   allow_agent=False, timeout=10, banner_timeout=10, auth_timeout=10)
    return client


def run(client: paramiko.SSHClient, command: str) -> str:
    _, stdout, stderr = client.exec_command(command, timeout=10)
    out = stdout.read().decode()
    status = stdout.channel.recv_exit_status()
    assert status == 0, f"{command!r} exited {status}: {stderr.read().decode()}"
    return out


def test_each_host_sees_its_own_address(ssh_lab):
    assert len(ssh_lab.hosts) == 2
    for host in ssh_lab.hosts:
        with connect(host) as client:
            # SSH_CONNECTION = "client_ip client_port server_ip server_port"
            fields = run(client, 'printf %s "$SSH_CONNECTION"').split()
        assert fields[2:] == [host.address, str(host.port)], fields


def test_hosts_are_distinct(ssh_lab):
    h1, h2 = ssh_lab.hosts
    assert (h1.name, h2.name) == ("h1", "h2")
    assert (h1.address, h2.address) == ("127.0.0.2", "127.0.0.3")
    assert h1.workdir != h2.workdir
    assert h1.host_key.read_text() != h2.host_key.read_text()


def test_sftp_put(ssh_lab, tmp_path):
    local = tmp_path / "hello.txt"
    local.write_text("hello from the controller\n")
    for host in ssh_lab.hosts:
        remote = host.workdir.parent / f"sftp-{uuid.uuid4().hex}.txt"
        with connect(host) as client, client.open_sftp() as sftp:
            sftp.put(str(local), str(remote))
            assert sftp.stat(str(remote)).st_size == local.stat().st_size
        assert remote.read_text() == local.read_text()    # the same machine, after all
        remote.unlink()


def test_unrecorded_host_key_is_rejected_and_lab_stops_its_servers(tmp_path):
    with SshLab(tmp_path / "lab") as lab:
        (host,) = lab.start(1, record_host_keys=False)
        (pid,) = lab.pids
        with pytest.raises(paramiko.SSHException, match="not found in known_hosts"):
            connect(host)
        with open(host.known_hosts, "a") as f:
            f.write(host.known_hosts_line())
        with connect(host) as client:
            assert run(client, "echo ok") == "ok\n"
    assert lab.pids == []
    assert not _alive(pid), f"sshd {pid} still running after the lab stopped"


def test_inventory_yaml(ssh_lab, tmp_path):
    h1, h2 = ssh_lab.hosts
    path = ssh_lab.write_inventory(tmp_path / "hosts.yaml", [h1, h2], python="/usr/bin/python3",
                                   workers=2, per_host={"h2": {"workers": 1}})
    data = yaml.safe_load(path.read_text())
    assert data["defaults"] == {"user": ssh_lab.user, "identity_file": str(h1.identity_file),
                                "known_hosts": str(h1.known_hosts), "python": "/usr/bin/python3"}
    assert data["hosts"] == [
        {"name": "h1", "address": "127.0.0.2", "port": h1.port, "workdir": str(h1.workdir),
         "workers": 2},
        {"name": "h2", "address": "127.0.0.3", "port": h2.port, "workdir": str(h2.workdir),
         "workers": 1},
    ]


def test_processes_of_run_finds_a_local_process():
    run_id = f"test-{uuid.uuid4().hex}"
    proc = subprocess.Popen(["sleep", "30"], env={**os.environ, "TFDEPLOY_RUN_ID": run_id})
    try:
        # Between fork and exec the child still has its parent's environment: wait for exec.
        assert wait_for_processes(run_id) == [proc.pid]
        assert processes_of_run(run_id + "-other") == []
        os.kill(proc.pid, signal.SIGKILL)
        # Not reaped yet, so a zombie for a while: it must not count.
        assert wait_until_gone(run_id, timeout=5) == []
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def test_processes_of_run_finds_a_process_started_over_ssh(ssh_lab):
    run_id = f"test-{uuid.uuid4().hex}"
    host = ssh_lab.hosts[0]
    with connect(host) as client:
        # Without a pty nothing hangs up the sleep when the session ends; it is ours to end.
        run(client, f"TFDEPLOY_RUN_ID={run_id} nohup sleep 30 >/dev/null 2>&1 </dev/null &")
    pids = wait_for_processes(run_id)
    try:
        assert len(pids) == 1, pids
    finally:
        for pid in pids:
            _kill(pid)
    assert wait_until_gone(run_id, timeout=5) == []


def wait_for_processes(run_id: str, timeout: float = 5.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while not (pids := processes_of_run(run_id)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return pids


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return stat.rpartition(b")")[2].split()[0] != b"Z"


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
