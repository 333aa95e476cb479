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
import re
import signal
import stat
import subprocess
import sys
import tarfile
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


def payload(tmp_path: Path, entry: str = "run.py", source: str = FAILS_ONCE) -> Path:
    folder = tmp_path / "payload"
    folder.mkdir()
    (folder / entry).write_text(source)
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

    def start(self, args: str, *flags: str, entry: str = "run.py",
              source: str = FAILS_ONCE) -> None:
        """`inv train --detach` with `args` for the payload (`entry`, of `source`) and
        `flags`; the run's id and its background controller's pid from the record."""
        self.done = inv("train", "--hosts", str(self.inventory), "--runs-dir", str(self.runs),
                        "--payload", str(payload(self.tmp_path, entry, source)), "--entry",
                        entry, "--args", args, "--grace", "1", "--detach", *flags)
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


# `epochs.py EPOCHS MARKER [fail]`: a payload that keeps its backup as BackupAndRestore does
# (the chief writes its last finished epoch into TFDEPLOY_BACKUP_DIR/chief before it tells of
# that epoch) and goes on from the backup its host holds. Attempt 1 holds after epoch 2 (the
# test brings the run down); in attempt 2, after epoch 3, task 1 waits for the marker file (the
# test makes it once a follower is there) and, given `fail`, then fails while the chief waits
# in silence; without `fail` every task waits for the marker, then trains to the end, as every
# later attempt does.
RESUMABLE = """\
import json, os, sys, time
index, attempt = int(os.environ["TFDEPLOY_TASK_INDEX"]), int(os.environ["TFDEPLOY_ATTEMPT"])
epochs, marker, fail = int(sys.argv[1]), sys.argv[2], sys.argv[3:] == ["fail"]
state = os.path.join(os.environ["TFDEPLOY_BACKUP_DIR"], "chief", "epoch")
done = int(open(state).read()) if os.path.exists(state) else 0
print(f"task {index} attempt {attempt}", flush=True)
if done:
    print(json.dumps({"event": "resumed", "task": index, "epoch": done}), flush=True)


def hold():
    print("holding", flush=True)
    time.sleep(600)


for epoch in range(done + 1, epochs + 1):
    time.sleep(0.1)
    if index == 0:
        os.makedirs(os.path.dirname(state), exist_ok=True)
        with open(state + ".new", "w") as f:
            f.write(str(epoch))
        os.replace(state + ".new", state)
    print(json.dumps({"event": "epoch", "task": index, "epoch": epoch}), flush=True)
    if attempt == 1 and epoch == 2:
        hold()
    if attempt == 2 and epoch == 3 and fail and index == 0:
        time.sleep(600)         # silent: the restart stops it at any moment
    if attempt == 2 and epoch == 3:
        while not os.path.exists(marker):
            time.sleep(0.1)
        if fail:
            print("failing on purpose", flush=True)
            sys.exit(3)
"""
EPOCHS = 5


def kept_epoch(kept: Path) -> int | None:
    """The epoch of the chief's backup the controller kept, None while it has none."""
    try:
        with tarfile.open(kept) as tar:
            member = next(m for m in tar.getmembers() if m.name.endswith("chief/epoch"))
            return int(tar.extractfile(member).read())
    except (OSError, tarfile.TarError, StopIteration, ValueError, AttributeError):
        return None


def expected_log(index: int, fail: bool) -> list[str]:
    """Task `index`'s local log, every attempt of it, when nothing is lost or read twice."""
    def epochs(first: int, last: int) -> list[str]:
        return [json.dumps({"event": "epoch", "task": index, "epoch": e})
                for e in range(first, last + 1)]

    def attempt(number: int, resumed: int) -> list[str]:
        return [f"==== tfdeploy: attempt {number} of task {index} starts at … ====",
                f"task {index} attempt {number}",
                json.dumps({"event": "resumed", "task": index, "epoch": resumed})]
    lines = [f"task {index} attempt 1", *epochs(1, 2), "holding", *attempt(2, 2)]
    if not fail:
        return lines + epochs(3, EPOCHS)
    return (lines + epochs(3, 3) + (["failing on purpose"] if index == 1 else [])
            + attempt(3, 3) + epochs(4, EPOCHS))


@pytest.mark.parametrize("restarts", ["0", "1"], ids=["left-on-its-hosts", "background"])
def test_resume_detach_goes_on_from_the_kept_backup(two_hosts, tmp_path, restarts):
    """`inv resume --detach` of a run brought down at epoch 2: without --restarts the run is
    left on its hosts and `inv logs --follow` takes it up; with --restarts 1 a background
    controller follows it and relaunches it once. Either way each task goes on from the kept
    backup, and every byte of each attempt's log is in the local one once."""
    lab, hosts = two_hosts
    marker, fail = tmp_path / "go on", restarts != "0"
    run = Detached(tmp_path, lab, hosts)
    try:
        run.start(f"{EPOCHS} '{marker}'" + (" fail" if fail else ""), "--restarts", "1",
                  entry="epochs.py", source=RESUMABLE)
        assert run.done.returncode == 0, run.output
        kept = run.runs / run.run_id / "backup" / "chief.tar.gz"
        wait_for(lambda: kept_epoch(kept) == 2, 60, "no backup of epoch 2 was kept")
        for index in (0, 1):
            local = run.runs / run.run_id / f"worker-{index}.log"
            wait_for(lambda: local.exists() and "holding" in local.read_text(), 60,
                     f"worker-{index} never held at epoch 2")
        down = inv("down", "--run", run.run_id, "--runs-dir", str(run.runs))
        assert down.returncode == 0, down.stdout + down.stderr
        run.assert_nothing_left()

        resumed = inv("resume", "--run", run.run_id, "--runs-dir", str(run.runs), "--detach",
                      "--restarts", restarts)
        out = resumed.stdout + resumed.stderr
        assert resumed.returncode == 0, out
        rec = record(run.runs, run.run_id)
        assert rec["attempt"] == 2, rec
        listed = inv("runs", "--runs-dir", str(run.runs)).stdout
        if fail:
            run.pid = rec["controller_pid"]
            assert rec["state"] == "running" and rec["background"] is True, rec
            assert f"goes on under a background controller on this machine (pid {run.pid})" \
                in out, out
            assert run.controller_alive(), out
            assert f"running (background controller, pid {run.pid}), attempt 2" in listed, \
                listed
        else:
            assert rec["state"] == "detached", rec
            assert f"run {run.run_id} is running detached on 2 host(s)" in out, out
            assert "detached, attempt 2" in listed, listed

        # The follower is there before the run can go on: it sees the rest of it live.
        said = tmp_path / "follow.out"
        with said.open("w") as out:
            follower = subprocess.Popen(
                [sys.executable, "-m", "invoke", "logs", "--run", run.run_id, "--runs-dir",
                 str(run.runs), "--follow"], cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                env={**os.environ, "COLUMNS": "200"})
        try:
            wait_for(lambda: "epoch 3" in said.read_text(), 60,
                     f"the follower showed no epoch 3:\n{said.read_text()}")
            marker.touch()
            follower.wait(timeout=240)
        finally:
            end(follower)
        shown = said.read_text()
        assert follower.returncode == 0, shown
        assert "has ended" not in shown, shown      # it followed the run, not its records
        if fail:
            assert "restart 1 of 1: worker-1 failed (exit code 3)" in shown, shown
            assert "attempt 3 started" in shown, shown
        rec = record(run.runs, run.run_id)
        attempts = 3 if fail else 2
        assert (rec["state"], rec["exit_code"], rec["attempt"]) == ("finished", 0, attempts), rec
        summary = json.loads((run.runs / run.run_id / "summary.json").read_text())
        assert summary["exit_code"] == 0 and summary["attempts"] == attempts, summary
        for index in (0, 1):
            log = (run.runs / run.run_id / f"worker-{index}.log").read_text()
            lines = [re.sub(r"starts at .* ====$", "starts at … ====", line)
                     for line in log.splitlines()]
            assert lines == expected_log(index, fail), log
        run.assert_nothing_left()
        listed = inv("runs", "--runs-dir", str(run.runs)).stdout
        assert f"finished (exit 0), attempt {attempts}" in listed, listed
    finally:
        run.clean_up()
