"""The local run record: a round trip back to the same plan, no environment value in it,
finding a run by id, prefix or age, and the one-follower lock."""
from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path

import pytest

from deploy.plan.planner import Options, plan_run
from deploy.state.record import (
    HOST_FIELDS, RECORD_FILE, FollowLock, RecordError, RunRecord, RunState, find_run, list_records,
    load_record, read_records, update_record, write_record
)
from test_planner import SECRET_FROM_ENV, SECRET_IN_FILE, inventory_of

PORTS = {0: 20000, 1: 20001, 2: 30000}
PLAIN = "/data/set one"


def lab_plan(run_id="20260101-000000-abcdef", ports=PORTS):
    """The planner tests' lab inventory: two hosts, plain and secret env values."""
    return plan_run(inventory_of("lab"), Options(entry="main.py", args=("--epochs", "5"),
                                                 grace=1.5), run_id, ports)


def recorded(tmp_path, plan, state=RunState.DETACHED, started=None):
    run_dir = tmp_path / plan.run_id
    run_dir.mkdir(parents=True)
    write_record(run_dir, RunRecord.of(plan, state, started or time.time()))
    return run_dir


def document(run_dir):
    return json.loads((run_dir / RECORD_FILE).read_text())


def rewrite(run_dir, doc):
    (run_dir / RECORD_FILE).write_text(json.dumps(doc))


def test_a_record_gives_back_the_same_plan(tmp_path):
    plan = lab_plan()
    again = load_record(recorded(tmp_path, plan)).plan()
    assert again.run_id == plan.run_id and again.options == plan.options
    assert [h.run_dir for h in again.hosts] == [h.run_dir for h in plan.hosts]
    assert [h.host for h in again.hosts] == [
        hp.host.__class__(**{**hp.host.__dict__, "env": {}}) for hp in plan.hosts]
    assert set(plan.tasks[0].host.env) == {"DATASET", "API_KEY", "TOKEN"}
    for mine, theirs in zip(again.tasks, plan.tasks):
        assert (mine.index, mine.endpoint, mine.launch.shown(), mine.tf_config) == (
            theirs.index, theirs.endpoint, theirs.launch.shown(), theirs.tf_config)
        # Only tfdeploy's own variables: the host's env is not kept.
        assert set(theirs.env) - set(mine.env) == set(theirs.host.env)
        assert {k: v.value for k, v in mine.env.items()} == {
            k: v.value for k, v in theirs.env.items() if k not in theirs.host.env}


def test_no_environment_value_is_stored(tmp_path):
    text = (recorded(tmp_path, lab_plan()) / RECORD_FILE).read_text()
    for value in (SECRET_FROM_ENV, SECRET_IN_FILE, PLAIN, "***"):
        assert value not in text
    assert "env" not in json.loads(text)["hosts"][0]


def test_connection_fields_survive(tmp_path):
    run_dir = recorded(tmp_path, lab_plan())
    a, b = load_record(run_dir).hosts
    doc = document(run_dir)
    assert (a.user, a.python, a.workers, a.cluster_address, a.env) == (
        "researcher", "~/venv/bin/python", 2, "10.1.2.3", {})
    assert (b.address, b.port, b.workdir, b.user) == ("10.1.2.4", 2222, "/scratch/tf",
                                                      "researcher")
    assert set(doc["hosts"][0]) == {*HOST_FIELDS, "run_dir"}
    assert [t["endpoint"] for t in doc["tasks"]] == ["10.1.2.3:20000", "10.1.2.3:20001",
                                                      "10.1.2.4:30000"]


def test_a_record_edited_out_of_shape_is_refused(tmp_path):
    run_dir = recorded(tmp_path, lab_plan())
    doc = document(run_dir)
    doc["tasks"][2]["endpoint"] = "10.9.9.9:1"
    rewrite(run_dir, doc)
    with pytest.raises(RecordError, match="do not match"):
        load_record(run_dir).plan()
    (run_dir / RECORD_FILE).write_text("{not json")
    with pytest.raises(RecordError, match="unreadable run record"):
        load_record(run_dir)


@pytest.mark.parametrize("change, message", [
    (lambda d: d.update(state="sleeping"), "unknown state 'sleeping'"),
    (lambda d: d.update(run_id="../../etc"), "is not a run id"),
    (lambda d: d.pop("tasks"), "field 'tasks' is missing"),
    (lambda d: d.update(started="yesterday"), "'started' must be a number"),
    (lambda d: d["tasks"][0].update(colour="red"), "unexpected keyword argument 'colour'"),
    (lambda d: d.update(hosts=[]), "'hosts' must be a non-empty list"),
    (lambda d: d.update(version=7), "not a tfdeploy run record of version 1"),
    (lambda d: d.clear(), "not a tfdeploy run record of version 1"),
])
def test_a_damaged_or_foreign_record_is_refused_naming_the_file(tmp_path, change, message):
    run_dir = recorded(tmp_path, lab_plan())
    doc = document(run_dir)
    change(doc)
    rewrite(run_dir, doc)
    with pytest.raises(RecordError, match=message) as refused:
        load_record(run_dir)
    assert str(refused.value).startswith(str(run_dir / RECORD_FILE))


def test_a_record_reads_back_as_written(tmp_path):
    run_dir = recorded(tmp_path, lab_plan(), state=RunState.RUNNING, started=123.5)
    record = load_record(run_dir)
    assert record == RunRecord.from_document(record.document(), "again")
    assert (record.state, record.started, record.attempt) == (RunState.RUNNING, 123.5, 1)


def test_write_is_atomic_and_update_keeps_other_fields(tmp_path):
    run_dir = recorded(tmp_path, lab_plan())
    update_record(run_dir, state=RunState.FINISHED, exit_code=3)
    record = load_record(run_dir)
    assert (record.state, record.exit_code, len(record.tasks)) == (RunState.FINISHED, 3, 3)
    assert sorted(p.name for p in run_dir.iterdir()) == [RECORD_FILE]   # no temp file left
    assert record.shown_state() == "finished (exit 3)"


def test_find_run_by_id_prefix_or_newest(tmp_path):
    old = recorded(tmp_path, lab_plan("20260101-000000-aaaaaa"), started=100.0)
    new = recorded(tmp_path, lab_plan("20260102-000000-bbbbbb"), started=200.0)
    (tmp_path / "not-a-run").mkdir()
    assert [r.run_id for r in list_records(tmp_path)] == [old.name, new.name]
    assert find_run(tmp_path, None) == new
    assert find_run(tmp_path, old.name) == old
    assert find_run(tmp_path, "20260101") == old
    with pytest.raises(RecordError, match="ambiguous"):
        find_run(tmp_path, "2026010")
    with pytest.raises(RecordError, match="no run 'zzz'"):
        find_run(tmp_path, "zzz")
    with pytest.raises(RecordError, match="no runs recorded"):
        find_run(tmp_path / "empty", None)


def test_a_running_record_whose_controller_is_gone_says_so(tmp_path):
    record = load_record(recorded(tmp_path, lab_plan(), state=RunState.RUNNING))
    # No process has a pid as high as pid_max: pids are below it.
    dead = int(Path("/proc/sys/kernel/pid_max").read_text())
    record = dataclasses.replace(record, controller_pid=dead)
    assert record.shown_state() == "running (no controller)"
    record = dataclasses.replace(record, controller_pid=os.getppid())
    assert record.shown_state() == "running"


def test_only_one_follower_holds_the_lock(tmp_path):
    run_dir = recorded(tmp_path, lab_plan())
    first, second = FollowLock(run_dir), FollowLock(run_dir)
    assert first.acquire()
    assert not second.acquire()
    first.release()
    assert second.acquire()
    second.release()


def test_the_runs_table_shows_each_state(tmp_path):
    from rich.console import Console

    from deploy.console.view import runs_table
    from deploy.state.events import listed
    docs = []
    for n, (state, extra) in enumerate([(RunState.DETACHED, {}),
                                        (RunState.FINISHED, {"exit_code": 3}),
                                        (RunState.DOWN, {"attempt": 2})]):
        run_dir = recorded(tmp_path, lab_plan(f"20260101-00000{n}-abcdef"), state=state,
                           started=100.0 + n)
        docs.append(update_record(run_dir, **extra))
    console = Console(record=True, width=200)
    console.print(runs_table(tuple(listed(r) for r in list_records(tmp_path)), "runs"))
    rows = [line for line in console.export_text().splitlines() if "20260101" in line]
    assert [r.split("│")[1].strip() for r in rows] == [d.run_id for d in docs]
    assert "detached" in rows[0] and "finished (exit 3)" in rows[1]
    assert "down, attempt 2" in rows[2] and "a, b" in rows[2] and "│ 3 " in rows[2]


def test_restarts_stop_when_used_up_or_when_a_stop_failed():
    from deploy.run.restarts import Restarter
    from deploy.state.events import RestartRefused

    class FakeRun:
        attempt, problems = 1, []

        class reporter:
            told = []
            emit = told.append

    restarter = Restarter(limit=1)
    run = FakeRun()
    assert restarter.may_restart(run)
    run.problems = ["h2: processes of the run still alive after SIGKILL: 123"]
    assert not restarter.may_restart(run)
    run.problems, restarter.used = [], 1      # a restart was spent (a resumed run's own)
    assert not restarter.may_restart(run)
    assert [e.why for e in FakeRun.reporter.told] == [
        "not restarting: the failed attempt could not be stopped everywhere",
        "no restarts left (1 allowed): ending the run"]
    assert all(isinstance(e, RestartRefused) for e in FakeRun.reporter.told)


def test_gpus_and_the_setup_environment_survive_the_round_trip(tmp_path):
    plan = plan_run(inventory_of("gpus"), Options(requirements_sha256="ab" * 32),
                    "20260101-000000-fedcba", {i: 21000 + i for i in range(8)})
    again = load_record(recorded(tmp_path, plan)).plan()
    assert again.options == plan.options
    assert [h.host.gpus for h in again.hosts] == [h.host.gpus for h in plan.hosts]
    assert [t.launch.shown() for t in again.tasks] == [t.launch.shown() for t in plan.tasks]


def test_gateways_survive_the_round_trip(tmp_path):
    plan = plan_run(inventory_of("jump"), Options(), "20260101-000000-0a0b0c", {0: 20000, 1: 20001})
    again = load_record(recorded(tmp_path, plan)).plan()
    assert [h.host for h in again.hosts] == [h.host for h in plan.hosts]
    assert [(h.host.jump, [hop.shown() for hop in h.host.via]) for h in again.hosts] == [
        ("admin@gw.example:2222", ["admin@gw.example:2222"]),
        ("gw.example,bastion", ["gw.example:22", "bastion:22"])]
    assert [t.launch.shown() for t in again.tasks] == [t.launch.shown() for t in plan.tasks]


def test_damaged_records_are_named_with_why_and_the_good_ones_listed(tmp_path):
    import io

    from rich.console import Console

    from deploy.console.reporter import ConsoleReporter
    from deploy.run.reattach import list_runs
    good = recorded(tmp_path, lab_plan("20260101-000001-abcdef"))
    (tmp_path / "20260101-000002-abcdef").mkdir()
    (tmp_path / "20260101-000002-abcdef" / "record.json").write_text("{not json")
    foreign = tmp_path / "20260101-000003-abcdef"
    foreign.mkdir()
    (foreign / "record.json").write_text(json.dumps({"version": 99}))
    records, damaged = read_records(tmp_path)
    assert [r.run_id for r in records] == [good.name]
    assert len(damaged) == 2 and all("record.json" in d for d in damaged)
    assert "unreadable run record" in damaged[0] and str(foreign) in damaged[1]
    console = Console(file=io.StringIO(), width=300, color_system=None)
    assert list_runs(tmp_path, ConsoleReporter(console)) == 0
    text = console.file.getvalue()
    assert good.name in text
    assert f"skipped {tmp_path}/20260101-000002-abcdef/record.json: unreadable" in text
    assert f"skipped {foreign}/record.json" in text


def test_a_task_is_named_by_its_name_or_its_index():
    from deploy.run.reattach import task_index
    plan = lab_plan()
    assert [task_index(plan, t) for t in ("worker-1", "1", None)] == [1, 1, None]
    with pytest.raises(RecordError, match=r"has no task 'chief-0' \(its tasks: worker-0, "):
        task_index(plan, "chief-0")
    with pytest.raises(RecordError, match="has no task '7'"):
        task_index(plan, "7")
