"""Parameter-server clusters on four SSH hosts with real TensorFlow: a chief, a host with two
workers, a ps and an evaluator, each with its own workdir; the run ends with the chief."""
from __future__ import annotations

import ctypes
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from procs import end, processes_of_run, wait_until_gone
from sshlab import SshLab
from test_train import inv, only_run


REPO = Path(__file__).resolve().parents[2]
ROLES = {"h1": {"role": "chief"}, "h2": {"workers": 2}, "h3": {"role": "ps"},
         "h4": {"role": "evaluator"}}
LOGS = ("chief-0", "worker-0", "worker-1", "ps-0", "evaluator-0")


@pytest.fixture(scope="module")
def ps_lab(tmp_path_factory):
    with SshLab(tmp_path_factory.mktemp("pslab"), first_octet=40) as lab:
        lab.start(4)
        yield lab


@pytest.fixture
def ps_setup(ps_lab, tmp_path):
    """The inventory, and a payload copy whose entry pstest.py holds the chief after its
    second epoch until the file <checkpoints>/go exists (tests that need the chief running
    while they act): the default payload's train.py --strategy ps otherwise."""
    hosts = ps_lab.hosts
    inventory = ps_lab.write_inventory(tmp_path / "ps.yaml", hosts,
                                       per_host={h.name: ROLES[h.name] for h in hosts})
    payload = tmp_path / "payload"
    shutil.copytree(REPO / "payload", payload, ignore=shutil.ignore_patterns("__pycache__"))
    (payload / "pstest.py").write_text(
        "import os, sys, time\n"
        "import tf_keras as keras\n"
        "import train\n"
        "class Hold(keras.callbacks.Callback):\n"
        "    def on_epoch_end(self, epoch, logs=None):\n"
        "        go = os.path.join(sys.argv[sys.argv.index('--checkpoint-dir') + 1], 'go')\n"
        "        while epoch == 1 and not os.path.exists(go):\n"
        "            time.sleep(0.2)\n"
        "sys.exit(train.main(callbacks=[Hold()]))\n")
    checkpoints = tmp_path / "checkpoints"     # what the chief and the evaluator both see
    return inventory, hosts, payload, checkpoints


def events(log: str, kind: str) -> list[dict]:
    found = []
    for line in log.splitlines():
        if line.startswith("{") and f'"event": "{kind}"' in line:
            found.append(json.loads(line))
    return found


def test_dry_run_shows_every_role(ps_setup, tmp_path):
    inventory, _, payload, checkpoints = ps_setup
    done = inv("train", "--hosts", str(inventory), "--runs-dir", str(tmp_path / "runs"),
               "--payload", str(payload), "--dry-run", "--args", "--strategy ps")
    assert done.returncode == 0, done.stdout + done.stderr
    for name, role in (("chief-0", "chief"), ("worker-1", "worker"), ("ps-0", "ps"),
                       ("evaluator-0", "evaluator")):
        assert f"{name} ({role})" in done.stdout
    assert "TFDEPLOY_TASK_TYPE=evaluator" in done.stdout


def test_ps_run_ends_with_the_chief_and_leaves_nothing(ps_setup, tmp_path):
    inventory, hosts, payload, checkpoints = ps_setup
    runs = tmp_path / "runs"
    done = inv("train", "--hosts", str(inventory), "--runs-dir", str(runs), "--payload",
               str(payload), "--grace", "1", "--args",
               f"--strategy ps --epochs 3 --steps-per-epoch 5 --checkpoint-dir {checkpoints}")
    assert done.returncode == 0, done.stdout + done.stderr
    run_dir = only_run(runs)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert [(t["task"], t["role"]) for t in summary["tasks"]] == [
        ("chief-0", "chief"), ("worker-0", "worker"), ("worker-1", "worker"), ("ps-0", "ps"),
        ("evaluator-0", "evaluator")]
    assert summary["tasks"][0]["exit_code"] == 0
    losses = summary["tasks"][0]["losses"]
    assert len(losses) == 3 and all(math.isfinite(x) for x in losses)
    assert losses[-1] < losses[0]
    for name in LOGS:
        log = (run_dir / f"{name}.log").read_text()
        [given] = events(log, "given")
        kind, index = name.split("-")
        assert given["tf_config"]["task"] == {"type": kind, "index": int(index)}, name
        assert given["task_type"] == kind
        assert "evaluator" not in given["tf_config"]["cluster"]
        if kind == "chief":
            cluster = given["tf_config"]["cluster"]
            assert set(cluster) == {"chief", "ps", "worker"}
            assert len(cluster["worker"]) == 2 and len(cluster["ps"]) == 1
    assert "evaluator: ckpt-" in (run_dir / "evaluator-0.log").read_text()
    assert wait_until_gone(run_dir.name, timeout=5) == []
    for host in hosts:
        assert not (Path(host.workdir) / "runs" / run_dir.name).exists(), host


def start(inventory: Path, runs: Path, payload: Path, checkpoints: Path,
          *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "invoke", "train", "--hosts", str(inventory), "--runs-dir",
         str(runs), "--payload", str(payload), "--entry", "pstest.py", "--grace", "1",
         "--args", f"--strategy ps --epochs 4 --steps-per-epoch 5 "
                   f"--checkpoint-dir {checkpoints}", *extra],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wait_for(condition, controller: subprocess.Popen, timeout: float = 150):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        assert controller.poll() is None, controller.stdout.read()
        time.sleep(0.2)
    raise AssertionError("timed out")


def held_run(runs: Path) -> Path | None:
    """The run directory once the chief holds after its second epoch."""
    for log in runs.glob("*/chief-0.log") if runs.exists() else []:
        if len(events(log.read_text(), "checkpoint")) >= 2:
            return log.parent
    return None


def kill_task(host, run_id: str, name: str, holding: int | None = None) -> socket.socket | None:
    """SIGKILL the training process of task `name` (not its supervisor, which records 137);
    `holding`: its listening socket on that port is kept open here first (hold_listener)."""
    pid_file = Path(host.workdir) / "runs" / run_id / f"{name}.pid"
    pgid = json.loads(pid_file.read_text())["pgid"]
    children = [p for p in processes_of_run(run_id) if p != pgid and os.getpgid(p) == pgid]
    assert children, name
    held = hold_listener(children, holding) if holding else None
    for pid in children:
        os.kill(pid, signal.SIGKILL)
    return held


def finish(controller: subprocess.Popen) -> str:
    try:
        return controller.communicate(timeout=180)[0]
    finally:
        end(controller)


# pidfd_getfd(2), which Python's os module lacks: the same number on every architecture.
PIDFD_GETFD = 438


def listening_inodes(port: int) -> set[str]:
    """The socket inodes listening on `port` (IPv4 and IPv6) on this machine."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "0A":
                inodes.add(fields[9])
    return inodes


def hold_listener(pids: list[int], port: int) -> socket.socket:
    """A copy, in this process, of the socket one of `pids` listens on `port` with: once they
    are killed it goes on listening there, so the port is never free in between. The other
    program that has taken the port when the relaunch comes, without racing the probe."""
    libc = ctypes.CDLL(None, use_errno=True)
    inodes = listening_inodes(port)
    for pid in pids:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:[") and target[8:-1] in inodes:
                pidfd = os.pidfd_open(pid)
                try:
                    copy = libc.syscall(PIDFD_GETFD, pidfd, int(fd), 0)
                finally:
                    os.close(pidfd)
                if copy < 0:
                    raise OSError(ctypes.get_errno(), f"pidfd_getfd of pid {pid} fd {fd}")
                return socket.socket(fileno=copy)
    raise AssertionError(f"no process of {pids} listens on port {port}")


def test_a_worker_whose_port_was_taken_meanwhile_is_not_relaunched_in_place(ps_setup,
                                                                               tmp_path):
    """Its peers know it by its port: the controller probes that port before an in-place
    relaunch, and a port taken since is said, not tried (training goes on with the other
    workers, and the relaunch is not spent)."""
    inventory, hosts, payload, checkpoints = ps_setup
    runs = tmp_path / "runs"
    controller = start(inventory, runs, payload, checkpoints, "--restarts", "1")
    said: list[str] = []
    reader = threading.Thread(target=lambda: said.extend(controller.stdout), daemon=True)
    taker = None
    try:
        run_dir = wait_for(lambda: held_run(runs), controller)
        record = json.loads((run_dir / "record.json").read_text())
        port = next(t["port"] for t in record["tasks"] if t["name"] == "worker-1")
        reader.start()
        taker = kill_task(hosts[1], run_dir.name, "worker-1", holding=port)
        deadline = time.monotonic() + 60
        while not any("is not relaunched" in line for line in said):
            assert time.monotonic() < deadline and controller.poll() is None, "".join(said)
            time.sleep(0.2)
        checkpoints.joinpath("go").touch()
        controller.wait(timeout=180)
    finally:
        end(controller)
        reader.join(5)
        if taker is not None:
            taker.close()
    out = " ".join("".join(said).split())
    assert controller.returncode == 0, out
    assert (f"worker-1 is not relaunched: its port {port} on h2 was taken by another program"
            in out), out
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["tasks"][2]["relaunches"] == 0 and summary["tasks"][0]["epochs"] == 4
    assert wait_until_gone(run_dir.name, timeout=5) == []


def test_a_ps_killed_mid_run_fails_the_run_and_every_task_goes(ps_setup, tmp_path):
    inventory, hosts, payload, checkpoints = ps_setup
    runs = tmp_path / "runs"
    controller = start(inventory, runs, payload, checkpoints)
    try:
        run_dir = wait_for(lambda: held_run(runs), controller)
        kill_task(hosts[2], run_dir.name, "ps-0")
        killed = time.monotonic()
        assert wait_until_gone(run_dir.name, timeout=60) == [], "tasks left 60 s after"
        assert time.monotonic() - killed < 60
    finally:
        out = finish(controller)
    assert controller.returncode == 1, out
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["failure"]["task"] == "ps-0"
    assert summary["tasks"][3]["exit_code"] == 137


@pytest.mark.parametrize("restarts", [0, 1])
def test_a_worker_killed_mid_run_is_tolerated_or_relaunched(ps_setup, tmp_path, restarts):
    inventory, hosts, payload, checkpoints = ps_setup
    runs = tmp_path / "runs"
    controller = start(inventory, runs, payload, checkpoints,
                       *(["--restarts", str(restarts)] if restarts else []))
    try:
        run_dir = wait_for(lambda: held_run(runs), controller)
        kill_task(hosts[1], run_dir.name, "worker-1")
        log = run_dir / "worker-1.log"
        if restarts:
            # The relaunched worker serves again, at the same address and port.
            wait_for(lambda: len(events(log.read_text(), "serving")) == 2, controller)
        else:
            ended = Path(hosts[1].workdir) / "runs" / run_dir.name / "worker-1.exit"
            wait_for(ended.exists, controller)
        checkpoints.joinpath("go").touch()
    finally:
        out = finish(controller)
    assert controller.returncode == 0, out
    summary = json.loads((run_dir / "summary.json").read_text())
    chief, worker1 = summary["tasks"][0], summary["tasks"][2]
    assert chief["exit_code"] == 0 and chief["epochs"] == 4
    assert worker1["relaunches"] == restarts
    if restarts:
        assert "worker-1 ended (exit code 137); relaunching it in place on h2" in out
        assert "attempt 2 of task 1 " in log.read_text()
    else:
        assert "worker-1 (h2) ended (exit code 137)" in out
    assert wait_until_gone(run_dir.name, timeout=5) == []
