"""The background controller of `--detach --restarts N` (deploy/run/background.py), without a
process or a host: its command line and settings, the env values it is handed, the record's
word for it, how it is told from another process, and what its log shows."""
from __future__ import annotations

import dataclasses
import io
import json
import os
from pathlib import Path

from rich.console import Console

from deploy.console.reporter import ControllerLogReporter
from deploy.host.archive import Limits
from deploy.run.background import (
    MODULE, controller_argv, envs_of, is_controller, settings_of, supervised
)
from deploy.run.run import RunSettings
from deploy.state.events import Restarting, TaskOutput, TaskProgressed
from deploy.state.progress import NewLines
from deploy.state.record import FollowLock, RunState, load_record, update_record

from test_records import lab_plan, recorded


def test_the_settings_travel_on_the_command_line_and_come_back(tmp_path):
    settings = RunSettings(runs_dir=tmp_path / "runs", connect_timeout=4.5, start_timeout=0,
                           lost_after=3, restarts=2, verbose=True, shrink=True, min_workers=2,
                           fetch_limits=Limits(bytes=5 << 30), accept_new_host_keys=True)
    argv = controller_argv(settings, "20260101-000000-abcdef", 7)
    assert argv[1:5] == ["-m", MODULE, "--run", "20260101-000000-abcdef"]
    assert argv[argv.index("--lock-fd") + 1] == "7"
    assert argv[-2:] == ["--program", "inv"]        # what its hints name
    runs_dir = argv[argv.index("--runs-dir") + 1]
    assert Path(runs_dir).is_absolute()
    back = settings_of(runs_dir, argv[argv.index("--settings") + 1])
    assert back == dataclasses.replace(settings, runs_dir=Path(runs_dir), detach=True)


def test_a_relaunch_plan_gets_back_the_env_no_record_holds(tmp_path):
    plan = lab_plan()
    record = load_record(recorded(tmp_path, plan))
    sent = {h.name: {k: [v.value, v.secret] for k, v in h.env.items()}
            for h in plan.inventory.hosts}
    assert any(sent.values())
    envs = envs_of(json.dumps(sent).encode())
    again = record.plan("record", envs)
    assert [hp.host.env for hp in again.hosts] == [hp.host.env for hp in plan.hosts]
    assert [t.endpoint for t in again.tasks] == [t.endpoint for t in plan.tasks]
    # Without them, the record's plan has none (the record holds no value).
    assert all(not hp.host.env for hp in record.plan().hosts)


def test_the_record_names_a_background_controller(tmp_path):
    run_dir = recorded(tmp_path, lab_plan(), state=RunState.RUNNING)
    record = update_record(run_dir, controller_pid=os.getppid(), background=True)
    assert load_record(run_dir).background is True
    assert record.shown_state() == f"running (background controller, pid {os.getppid()})"
    dead = int(Path("/proc/sys/kernel/pid_max").read_text())
    record = update_record(run_dir, controller_pid=dead)
    assert record.shown_state() == "running (no controller)"
    assert not supervised(record)
    # A record written before the field: no background controller.
    doc = json.loads((run_dir / "record.json").read_text())
    del doc["background"]
    (run_dir / "record.json").write_text(json.dumps(doc))
    assert load_record(run_dir).background is False


def test_a_pid_is_the_controller_only_while_its_command_line_names_the_run():
    # This process is alive but is not a background controller: a reused pid is not taken
    # for one.
    assert not is_controller(os.getpid(), "20260101-000000-abcdef")
    assert not is_controller(None, "20260101-000000-abcdef")
    dead = int(Path("/proc/sys/kernel/pid_max").read_text())
    assert not is_controller(dead, "20260101-000000-abcdef")


def test_an_inherited_lock_is_held(tmp_path):
    run_dir = recorded(tmp_path, lab_plan())
    holder = FollowLock(run_dir)
    assert holder.acquire()
    inherited = FollowLock.inherited(run_dir, os.dup(holder.file.fileno()))
    holder.release()
    assert not FollowLock(run_dir).acquire()      # the same open file still holds it
    inherited.release()
    other = FollowLock(run_dir)
    assert other.acquire()
    other.release()


def test_the_controller_log_holds_events_not_task_output():
    out = io.StringIO()
    reporter = ControllerLogReporter(Console(file=out, width=120, no_color=True))
    reporter.emit(TaskOutput("worker-0", 0, "h1", None, NewLines(b"tick 1\n")))
    reporter.emit(TaskProgressed("worker-0", "h1", "running", 1, 5, 0.5, {}))
    with reporter.status("stopping…"), reporter.watching([], "run", False):
        reporter.emit(Restarting(1, 2, "worker-1", "exit code 3"))
    assert out.getvalue().splitlines() == [
        "restart 1 of 2: worker-1 failed (exit code 3); stopping the cluster, carrying the "
        "chief's backup, relaunching…"]
