"""Signals to the controller (deploy/run/signals.py) over real sshd servers on loopback:
SIGTERM stops the run as Ctrl-C does, a closed terminal (SIGHUP) or a pipe's reader gone leaves
it going for `inv logs --follow`, a second Ctrl-C abandons the teardown and names the `inv down`
that finishes it.
The payload is a small script that prints epoch events (TensorFlow is not the point here), so
every test takes seconds."""
from __future__ import annotations

import errno
import json
import os
import pty
import select
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from test_runs import clean_up, epoch_lines, inv, kill_by_records, lab_with_payload, record
from test_train import REPO, assert_nothing_left, wait_for_first_epoch

from procs import default_signals, end, processes_of_run, wait_until_gone


EPOCHS = """\
import json, os, signal, sys, time
epochs, pause = int(sys.argv[1]), float(sys.argv[2])
task = int(os.environ["TFDEPLOY_TASK_INDEX"])
if "--ignore-term" in sys.argv:
    signal.signal(signal.SIGTERM, lambda *_: print("got TERM, ignoring it", flush=True))
print(json.dumps({"event": "start", "task": task, "epochs": epochs}), flush=True)
for epoch in range(1, epochs + 1):
    time.sleep(pause)
    print(json.dumps({"event": "epoch", "task": task, "epoch": epoch, "loss": 1 / epoch}),
          flush=True)
print("training finished", flush=True)
"""


@pytest.fixture
def lab(ssh_lab, tmp_path):
    return lab_with_payload(ssh_lab, tmp_path, EPOCHS)


def train_command(inventory: Path, runs: Path, payload: Path, args: str, *extra: str):
    # --no-check: the payload is not TensorFlow; --start-timeout 0: it has no first step.
    return [sys.executable, "-m", "invoke", "train", "--hosts", str(inventory), "--runs-dir",
            str(runs), "--payload", str(payload), "--args", args, "--no-check",
            "--start-timeout", "0", *extra]


def wait_for_text(path: Path, text: str, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text():
            return
        assert proc.poll() is None, "the controller exited"
        time.sleep(0.1)
    raise AssertionError(f"{path} never showed {text!r}")


def test_sigterm_stops_every_task_and_exits_143_without_a_traceback(lab, tmp_path):
    inventory, hosts, payload = lab
    runs = tmp_path / "runs"
    controller = subprocess.Popen(train_command(inventory, runs, payload, "200 0.2"), cwd=REPO,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  preexec_fn=default_signals)
    run_id = None
    try:
        run_id = wait_for_first_epoch(runs, controller, "worker-1.log")
        assert len(processes_of_run(run_id)) >= 4, "two tasks and their supervisors run"
        controller.send_signal(signal.SIGTERM)
        left = wait_until_gone(run_id, timeout=5)
        out = controller.communicate(timeout=60)[0]
        assert left == [], "every task is gone within 5 s of the SIGTERM"
        assert controller.returncode == 143, out
        assert "Traceback" not in out and "terminated: stopping every task" in out, out
        assert record(runs, run_id)["state"] == "interrupted"
        summary = json.loads((runs / run_id / "summary.json").read_text())
        assert summary["ended_by"] == "terminated" and summary["exit_code"] == 143
        assert_nothing_left(runs / run_id, hosts)
    finally:
        clean_up(controller, run_id, hosts)


def test_a_closed_terminal_leaves_the_run_going_for_logs_follow(lab, tmp_path):
    """`inv train` on a terminal that goes away: the terminal is hung up and the controller's
    process group gets SIGHUP, as when a terminal window or an SSH session closes."""
    inventory, hosts, payload = lab
    runs = tmp_path / "runs"
    master, slave = pty.openpty()
    controller = subprocess.Popen(train_command(inventory, runs, payload, "50 0.3"), cwd=REPO,
                                  stdin=slave, stdout=slave, stderr=slave,
                                  start_new_session=True, preexec_fn=default_signals)
    os.close(slave)
    run_id = None
    try:
        run_id = wait_for_first_epoch_on(master, runs, controller)
        os.close(master)                             # the terminal is gone...
        master = None
        # ...the controller's writes meet it first (its live table redraws 4 times a second)...
        time.sleep(1)
        os.killpg(controller.pid, signal.SIGHUP)     # ...then its processes are told
        assert controller.wait(timeout=60) == 129
        assert record(runs, run_id)["state"] == "detached"
        assert len(processes_of_run(run_id)) >= 4, "training goes on without a controller"
        # SIGTERM to a follower stops the following only, as its Ctrl-C does.
        follower = subprocess.Popen(
            [sys.executable, "-m", "invoke", "logs", "--run", run_id, "--runs-dir", str(runs),
             "--follow"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            preexec_fn=default_signals)
        try:
            wait_for_follower(runs, run_id, follower)
            follower.send_signal(signal.SIGTERM)
            out = follower.communicate(timeout=60)[0]
        finally:
            end(follower)
        assert follower.returncode == 143 and "goes on" in out and "Traceback" not in out, out
        assert record(runs, run_id)["state"] == "detached"
        assert len(processes_of_run(run_id)) >= 4
        done = inv("logs", "--run", run_id, "--runs-dir", str(runs), "--follow")
        assert done.returncode == 0, done.stdout + done.stderr
        assert "training finished" in done.stdout and "epoch 50/50" in done.stdout
        assert "teardown: no process of run" in done.stdout
        for i in range(2):
            assert epoch_lines(runs / run_id / f"worker-{i}.log") == list(range(1, 51))
        assert record(runs, run_id)["state"] == "finished"
        assert_nothing_left(runs / run_id, hosts)
    finally:
        if master is not None:
            os.close(master)
        if controller.poll() is None:
            os.killpg(controller.pid, signal.SIGKILL)
            controller.wait()
        if run_id:
            kill_by_records(run_id, hosts)


@pytest.mark.parametrize("output", ["console", "json"])
def test_a_reader_gone_from_the_pipe_leaves_the_run_going_and_says_so_on_stderr(lab, tmp_path,
                                                                                 output):
    """`inv train | head` (or `--json | jq` with jq gone): once the pipe's reader is gone,
    the controller's next write fails (EPIPE; Python ignores SIGPIPE). The run is let go as
    for a closed terminal, exit 141, and stderr, still the user's, says how to follow it."""
    inventory, hosts, payload = lab
    runs = tmp_path / "runs"
    extra = ("--json",) if output == "json" else ()
    controller = subprocess.Popen(train_command(inventory, runs, payload, "50 0.3", *extra),
                                  cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, preexec_fn=default_signals)
    run_id = None
    try:
        run_id = wait_for_first_epoch(runs, controller, "worker-1.log")
        controller.stdout.close()                    # head has read its lines
        assert controller.wait(timeout=60) == 141
        said = controller.stderr.read()
        assert "Traceback" not in said, said
        assert f"run {run_id} is running detached" in said, said
        assert f"inv logs --run {run_id} --follow" in said, said
        assert record(runs, run_id)["state"] == "detached"
        assert len(processes_of_run(run_id)) >= 4, "training goes on without a controller"
        # A follower whose pipe's reader is gone stops following, not the run.
        read_end, write_end = os.pipe()
        os.close(read_end)
        try:
            follower = subprocess.run(
                [sys.executable, "-m", "invoke", "logs", "--run", run_id, "--runs-dir",
                 str(runs), "--follow"], cwd=REPO, stdout=write_end, stderr=subprocess.PIPE,
                text=True, timeout=60, preexec_fn=default_signals)
        finally:
            os.close(write_end)
        assert follower.returncode == 141, follower.stderr
        assert f"stopped following; run {run_id} goes on" in follower.stderr, follower.stderr
        assert record(runs, run_id)["state"] == "detached"
        assert len(processes_of_run(run_id)) >= 4
        done = inv("logs", "--run", run_id, "--runs-dir", str(runs), "--follow")
        assert done.returncode == 0, done.stdout + done.stderr
        for i in range(2):
            assert epoch_lines(runs / run_id / f"worker-{i}.log") == list(range(1, 51))
        assert record(runs, run_id)["state"] == "finished"
        assert_nothing_left(runs / run_id, hosts)
    finally:
        clean_up(controller, run_id, hosts)


def test_a_reader_gone_before_the_tasks_started_stops_the_run_and_says_so(lab, tmp_path):
    """`inv train | head -3`: the reader leaves once the records are named, and the next write
    (the push's line) fails before any task started. Nothing is left to go on: what was pushed
    is torn down as by Ctrl-C, the exit status is the closed pipe's (141), and stderr says it."""
    inventory, hosts, payload = lab
    # A push long enough that the reader is gone before the push's line is written.
    (payload / "weights.bin").write_bytes(os.urandom(24 << 20))
    runs = tmp_path / "runs"
    controller = subprocess.Popen(train_command(inventory, runs, payload, "50 0.3"),
                                  cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, preexec_fn=default_signals)
    run_id = None
    try:
        while "local records in" not in (line := controller.stdout.readline()):
            assert line, "the controller ended before naming its records"
        controller.stdout.close()                    # head has read its three lines
        (run_dir,) = runs.iterdir()
        run_id = run_dir.name
        assert controller.wait(timeout=60) == 141
        said = controller.stderr.read()
        assert "Traceback" not in said, said
        assert f"no task of run {run_id} had started: tearing down" in said, said
        assert record(runs, run_id)["state"] == "interrupted"
        assert record(runs, run_id)["exit_code"] == 141
        assert json.loads((run_dir / "summary.json").read_text())["ended_by"] == "output closed"
        assert all(epoch_lines(log) == [] for log in run_dir.glob("*.log"))
        assert_nothing_left(run_dir, hosts)
    finally:
        clean_up(controller, run_id, hosts)


def wait_for_follower(runs: Path, run_id: str, follower: subprocess.Popen,
                      timeout: float = 60) -> None:
    """Until `follower` has taken the run over (its pid in the record)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if record(runs, run_id).get("controller_pid") == follower.pid:
            return
        assert follower.poll() is None, follower.stdout.read()
        time.sleep(0.1)
    raise AssertionError("the follower never took the run over")


def wait_for_first_epoch_on(master: int, runs: Path, controller: subprocess.Popen,
                            timeout: float = 120) -> str:
    """The run id once its first epoch reached the controller, reading the terminal all the
    while (a terminal nobody reads blocks its writer)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if select.select([master], [], [], 0.1)[0]:
            try:
                os.read(master, 65536)
            except OSError:
                pass
        logs = list(runs.glob("*/worker-1.log")) if runs.exists() else []
        if logs and '"event": "epoch"' in logs[0].read_text():
            return logs[0].parent.name
        assert controller.poll() is None, "the controller exited"
    raise AssertionError("training never reached its first epoch")


def test_a_second_ctrl_c_abandons_the_teardown_and_names_inv_down(lab, tmp_path):
    """Tasks that ignore SIGTERM hold the stop for the whole grace; a second Ctrl-C then
    leaves at once, and `inv down` finishes the job."""
    inventory, hosts, payload = lab
    runs = tmp_path / "runs"
    controller = subprocess.Popen(
        train_command(inventory, runs, payload, "200 0.2 --ignore-term", "--grace", "5"),
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        preexec_fn=default_signals)
    run_id = None
    try:
        run_id = wait_for_first_epoch(runs, controller, "worker-1.log")
        controller.send_signal(signal.SIGINT)
        # The stop reached the tasks (they say so in their logs): the teardown waits.
        wait_for_text(runs / run_id / "worker-0.log", "got TERM", controller)
        controller.send_signal(signal.SIGINT)
        out = controller.communicate(timeout=60)[0]
        assert controller.returncode == 130, out
        assert "Traceback" not in out, out
        assert "teardown abandoned: tasks may still run on h1, h2" in out, out
        assert f"inv down --run {run_id} --runs-dir {runs}" in out, out
        assert record(runs, run_id)["state"] == "running"
        assert "no controller" in inv("runs", "--runs-dir", str(runs)).stdout
        down = inv("down", "--run", run_id, "--runs-dir", str(runs))
        assert down.returncode == 0, down.stdout + down.stderr
        assert_nothing_left(runs / run_id, hosts)
    finally:
        clean_up(controller, run_id, hosts)


def test_after_a_hangup_writes_to_the_dead_terminal_go_nowhere_instead_of_failing(tmp_path):
    """A process whose terminal was closed (the pty's master end gone) gets EIO on every
    write; the controller's output, print and rich alike, survives it (no SIGHUP is sent
    here: the write fails first)."""
    script = textwrap.dedent("""
        import os, sys, traceback
        from rich.console import Console
        from deploy.run.signals import controller_signals
        def report(*exc):
            traceback.print_exception(*exc, file=open("result", "a"))
        sys.excepthook = report
        os.read(0, 1)                       # the test closes the terminal, then lets us on
        try:
            os.write(1, b"x")
            print("wrote to a dead terminal", file=open("result", "w"))
        except OSError as exc:
            print(f"before: {exc.errno}", end=" ", file=open("result", "w"))
        with controller_signals():
            console = Console()
            for _ in range(1000):
                print("the end of a run nobody watches", flush=True)
                console.print("[bold]and its summary[/]")
                print("and a warning", file=sys.stderr, flush=True)
        print("after: ok", file=open("result", "a"))
    """)
    master, slave = pty.openpty()
    rd, wr = os.pipe()
    child = subprocess.Popen([sys.executable, "-c", script], stdin=rd, stdout=slave,
                             stderr=slave, cwd=tmp_path, start_new_session=True,
                             env={**os.environ, "PYTHONPATH": os.getcwd()})
    os.close(slave)
    os.close(rd)
    os.close(master)
    os.write(wr, b"go")
    os.close(wr)
    code = child.wait(timeout=30)
    assert (tmp_path / "result").read_text() == f"before: {errno.EIO} after: ok\n"
    assert code == 0
