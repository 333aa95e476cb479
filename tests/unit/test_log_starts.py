"""Where a host's log begins in the local copy (RecordedTask.log_start): a resumed run's hosts,
and a spare that took a lost host's task, start empty logs while the local ones go on. The
record keeps it, and a controller that reads the local copies again (the background one,
`inv logs --follow`, `inv down`) asks the hosts from the right byte."""
from __future__ import annotations

import dataclasses
import io

import pytest
from rich.console import Console

from deploy.console.reporter import ControllerLogReporter
from deploy.inventory.model import Inventory
from deploy.plan.planner import plan_run
from deploy.run.run import Run, load_local_logs
from deploy.state import localdir
from deploy.state.record import RecordError, RunRecord, RunState, load_record, write_record

from test_records import PORTS, document, lab_plan, recorded, rewrite


def a_run(run_dir, plan) -> Run:
    reporter = ControllerLogReporter(Console(file=io.StringIO(), width=120, no_color=True))
    return Run(plan, None, run_dir, reporter)


def test_log_starts_survive_the_record_and_a_replan(tmp_path):
    plan = lab_plan()
    run_dir = tmp_path / plan.run_id
    run_dir.mkdir()
    write_record(run_dir, RunRecord.of(plan, RunState.STARTING, 1.0, {0: 120, 2: 7},
                                       attempt=2))
    record = load_record(run_dir)
    assert record.log_starts() == {0: 120, 2: 7} and record.attempt == 2
    assert [t["log_start"] for t in document(run_dir)["tasks"]] == [120, 0, 7]
    # A relaunch's record keeps what it is given, and only that.
    assert record.replanned(plan, {1: 5}).log_starts() == {1: 5}
    # Every task of a run never resumed nor moved starts at 0.
    assert load_record(recorded(tmp_path / "fresh", plan)).log_starts() == {}


def test_a_record_without_log_starts_reads_as_zero(tmp_path):
    run_dir = recorded(tmp_path, lab_plan())
    doc = document(run_dir)
    for task in doc["tasks"]:
        del task["log_start"]
    rewrite(run_dir, doc)
    assert load_record(run_dir).log_starts() == {}


@pytest.mark.parametrize("value", [-1, "12", 1.5, True, None])
def test_a_log_start_out_of_shape_is_refused(tmp_path, value):
    run_dir = recorded(tmp_path, lab_plan())
    doc = document(run_dir)
    doc["tasks"][1]["log_start"] = value
    rewrite(run_dir, doc)
    with pytest.raises(RecordError, match="log_start"):
        load_record(run_dir)


def test_the_hosts_logs_are_read_from_the_local_size_less_the_log_start(tmp_path):
    plan = lab_plan()
    run_dir = tmp_path / plan.run_id
    run_dir.mkdir()
    logs = {0: b"epoch 1\nepoch 2\n", 1: b"a line\n", 2: b"x\n"}
    for task in plan.tasks:
        localdir.task_log(run_dir, task.name).write_bytes(logs[task.index])
    run = a_run(run_dir, plan)
    run.log_starts = {0: len(logs[0]), 1: 3, 2: 100}
    load_local_logs(run, None)
    # Task 0 resumed just now: its host's log is empty; task 1's began 3 bytes into the copy;
    # a start past the copy's end (a local log cut short by hand) reads the host's from 0.
    assert [(t.offset, t.size) for t in run.tasks] == [(0, 0), (4, 4), (0, 0)]
    run.close()
    plain = a_run(run_dir, plan)
    load_local_logs(plain, None)
    assert [t.offset for t in plain.tasks] == [len(logs[i]) for i in range(3)]
    plain.close()


def test_a_task_moved_to_another_host_starts_there_at_the_local_size(tmp_path):
    plan = lab_plan()
    run_dir = tmp_path / plan.run_id
    run_dir.mkdir()
    run = a_run(run_dir, plan)
    moved = plan.tasks[2]
    assert moved.host.name == "b"
    run.logs[moved.index].write(b"0123456789\n")
    run.logs[moved.index].flush()
    hosts = tuple(dataclasses.replace(h, name="c") if h.name == "b" else h
                  for h in plan.inventory.hosts)
    run.replan(plan_run(Inventory(path="spare.yaml", hosts=hosts), plan.options, plan.run_id,
                        PORTS))
    assert run.log_starts == {moved.index: 11}
    assert [(t.host, t.offset) for t in run.tasks if t.index == moved.index] == [("c", 0)]
    run.close()
