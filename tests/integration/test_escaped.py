"""Processes that leave their task's process group (setsid, a double fork) end with the run:
teardown finds them by the run's TFDEPLOY_RUN_ID, after a run that ended by itself and after
`inv down` of a detached run. Real sshd hosts on loopback; the lab hosts are this machine, so
/proc here shows every host's processes."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from procs import ESCAPING_PAYLOAD, escaped_pids, processes_of_run, wait_until_gone


REPO = Path(__file__).resolve().parents[2]


def inv(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=REPO, text=True,
                          capture_output=True, timeout=300)


@pytest.fixture
def escaping(ssh_lab, tmp_path):
    """(inventory, hosts, payload, runs dir); whatever a run left is killed afterwards."""
    payload = tmp_path / "payload"
    payload.mkdir()
    (payload / "escape.py").write_text(ESCAPING_PAYLOAD)
    runs = tmp_path / "runs"
    hosts = ssh_lab.hosts[:2]
    yield ssh_lab.write_inventory(tmp_path / "lab.yaml", hosts), hosts, payload, runs
    for run in runs.iterdir() if runs.exists() else ():
        for pid in processes_of_run(run.name):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def run_id_of(runs: Path) -> str:
    (run,) = [p for p in runs.iterdir() if p.is_dir()]
    return run.name


def assert_gone(run_id: str, hosts) -> None:
    assert wait_until_gone(run_id, timeout=5) == []
    for host in hosts:
        assert not (Path(host.workdir) / "runs" / run_id).exists(), host


def test_processes_that_left_their_group_end_with_the_run(escaping):
    inventory, hosts, payload, runs = escaping
    done = inv("train", "--hosts", str(inventory), "--runs-dir", str(runs),
               "--payload", str(payload), "--entry", "escape.py", "--no-check")
    assert done.returncode == 0, done.stdout + done.stderr
    run_id = run_id_of(runs)
    for i in range(len(hosts)):
        # Each task left two processes behind it when it exited (both were alive then).
        assert len(escaped_pids((runs / run_id / f"worker-{i}.log").read_text())) == 2
    assert_gone(run_id, hosts)


def test_inv_down_ends_the_processes_that_left_their_group(escaping):
    inventory, hosts, payload, runs = escaping
    started = inv("train", "--hosts", str(inventory), "--runs-dir", str(runs),
                  "--payload", str(payload), "--entry", "escape.py", "--no-check",
                  "--detach", "--args", "--wait")
    assert started.returncode == 0, started.stdout + started.stderr
    run_id = run_id_of(runs)
    logs = [Path(h.workdir) / "runs" / run_id / f"worker-{i}.log" for i, h in enumerate(hosts)]
    deadline = time.monotonic() + 30
    while not all(p.exists() and "escaped " in p.read_text() for p in logs):
        assert time.monotonic() < deadline, "the payload never reported its escapes"
        time.sleep(0.1)
    escaped = [pid for p in logs for pid in escaped_pids(p.read_text())]
    assert set(escaped) <= set(processes_of_run(run_id))
    down = inv("down", "--run", run_id, "--runs-dir", str(runs))
    assert down.returncode == 0, down.stdout + down.stderr
    assert_gone(run_id, hosts)
