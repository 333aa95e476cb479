"""`inv train` end to end: real sshd servers on loopback, real TensorFlow, real teardown."""
from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from procs import default_signals, end, processes_of_run, wait_until_gone


REPO = Path(__file__).resolve().parents[2]
QUICK = "--epochs 2 --steps-per-epoch 5"


def inv(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=REPO, text=True,
                          capture_output=True, timeout=300, **kw)


def only_run(runs: Path) -> Path:
    found = [p for p in runs.iterdir() if p.is_dir()]
    assert len(found) == 1, found
    return found[0]


def assert_nothing_left(run_dir: Path, hosts) -> None:
    run_id = run_dir.name
    assert wait_until_gone(run_id, timeout=5) == []
    for host in hosts:
        assert not (Path(host.workdir) / "runs" / run_id).exists(), host


def remote_runs(host) -> list[str]:
    runs = Path(host.workdir) / "runs"
    return sorted(p.name for p in runs.iterdir()) if runs.exists() else []


@pytest.fixture
def lab_inventory(ssh_lab, tmp_path):
    hosts = ssh_lab.hosts[:2]
    return ssh_lab.write_inventory(tmp_path / "lab.yaml", hosts), hosts


def test_two_ssh_hosts_train_in_sync_and_leave_nothing(lab_inventory, tmp_path):
    inventory, hosts = lab_inventory
    runs = tmp_path / "runs"
    done = inv("train", "--hosts", str(inventory), "--runs-dir", str(runs), "--args", QUICK)
    assert done.returncode == 0, done.stdout + done.stderr
    run_dir = only_run(runs)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["exit_code"] == 0
    assert [t["exit_code"] for t in summary["tasks"]] == [0, 0]
    assert [t["host"] for t in summary["tasks"]] == [h.name for h in hosts]
    assert summary["losses_agree"] is True
    losses = [t["losses"] for t in summary["tasks"]]
    assert len(losses[0]) == 2 and losses[0] == losses[1]
    # Every line reached the controller with its task's prefix and is kept in the local log.
    for i, host in enumerate(hosts):
        assert f"[worker-{i} {host.name}]" in done.stdout
        log = (run_dir / f"worker-{i}.log").read_text()
        assert '"event": "epoch"' in log
    assert any(p.is_file() for p in (run_dir / "artifacts").rglob("*")), "chief output fetched"
    plan = json.loads((run_dir / "plan.json").read_text())
    endpoints = [t["endpoint"] for h in plan["hosts"] for t in h["tasks"]]
    assert [e.split(":")[0] for e in endpoints] == [h.address for h in hosts]
    assert_nothing_left(run_dir, hosts)


def crash_payload(tmp_path: Path, when: str = "") -> Path:
    """The default payload plus an entry, crash.py, that kills task 1 hard in its second
    epoch (and only where the Python condition `when` also holds, if given)."""
    payload = tmp_path / "payload"
    shutil.copytree(REPO / "payload", payload, ignore=shutil.ignore_patterns("__pycache__"))
    (payload / "crash.py").write_text(
        "import os, sys\n"
        "import tf_keras as keras\n"
        "import train\n"
        "class Crash(keras.callbacks.Callback):\n"
        "    def on_epoch_begin(self, epoch, logs=None):\n"
        "        if epoch == 1 and os.environ['TFDEPLOY_TASK_INDEX'] == '1'"
        f"{' and ' + when if when else ''}:\n"
        "            print('crashing on purpose', flush=True)\n"
        "            os._exit(3)\n"
        "sys.exit(train.main(callbacks=[Crash()]))\n")
    return payload


def test_crashing_task_stops_the_run_everywhere(lab_inventory, tmp_path):
    inventory, hosts = lab_inventory
    runs = tmp_path / "runs"
    done = inv("train", "--hosts", str(inventory), "--runs-dir", str(runs),
               "--payload", str(crash_payload(tmp_path)), "--entry", "crash.py",
               "--args", "--epochs 20 --steps-per-epoch 5", "--grace", "1")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "worker-1" in done.stdout and "exit code 3" in done.stdout
    assert "crashing on purpose" in done.stdout  # the failing task's last lines are shown
    run_dir = only_run(runs)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["failure"]["task"] == "worker-1"
    assert summary["tasks"][1]["exit_code"] == 3
    assert summary["tasks"][0]["exit_code"] != 0  # stopped, not left waiting for its peer
    assert_nothing_left(run_dir, hosts)


def wait_for_first_epoch(runs: Path, controller: subprocess.Popen, log_name: str,
                         timeout: float = 120) -> str:
    """The run id, once the controller's local copy of `log_name` shows an epoch."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        logs = list(runs.glob(f"*/{log_name}")) if runs.exists() else []
        if logs and '"event": "epoch"' in logs[0].read_text():
            return logs[0].parent.name
        assert controller.poll() is None, (
            controller.stdout.read() if controller.stdout else "the controller exited")
        time.sleep(0.2)
    raise AssertionError("training never reached its first epoch")


def interrupt(proc: subprocess.Popen) -> str:
    """Ctrl-C to a controller (SIGINT), its output once it ended; killed if it does not."""
    try:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        return proc.communicate(timeout=60)[0]
    finally:
        end(proc)


def test_ctrl_c_tears_down_and_exits_130(lab_inventory, tmp_path):
    inventory, hosts = lab_inventory
    runs = tmp_path / "runs"
    controller = subprocess.Popen(
        [sys.executable, "-m", "invoke", "train", "--hosts", str(inventory), "--runs-dir",
         str(runs), "--args", "--epochs 500 --steps-per-epoch 5", "--grace", "1"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        preexec_fn=default_signals)
    try:
        run_id = wait_for_first_epoch(runs, controller, "worker-1.log")
        assert processes_of_run(run_id), "the run's tasks should be running"
    finally:
        out = interrupt(controller)
    assert controller.returncode == 130, out
    assert "interrupted" in out
    assert_nothing_left(runs / run_id, hosts)


def test_default_localhost_inventory(tmp_path):
    runs = tmp_path / "runs"
    done = inv("train", "--runs-dir", str(runs), "--args", QUICK)
    assert done.returncode == 0, done.stdout + done.stderr
    run_dir = only_run(runs)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["losses_agree"] is True
    assert [t["host"] for t in summary["tasks"]] == ["local", "local"]
    assert wait_until_gone(run_dir.name, timeout=5) == []
    assert not (Path.home() / ".tfdeploy" / "runs" / run_dir.name).exists()


def test_dry_run_prints_the_plan_and_touches_nothing(lab_inventory, tmp_path):
    inventory, hosts = lab_inventory
    runs = tmp_path / "runs"
    before = {h.name: remote_runs(h) for h in hosts}
    done = inv("train", "--hosts", str(inventory), "--runs-dir", str(runs), "--dry-run",
               "--args", "--epochs 3")
    assert done.returncode == 0, done.stderr
    assert "TF_CONFIG=" in done.stdout and "TF_USE_LEGACY_KERAS=1" in done.stdout
    assert "train.py --epochs 3" in done.stdout
    assert not runs.exists()
    assert {h.name: remote_runs(h) for h in hosts} == before


def test_help_explains_every_flag():
    listing = inv("--list").stdout
    tasks = [line.split()[0] for line in listing.splitlines()[1:] if line.startswith("  ")
             and not line.startswith("   ")]
    assert {"train", "check", "setup", "runs", "status", "logs", "down"} <= set(tasks), listing
    for name in tasks:
        help_text = inv(name, "--help").stdout
        options = help_text.split("Options:", 1)[1].splitlines()
        flags = [line for line in options if line.strip().startswith("-")]
        assert flags, help_text
        for line in flags:
            # Invoke prints the flag, then its help text on the same line.
            assert len(line.split("  ", 2)) == 3 and line.split("  ", 2)[2].strip(), (name, line)
    train_help = inv("train", "--help").stdout
    for flag in ("--hosts", "--payload", "--entry", "--args", "--dry-run", "--runs-dir"):
        assert flag in train_help


def test_startup_watchdog_ends_a_run_whose_peer_never_comes(lab_inventory, tmp_path):
    """Task 1 never joins (and ignores SIGTERM); task 0 waits for it inside TensorFlow."""
    inventory, hosts = lab_inventory
    payload = crash_payload(tmp_path)
    (payload / "stall.py").write_text(
        "import json, os, signal, sys, time\n"
        "if os.environ['TFDEPLOY_TASK_INDEX'] == '1':\n"
        "    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "    print(json.dumps({'event': 'start', 'task': 1}), flush=True)\n"
        "    time.sleep(3600)\n"
        "import train\n"
        "sys.exit(train.main())\n")
    runs = tmp_path / "runs"
    done = inv("train", "--hosts", str(inventory), "--runs-dir", str(runs), "--payload",
               str(payload), "--entry", "stall.py", "--start-timeout", "15", "--grace", "1")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "startup watchdog" in done.stdout
    assert "worker-1 (h2)" in done.stdout
    run_dir = only_run(runs)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert "did not reach a first training step" in summary["failure"]["reason"]
    assert_nothing_left(run_dir, hosts)


def test_multi_input_model_trains_on_two_workers(tmp_path):
    runs = tmp_path / "runs"
    done = inv("train", "--runs-dir", str(runs), "--args", QUICK + " --multi-input")
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads((only_run(runs) / "summary.json").read_text())
    assert summary["losses_agree"] is True
