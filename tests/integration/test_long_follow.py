"""Following a detached run again and again, over real sshd servers on loopback: follows
ended every way a user ends them (Ctrl-C, the terminal closed, the follower killed outright)
at moments that fall anywhere in the stream, then one followed to the end. Every task's local
log must hold each line the task printed once, in order: a follow resumes from the byte where
the local copy ends."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

from numbered import check_logs, write_payload
from test_runs import detach, kill_by_records, record
from test_train import REPO, assert_nothing_left

from procs import default_signals, end

SECONDS, RATE = 24, 2000            # lines per second per task: the stream never pauses
# How each follow before the last one ends: SIGINT is Ctrl-C, SIGHUP a closed terminal,
# SIGKILL a follower that had no chance to write anything more.
ENDINGS = (signal.SIGINT, signal.SIGHUP, signal.SIGKILL, signal.SIGINT, signal.SIGKILL,
           signal.SIGINT)


def follower(runs, run_id: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "invoke", "logs", "--run", run_id, "--runs-dir", str(runs),
         "--follow"], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        preexec_fn=default_signals)


def test_interrupted_follows_lose_and_repeat_no_line(ssh_lab, tmp_path):
    hosts = ssh_lab.hosts[:2]
    inventory = ssh_lab.write_inventory(tmp_path / "lab.yaml", hosts)
    payload = write_payload(tmp_path / "payload")
    runs = tmp_path / "runs"
    run_id = detach(inventory, runs, "--payload", str(payload), "--args", f"{SECONDS} {RATE}")
    watching = None
    try:
        pace = random.Random(run_id)        # the run's id: a failure can be replayed
        for ending in ENDINGS:
            watching = follower(runs, run_id)
            time.sleep(pace.uniform(0.5, 3.0))
            watching.send_signal(ending)
            watching.wait(timeout=60)
        assert record(runs, run_id)["state"] == "detached"
        # The follows copied part of the stream: the last one resumes in the middle of it.
        copied = [log.stat().st_size for log in (runs / run_id).glob("worker-*.log")]
        assert len(copied) == 2 and min(copied) > 0, copied
        last = subprocess.run(
            [sys.executable, "-m", "invoke", "logs", "--run", run_id, "--runs-dir", str(runs),
             "--follow"], cwd=REPO, capture_output=True, text=True, timeout=SECONDS + 120)
        assert last.returncode == 0, last.stdout + last.stderr
        lines = check_logs(runs / run_id)
        assert lines >= 2 * SECONDS * RATE * 0.9, lines
        assert min(log.stat().st_size for log in (runs / run_id).glob("worker-*.log")) > \
            max(copied), "the last follow added nothing"
        assert record(runs, run_id)["state"] == "finished"
        assert_nothing_left(runs / run_id, hosts)
    finally:
        if watching is not None:
            end(watching)
        kill_by_records(run_id, hosts)


def test_a_follow_interrupted_in_its_logins_after_a_killed_one_leaves_the_run_detached(
        ssh_lab, tmp_path):
    """A follower killed outright cannot say it let go: the record still says `running`. The
    next follower, interrupted while it still logs in (a host's sshd frozen holds it there),
    must leave the run `detached`, and a last follow still reaches the end."""
    hosts = ssh_lab.hosts[:2]
    inventory = ssh_lab.write_inventory(tmp_path / "lab.yaml", hosts)
    payload = write_payload(tmp_path / "payload")
    runs = tmp_path / "runs"
    run_id = detach(inventory, runs, "--payload", str(payload), "--args", "20 100")
    watching = None
    try:
        watching = follower(runs, run_id)
        deadline = time.monotonic() + 60
        while record(runs, run_id)["state"] != "running" and time.monotonic() < deadline:
            time.sleep(0.05)
        watching.kill()
        watching.wait(timeout=60)
        assert record(runs, run_id)["state"] == "running"
        os.kill(ssh_lab.pids[0], signal.SIGSTOP)      # new logins to h1 wait for its banner
        try:
            watching = follower(runs, run_id)
            time.sleep(3)
            assert watching.poll() is None, "the follower did not wait for the frozen host"
            watching.send_signal(signal.SIGINT)
            assert watching.wait(timeout=60) == 130
        finally:
            os.kill(ssh_lab.pids[0], signal.SIGCONT)
        assert record(runs, run_id)["state"] == "detached"
        last = subprocess.run(
            [sys.executable, "-m", "invoke", "logs", "--run", run_id, "--runs-dir", str(runs),
             "--follow"], cwd=REPO, capture_output=True, text=True, timeout=120)
        assert last.returncode == 0, last.stdout + last.stderr
        assert check_logs(runs / run_id) >= 2 * 20 * 100 * 0.9
        assert record(runs, run_id)["state"] == "finished"
        assert_nothing_left(runs / run_id, hosts)
    finally:
        if watching is not None:
            end(watching)
        kill_by_records(run_id, hosts)
