"""`inv train --detach --restarts N` over real sshd servers on loopback, with tiny script
payloads: `inv train` returns once the run is launched and handed to a background controller
on this machine, which relaunches a task that fails on its first attempt after `inv train`
has ended; `inv logs --follow` shows the live run (the restart, the end) and exits with the
run's status; Ctrl-C of a follower leaves the background controller running; `inv down` stops
it and the run; a frozen host's tasks go to a spare under the background controller. After
each: no process of the run (the background controller included) and no run directory left.
"""
from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_lost_host import children, freezer, signal_all
from test_runs import kill_by_records
from test_train import REPO

from deploy.run.background import is_controller
from procs import default_signals, end, wait_until_gone
from sshlab import SshLab

# `run.py TICKS [MARKER]`: each attempt of a task says its env (the forwarded secret
# reversed); given a marker file, task 1's first attempt waits for it to exist (the test
# makes it once `inv train` has returned), then fails; every other attempt of every task
# ticks for TICKS * 0.2 s and exits 0.
FAILS_ONCE = """\
import os, sys, time
index, attempt = os.environ["TFDEPLOY_TASK_INDEX"], os.environ["TFDEPLOY_ATTEMPT"]
print(f"task {index} attempt {attempt}", os.environ.get("GREETING"),
      os.environ.get("DETACHED_SECRET", "")[::-1], flush=True)
if index == "1" and attempt == "1" and sys.argv[2:]:
    while not os.path.exists(sys.argv[2]):
        time.sleep(0.1)
    print("failing on purpose", flush=True)
    sys.exit(3)
for i in range(int(sys.argv[1])):
    print("tick", i, flush=True)
    time.sleep(0.2)
"""


@pytest.fixture
def two_hosts(tmp_path):
    with SshLab(tmp_path / "lab", first_octet=92) as lab:
        yield lab, lab.start(2)


@pytest.fixture
def three_hosts(tmp_path):
    with SshLab(tmp_path / "lab", first_octet=93) as lab:
        hosts = lab.start(3)
        try:
            yield lab, hosts
        finally:
            for pid in lab.pids:       # never leave a stopped server behind
                signal_all(children({pid}), signal.SIGCONT)


SECRET = "s3cret-of-the-shell"


def inv(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=REPO, text=True,
                          capture_output=True, timeout=timeout,
                          env={**os.environ, "COLUMNS": "200", "DETACHED_SECRET": SECRET})


def payload(tmp_path: Path) -> Path:
    folder = tmp_path / "payload"
    folder.mkdir()
    (folder / "run.py").write_text(FAILS_ONCE)
    return folder


def record(runs: Path, run_id: str) -> dict:
    return json.loads((runs / run_id / "record.json").read_text())


class Detached:
    """`inv train --detach --restarts N` of the FAILS_ONCE payload; cleaned up whatever
    happens: the background controller killed by its pid (while it is that process), then
    the run ended by its records."""

    def __init__(self, tmp_path: Path, lab: SshLab, hosts, per_host: dict | None = None):
        self.tmp_path, self.hosts, self.runs = tmp_path, hosts, tmp_path / "runs"
        # A relaunch needs the inventory's env and the forwarded variables, which no record
        # holds: the background controller has them from `inv train`.
        self.inventory = lab.write_inventory(tmp_path / "hosts.yaml", hosts,
                                             per_host=per_host or {}, env={"GREETING": "hello"},
                                             forward_env=["DETACHED_SECRET"])
        self.done: subprocess.CompletedProcess | None = None
        self.run_id: str | None = None
        self.pid: int | None = None

    def start(self, args: str, *flags: str) -> None:
        """`inv train --detach` with `args` for run.py and `flags`; the run's id and its
        background controller's pid from the record."""
        self.done = inv("train", "--hosts", str(self.inventory), "--runs-dir", str(self.runs),
                        "--payload", str(payload(self.tmp_path)), "--entry", "run.py",
                        "--args", args, "--grace", "1", "--detach", *flags)
        self.find_run()
        self.pid = record(self.runs, self.run_id).get("controller_pid") if self.run_id \
            else None

    def find_run(self) -> None:
        found = list(self.runs.glob("*/record.json")) if self.runs.exists() else []
        self.run_id = found[0].parent.name if found else None

    @property
    def output(self) -> str:
        return self.done.stdout + self.done.stderr

    def controller_alive(self) -> bool:
        return is_controller(self.pid, self.run_id)

    def clean_up(self) -> None:
        if self.run_id is None:
            self.find_run()       # `inv train` itself failed, or ran out of time
        if self.run_id is None:
            return
        for pid in controllers_of(self.run_id):
            os.kill(pid, signal.SIGKILL)
        kill_by_records(self.run_id, self.hosts)

    def assert_nothing_left(self) -> None:
        deadline = time.monotonic() + 10
        while self.controller_alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not self.controller_alive(), f"background controller {self.pid} still runs"
        assert wait_until_gone(self.run_id, 10) == []
        for host in self.hosts:
            assert not (Path(host.workdir) / "runs" / self.run_id).exists(), host


def controllers_of(run_id: str) -> list[int]:
    """The background controllers of the run: processes whose command line names it."""
    return [int(pid) for pid in os.listdir("/proc") if pid.isdigit()
            and is_controller(int(pid), run_id)]


def wait_for(what, timeout: float = 60, message: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < deadline, message
        time.sleep(0.1)


def test_the_background_controller_relaunches_and_logs_follow_shows_it(two_hosts, tmp_path):
    lab, hosts = two_hosts
    marker = tmp_path / "fail now"
    run = Detached(tmp_path, lab, hosts)
    try:
        run.start(f"15 '{marker}'", "--restarts", "1")
        out = run.output
        assert run.done.returncode == 0, out
        assert record(run.runs, run.run_id)["attempt"] == 1
        marker.touch()
        # `inv train` has ended; the run is its background controller's.
        assert f"goes on under a background controller on this machine (pid {run.pid})" in out
        assert f"inv logs --run {run.run_id} --follow" in out, out
        assert run.controller_alive(), out
        rec = record(run.runs, run.run_id)
        assert rec["state"] == "running" and rec["background"] is True, rec
        log = run.runs / run.run_id / "controller.log"
        assert stat.S_IMODE(log.stat().st_mode) == 0o600
        follow = inv("logs", "--run", run.run_id, "--runs-dir", str(run.runs), "--follow",
                     timeout=240)
        shown = follow.stdout + follow.stderr
        assert follow.returncode == 0, shown + log.read_text()
        assert "restart 1 of 1: worker-1 failed (exit code 3)" in shown, shown
        assert "attempt 2 started" in shown, shown
        assert "[worker-1 " in shown and "failing on purpose" in shown, shown
        assert "tick 14" in shown, shown
        assert "teardown: no process of run" in shown, shown
        rec = record(run.runs, run.run_id)
        assert rec["state"] == "finished" and rec["exit_code"] == 0, rec
        summary = json.loads((run.runs / run.run_id / "summary.json").read_text())
        assert summary["exit_code"] == 0 and summary["attempts"] == 2, summary
        local = (run.runs / run.run_id / "worker-1.log").read_text()
        assert "failing on purpose" in local
        assert f"task 1 attempt 2 hello {SECRET[::-1]}" in local, local
        for kept in ("record.json", "controller.log", "plan.json"):
            assert SECRET not in (run.runs / run.run_id / kept).read_text(), kept
        assert "==== tfdeploy: attempt 2 of task 1 starts at" in local
        run.assert_nothing_left()
        listed = inv("runs", "--runs-dir", str(run.runs))
        assert "finished (exit 0)" in listed.stdout, listed.stdout
    finally:
        run.clean_up()


def test_down_stops_the_background_controller_and_the_run(two_hosts, tmp_path):
    lab, hosts = two_hosts
    run = Detached(tmp_path, lab, hosts)
    follower = None
    try:
        run.start("3000", "--restarts", "2")
        assert run.done.returncode == 0, run.output
        shown = f"running (background controller, pid {run.pid})"
        listed = inv("runs", "--runs-dir", str(run.runs))
        assert shown in listed.stdout, listed.stdout
        status = inv("status", "--run", run.run_id, "--runs-dir", str(run.runs))
        assert status.returncode == 0 and shown in status.stdout, status.stdout
        # A follower stopped with Ctrl-C leaves the background controller (and the run) be.
        follower = subprocess.Popen(
            [sys.executable, "-m", "invoke", "logs", "--run", run.run_id, "--runs-dir",
             str(run.runs), "--follow"], cwd=REPO, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, preexec_fn=default_signals)
        local = run.runs / run.run_id / "worker-1.log"
        wait_for(lambda: local.exists() and "tick 5" in local.read_text(), 60,
                 "the background controller wrote no log")
        time.sleep(1)
        follower.send_signal(signal.SIGINT)
        said = follower.communicate(timeout=30)[0]
        assert follower.returncode == 130, said
        assert "tick" in said and "stopped following" in said, said
        assert run.controller_alive()
        assert record(run.runs, run.run_id)["state"] == "running"
        # inv down: the background controller first, then every task.
        down = inv("down", "--run", run.run_id, "--runs-dir", str(run.runs))
        assert down.returncode == 0, down.stdout + down.stderr
        assert f"stopping the background controller of run {run.run_id} (pid {run.pid})" \
            in down.stdout, down.stdout
        assert record(run.runs, run.run_id)["state"] == "down"
        run.assert_nothing_left()
        assert "stopped following" in (run.runs / run.run_id / "controller.log").read_text()
    finally:
        if follower is not None:
            end(follower)
        run.clean_up()


def test_a_frozen_host_goes_to_the_spare_under_the_background_controller(three_hosts,
                                                                           tmp_path):
    lab, hosts = three_hosts
    freeze, thaw = freezer(lab, 1, hosts[1].workdir)
    run = Detached(tmp_path, lab, hosts, per_host={hosts[2].name: {"role": "spare"}})
    try:
        run.start("100", "--restarts", "1", "--lost-after", "3")
        assert run.done.returncode == 0, run.output
        local = run.runs / run.run_id / "worker-1.log"
        wait_for(lambda: local.exists() and "tick 5" in local.read_text(), 60,
                 "the background controller wrote no log")
        freeze(run.run_id)
        follow = inv("logs", "--run", run.run_id, "--runs-dir", str(run.runs), "--follow",
                     timeout=240)
        shown = follow.stdout + follow.stderr
        assert follow.returncode == 0, shown
        assert f"{hosts[1].name}" in shown and "no heartbeat for" in shown, shown
        assert f"{hosts[2].name} takes the tasks of {hosts[1].name}" in shown, shown
        assert "tick 99" in shown, shown
        rec = record(run.runs, run.run_id)
        assert rec["state"] == "finished" and rec["exit_code"] == 0, rec
        on = {t["endpoint"].rsplit(":", 1)[0] for t in rec["tasks"]}
        assert hosts[2].address in on and hosts[1].address not in on, rec["tasks"]
        # The lost host answers again: `inv down` ends what the frozen attempt left there.
        thaw()
        down = inv("down", "--run", run.run_id, "--runs-dir", str(run.runs))
        assert down.returncode == 0, down.stdout + down.stderr
        run.assert_nothing_left()
    finally:
        thaw()
        run.clean_up()
