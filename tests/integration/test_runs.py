"""Runs that outlive the terminal, over real sshd servers on loopback with real TensorFlow:
detach, a controller killed outright, reattach to completion, status and runs, `down` of one
run beside another on the same hosts, and --restarts resuming from the carried backup."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import test_train
from test_train import REPO, assert_nothing_left, crash_payload, interrupt, wait_for_first_epoch

from procs import (default_signals, end, processes_of_run, wait_for_processes,
                   wait_until_gone)


@pytest.fixture
def lab(ssh_lab, tmp_path):
    hosts = ssh_lab.hosts[:2]
    return ssh_lab.write_inventory(tmp_path / "lab.yaml", hosts), hosts


def inv(*args: str) -> subprocess.CompletedProcess:
    # Wide enough that rich tables keep every cell on one line.
    return test_train.inv(*args, env={**os.environ, "COLUMNS": "200"})


def record(runs: Path, run_id: str) -> dict:
    return json.loads((runs / run_id / "record.json").read_text())


def remote_dir(host, run_id: str) -> Path:
    return Path(host.workdir) / "runs" / run_id


def kill_by_records(run_id: str, hosts) -> None:
    """Last resort for a failed test: end the run by its pid files, then remove its dirs."""
    for host in hosts:
        for pid_file in remote_dir(host, run_id).glob("worker-*.pid"):
            try:
                os.killpg(json.loads(pid_file.read_text())["pgid"], signal.SIGKILL)
            except (ProcessLookupError, ValueError, OSError):
                pass
    wait_until_gone(run_id, timeout=10)
    for host in hosts:
        subprocess.run(["rm", "-rf", str(remote_dir(host, run_id))], check=False)


def lab_with_payload(ssh_lab, tmp_path: Path, source: str):
    """(inventory, hosts, payload) for two lab hosts and a payload whose train.py is `source`."""
    hosts = ssh_lab.hosts[:2]
    payload = tmp_path / "payload"
    payload.mkdir()
    (payload / "train.py").write_text(source)
    return ssh_lab.write_inventory(tmp_path / "lab.yaml", hosts), hosts, payload


def clean_up(controller: subprocess.Popen, run_id: str | None, hosts) -> None:
    """A test's last resort: its controller killed if it still runs, then the run ended by its
    records."""
    end(controller)
    if run_id:
        kill_by_records(run_id, hosts)


def detach(inventory: Path, runs: Path, *extra: str) -> str:
    done = inv("train", "--hosts", str(inventory), "--runs-dir", str(runs), "--detach", *extra)
    assert done.returncode == 0, done.stdout + done.stderr
    run_id = next((line.split()[1] for line in done.stdout.splitlines()
                   if line.startswith("run ") and "detached" in line), None)
    assert run_id, done.stdout + done.stderr
    assert f"inv logs --run {run_id} --follow" in done.stdout
    assert f"inv down --run {run_id}" in done.stdout
    return run_id


def epoch_lines(log: Path) -> list[int]:
    return [json.loads(line)["epoch"] for line in log.read_text().splitlines()
            if line.startswith('{"event": "epoch"')]


def test_detach_status_and_logs_follow_complete_the_run(lab, tmp_path):
    inventory, hosts = lab
    runs = tmp_path / "runs"
    run_id = None
    try:
        run_id = detach(inventory, runs, "--args", "--epochs 6 --steps-per-epoch 10")
        assert record(runs, run_id)["state"] == "detached"
        assert len(wait_for_processes(run_id, 4)) >= 4, "two tasks and their supervisors run on"
        listing = inv("runs", "--runs-dir", str(runs))
        assert listing.returncode == 0 and run_id in listing.stdout and "detached" in listing.stdout
        assert "h1, h2" in listing.stdout
        state = inv("status", "--runs-dir", str(runs))      # the newest run by default
        assert state.returncode == 0, state.stdout + state.stderr
        assert run_id in state.stdout and state.stdout.count("running") >= 2
        secret_free = (runs / run_id / "record.json").read_text()
        assert "TF_CONFIG" not in secret_free and '"env"' not in secret_free
        # A first look without --follow: what is there so far, kept locally.
        first = inv("logs", "--run", run_id, "--runs-dir", str(runs), "--task", "1")
        assert first.returncode == 0, first.stdout + first.stderr
        assert "[worker-0" not in first.stdout
        seen = (runs / run_id / "worker-1.log").read_bytes()
        assert seen and b"worker-1" not in seen
        done = inv("logs", "--run", run_id, "--runs-dir", str(runs), "--follow", "--verbose")
        assert done.returncode == 0, done.stdout + done.stderr
        summary = json.loads((runs / run_id / "summary.json").read_text())
        assert summary["exit_code"] == 0 and summary["losses_agree"] is True
        assert [len(t["losses"]) for t in summary["tasks"]] == [6, 6]
        for i in range(2):    # every line exactly once in the local copies
            assert epoch_lines(runs / run_id / f"worker-{i}.log") == [1, 2, 3, 4, 5, 6]
        # The reattached view showed only what the first look had not: nothing twice.
        assert done.stdout.count('"epoch": 6,') == 2
        assert any(p.is_file() for p in (runs / run_id / "artifacts").rglob("*"))
        assert record(runs, run_id)["state"] == "finished"
        assert "finished (exit 0)" in inv("runs", "--runs-dir", str(runs)).stdout
        assert_nothing_left(runs / run_id, hosts)
        # An ended run is shown from its local records; `down` has nothing left to do.
        ended = inv("status", "--run", run_id, "--runs-dir", str(runs))
        assert ended.returncode == 0 and ended.stdout.count("│ exit 0 │") == 2, ended.stdout
        again = inv("logs", "--run", run_id, "--verbose", "--runs-dir", str(runs))
        assert again.returncode == 0 and again.stdout.count('"epoch": 6,') == 2
        assert "has ended" in again.stdout
        summary_before = (runs / run_id / "summary.json").read_text()
        late = inv("down", "--run", run_id, "--runs-dir", str(runs))
        assert late.returncode == 0 and "nothing to stop" in late.stdout
        assert (runs / run_id / "summary.json").read_text() == summary_before
    finally:
        if run_id:
            kill_by_records(run_id, hosts)


def test_a_controller_killed_outright_is_replaced_by_logs_follow(lab, tmp_path):
    inventory, hosts = lab
    runs = tmp_path / "runs"
    controller = subprocess.Popen(
        [sys.executable, "-m", "invoke", "train", "--hosts", str(inventory), "--runs-dir",
         str(runs), "--args", "--epochs 40 --steps-per-epoch 10"],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    run_id = None
    try:
        run_id = wait_for_first_epoch(runs, controller, "worker-0.log")
        controller.kill()
        controller.wait()
        assert "running (no controller)" in inv("runs", "--runs-dir", str(runs)).stdout
        # Ctrl-C to a follower stops the following, never the run.
        watcher = subprocess.Popen(
            [sys.executable, "-m", "invoke", "logs", "--run", run_id, "--runs-dir", str(runs),
             "--follow"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            preexec_fn=default_signals)
        try:
            time.sleep(5)
        finally:
            out = interrupt(watcher)
        assert watcher.returncode == 130, out
        assert "goes on" in out and len(processes_of_run(run_id)) >= 4
        assert record(runs, run_id)["state"] == "detached"
        done = inv("logs", "--run", run_id, "--runs-dir", str(runs), "--follow")
        assert done.returncode == 0, done.stdout + done.stderr
        summary = json.loads((runs / run_id / "summary.json").read_text())
        assert summary["exit_code"] == 0 and summary["losses_agree"] is True
        assert [len(t["losses"]) for t in summary["tasks"]] == [40, 40]
        for i in range(2):
            assert epoch_lines(runs / run_id / f"worker-{i}.log") == list(range(1, 41))
        assert "teardown: no process of run" in done.stdout
        assert_nothing_left(runs / run_id, hosts)
    finally:
        clean_up(controller, run_id, hosts)


def test_down_stops_one_run_and_leaves_the_other_on_the_same_hosts(lab, tmp_path):
    inventory, hosts = lab
    runs = tmp_path / "runs"
    long = ("--args", "--epochs 500 --steps-per-epoch 5", "--grace", "1")
    a = b = None
    try:
        a = detach(inventory, runs, *long)
        b = detach(inventory, runs, *long)
        ports = [{t["port"] for t in record(runs, r)["tasks"]} for r in (a, b)]
        assert not ports[0] & ports[1], "two runs on the same hosts need distinct ports"
        wait_for_log_text(runs, b, hosts, '"event": "epoch"')
        b_procs = processes_of_run(b)
        down = inv("down", "--run", a, "--runs-dir", str(runs))
        assert down.returncode == 0, down.stdout + down.stderr
        assert f"no process of run {a} left" in down.stdout
        assert record(runs, a)["state"] == "down"
        assert_nothing_left(runs / a, hosts)
        # B is untouched: the same processes alive, its directories in place, still training.
        assert set(b_procs) <= set(processes_of_run(b))
        for host in hosts:
            assert (remote_dir(host, b) / "run.json").exists()
        state = inv("status", "--run", b, "--runs-dir", str(runs))
        assert state.stdout.count("running") >= 2, state.stdout
        down_b = inv("down", "--runs-dir", str(runs))           # the newest: B
        assert down_b.returncode == 0, down_b.stdout + down_b.stderr
        assert record(runs, b)["state"] == "down"
        assert_nothing_left(runs / b, hosts)
        assert inv("runs", "--runs-dir", str(runs)).stdout.count(" down ") == 2
    finally:
        for run_id in (a, b):
            if run_id:
                kill_by_records(run_id, hosts)


def wait_for_log_text(runs: Path, run_id: str, hosts, text: str, timeout: float = 120) -> None:
    """Until task 0's log on its host shows `text` (a detached run has no local copy yet)."""
    log = remote_dir(hosts[0], run_id) / "worker-0.log"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log.exists() and text in log.read_text(errors="replace"):
            return
        time.sleep(0.2)
    raise AssertionError(f"{text!r} never appeared in {log}")


def test_restarts_resume_from_the_carried_backup(lab, tmp_path):
    """Task 1 dies hard in epoch 2 of the first attempt only; the relaunch resumes after
    epoch 1 on both hosts, which works only if the chief's backup reached h2."""
    inventory, hosts = lab
    payload = crash_payload(tmp_path, when="os.environ['TFDEPLOY_ATTEMPT'] == '1'")
    runs = tmp_path / "runs"
    done = inv("train", "--hosts", str(inventory), "--runs-dir", str(runs), "--payload",
               str(payload), "--entry", "crash.py", "--restarts", "1", "--grace", "1",
               "--args", "--epochs 5 --steps-per-epoch 10")
    run_dir = max(p for p in runs.iterdir() if p.is_dir())
    try:
        assert done.returncode == 0, done.stdout + done.stderr
        assert "restart 1 of 1: worker-1 failed (exit code 3)" in done.stdout
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["exit_code"] == 0 and summary["attempts"] == 2
        assert summary["failed_attempts"][0]["failed_task"] == "worker-1"
        assert summary["losses_agree"] is True
        assert [len(t["losses"]) for t in summary["tasks"]] == [5, 5]
        for i in range(2):
            log = (run_dir / f"worker-{i}.log").read_text()
            attempt_two = log[log.index("==== tfdeploy: attempt 2 of task"):]
            resumed = [json.loads(line) for line in attempt_two.splitlines()
                       if line.startswith('{"event": "resumed"')]
            assert [r["epoch"] for r in resumed] == [1], "resumed after epoch 1, not from 0"
            assert epoch_lines(run_dir / f"worker-{i}.log")[-4:] == [2, 3, 4, 5]
            assert '"epoch": 1,' not in attempt_two
        assert "crashing on purpose" in (run_dir / "worker-1.log").read_text()
        endpoints = record(runs, run_dir.name)["tasks"]
        assert record(runs, run_dir.name)["attempt"] == 2 and len(endpoints) == 2
        assert_nothing_left(run_dir, hosts)
    finally:
        kill_by_records(run_dir.name, hosts)


def test_bad_references_are_clear_errors_and_touch_nothing(lab, tmp_path):
    inventory, _ = lab
    runs = tmp_path / "runs"
    missing = inv("status", "--run", "nope", "--runs-dir", str(runs))
    assert missing.returncode == 2 and "no run 'nope'" in missing.stdout
    empty = inv("down", "--runs-dir", str(runs))
    assert empty.returncode == 2 and "no runs recorded" in empty.stdout
    assert "no runs recorded" in inv("runs", "--runs-dir", str(runs)).stdout
    word = inv("train", "--hosts", str(inventory), "--runs-dir", str(runs), "--restarts", "x")
    assert word.returncode == 2 and "--restarts takes a whole number" in word.stdout
    assert not runs.exists()
    for task in ("runs", "status", "logs", "down"):
        assert "--runs-dir" in inv(task, "--help").stdout
