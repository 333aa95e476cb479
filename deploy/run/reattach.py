"""A run found again from its local record, by any shell: `inv runs`, `status`, `logs`, `down`.

The inventory is not needed: the record holds every host's connection fields, run directory
and ports (deploy/state/record.py). Following to the end goes through the same path as a
fresh launch (watch.py, finish.py), so a reattached run ends exactly like one never left.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from deploy.commandline import command
from deploy.errors import BadInput, Failure
from deploy.inventory.model import Inventory
from deploy.console.lines import shown_line
from deploy.run import background
from deploy.run.finish import Finish, draw_loss_plot, finish, runs_dir_flag
from deploy.run.run import Run, RunSettings, load_local_logs
from deploy.run.signals import HungUp, OutputClosed, exit_code
from deploy.run.submitted import cancel, job, queued_row, show_output, shown_with_job, submitted_job
from deploy.run.watch import follow_to_end
from deploy.cluster.session import Session
from deploy.host.records import replace
from deploy.state import localdir
from deploy.state.events import (
    FollowStopped, RecordDamaged, Reporter, RunListed, RunNote, RunStatus, RunsListed, listed,
    snapshot
)
from deploy.state.progress import NO_EPOCHS, NewLines, told_epochs
from deploy.state.record import (
    RECORD_FILE, FollowLock, RecordError, RunRecord, RunState, find_run, load_record,
    read_records, update_record
)


def list_runs(runs_dir: Path, reporter: Reporter) -> int:
    records = _readable(runs_dir, reporter)
    rows = [_listed(runs_dir / r.run_id, r) for r in records]
    recorded = {r.run_id for r in records}
    for local_dir in sorted(runs_dir.glob(f"*/{localdir.SLURM_JOB}")):
        local_dir = local_dir.parent
        if local_dir.name not in recorded:
            try:
                rows.append(queued_row(local_dir, *submitted_job(local_dir)))
            except BadInput as exc:
                reporter.emit(RecordDamaged(str(exc)))
    rows.sort(key=lambda row: (row.started, row.run_id))
    reporter.emit(RunsListed(str(runs_dir), tuple(rows)))
    return 0


def _listed(local_dir: Path, record: RunRecord) -> RunListed:
    submission = submitted_job(local_dir)
    if not submission:
        return listed(record)
    return replace(listed(record), state=shown_with_job(record, submission[0]))


def _readable(runs_dir: Path, reporter: Reporter) -> list[RunRecord]:
    """The readable records, each other one named (its file and why): they are skipped, the
    good ones go on."""
    records, damaged = read_records(runs_dir)
    for problem in damaged:
        reporter.emit(RecordDamaged(problem))
    return records


def task_index(plan, task: str | None) -> int | None:
    """`--task`: a task's index (`1`) or its name (`worker-1`, `chief-0`, `ps-0`)."""
    if task is None:
        return None
    for t in plan.tasks:
        if task in (t.name, str(t.index)):
            return t.index
    raise RecordError(f"run {plan.run_id} has no task {task!r} (its tasks: "
                      f"{', '.join(t.name for t in plan.tasks)}; or their index, "
                      f"0..{len(plan.tasks) - 1})")


def _open(runs_dir: Path, run_id: str | None, settings: RunSettings, reporter: Reporter,
          only_task: str | None = None, writes_logs: bool = False) -> tuple[RunRecord, Run]:
    """The run's record, and a Run connected to its hosts as the record describes them."""
    local_dir = find_run(runs_dir, run_id)
    record = load_record(local_dir)
    where = str(local_dir / RECORD_FILE)
    plan = record.plan(where)
    index = task_index(plan, only_task)
    inventory = Inventory(path=where, hosts=record.hosts)
    session = Session.open(inventory, settings.connect_timeout, settings.accept_new_host_keys)
    run = Run(plan, session, local_dir, reporter, only_task=index, writes_logs=writes_logs,
              limits=settings.fetch_limits)
    run.log_starts = record.log_starts()
    return record, run


def status(runs_dir: Path, run_id: str | None, settings: RunSettings,
           reporter: Reporter) -> int:
    """Every task's state as its host sees it now, with the last metrics."""
    local_dir = find_run(runs_dir, run_id, _readable(runs_dir, reporter))
    submission = submitted_job(local_dir)
    job_now = submission and job(submission[0])
    if job_now:
        reporter.emit(RunNote(local_dir.name, f"run {local_dir.name}: {job_now.shown()}"))
        if not (local_dir / RECORD_FILE).is_file():
            return 0
    record = load_record(local_dir)
    title = f"run {record.run_id}: {_describe(record)}"
    # A submitted run whose job has ended has nothing left on its nodes either.
    if not record.state.active or (job_now and not job_now.active):
        # Its run directories are gone from the hosts: the local copy is all there is.
        run = Run(record.plan(str(local_dir / RECORD_FILE)), None, local_dir, reporter,
                  writes_logs=False)
        load_local_logs(run, None)
        _apply_summary(run, local_dir)
        reporter.emit(RunStatus(title + " (from the local records)",
                                tuple(snapshot(t) for t in run.tasks)))
        return 0
    record, run = _open(runs_dir, record.run_id, settings, reporter)
    try:
        load_local_logs(run, None)
        run.catch_up(print_lines=False)
    finally:
        run.close()
    reporter.emit(RunStatus(title, tuple(snapshot(t) for t in run.tasks)))
    return 0


def logs(runs_dir: Path, run_id: str | None, follow: bool, task: str | None,
         settings: RunSettings, reporter: Reporter, tail: int | None = None) -> int:
    """The local copy, then what the hosts have beyond it; with `follow`, on to the end of
    the run and its end-of-run work. `task`: only that task's lines (`--task`, its index or
    its name). `tail`: of the local copy, only each task's last lines (read from the end of
    the file: a log of gigabytes costs what its last lines take)."""
    local_dir = find_run(runs_dir, run_id, _readable(runs_dir, reporter))
    submission = submitted_job(local_dir)
    if submission and (not (local_dir / RECORD_FILE).is_file()
                       or load_record(local_dir).state.active):
        # Its controller runs inside the job and writes the local logs itself; what it
        # shows is the job's output.
        return show_output(local_dir, submission[0], follow, reporter)
    record = load_record(local_dir)
    if not record.state.active:
        _show_local(record, local_dir, reporter, task, settings.verbose, tail)
        reporter.emit(RunNote(record.run_id, f"run {record.run_id} has ended "
                                             f"({_describe(record)}): the logs above are complete"))
        return 0
    if follow and background.supervised(record):
        # Its background controller follows it and writes the local logs: watch those.
        return background.watch(local_dir, record, task_index(record.plan(), task),
                                settings.verbose, reporter)
    if follow and record.state is RunState.STARTING and not record.controller_alive():
        # Its controller ended while launching: some tasks may never have started, and a
        # follower would wait for them forever.
        raise RecordError(f"run {record.run_id} was never fully started (its controller ended "
                          f"during the launch): stop it with {command('down')} "
                          f"--run {record.run_id}")
    lock = FollowLock(local_dir)
    if not lock.acquire() and not follow:
        # The controller following the run keeps the local copy current: show that.
        _show_local(record, local_dir, reporter, task, settings.verbose, tail)
        return 0
    if lock.file is None:
        raise RecordError(f"run {record.run_id} is being followed by another controller "
                          f"(pid {record.controller_pid}); its logs are being written by it")
    if record.state is RunState.RUNNING and not record.controller_alive():
        # The controller that followed it was killed outright and could not say it let go.
        # Said now, before this one's logins: a follow interrupted during them leaves the run
        # detached, as it is, not followed by a controller that is gone.
        record = update_record(local_dir, state=RunState.DETACHED, controller_pid=None)
    try:
        record, run = _open(runs_dir, record.run_id, settings, reporter, only_task=task,
                            writes_logs=True)
        # Filtered as `train` shows it (TensorFlow's C++ log hidden); --verbose: every line.
        run.raw = settings.verbose
        how = Finish.DONE
        try:
            if tail is not None and not follow:
                # Only the end is shown: the hosts' new bytes are added to the local copy
                # without reading what it holds, then its last lines are shown.
                for t in run.tasks:
                    t.offset = t.size = max(0, run.local_size(t) - run.log_starts.get(t.index, 0))
                run.catch_up(print_lines=False)
                run.close()
                _show_tail(run, tail)
                return 0
            load_local_logs(run, None if tail is not None else run.show)
            if tail is not None:
                _show_tail(run, tail)
            if not follow:
                run.catch_up()
                run.close()
                return 0
            run.set_state(RunState.RUNNING, controller_pid=os.getpid(), background=False)
            run.attempt = record.attempt
            run.interrupt_stops = False
            follow_to_end(run, settings)
        except (KeyboardInterrupt, HungUp) as interrupt:
            # Ctrl-C, SIGTERM or a closed terminal here stop following, not the run: it was
            # left running on purpose.
            run.close()
            run.set_state(RunState.DETACHED, controller_pid=None)
            reporter.emit(FollowStopped(record.run_id, runs_dir_flag(local_dir.parent),
                                        stdout_closed=isinstance(interrupt, OutputClosed)))
            return exit_code(interrupt)
        return finish(run, how)
    finally:
        lock.release()


def plot(runs_dir: Path, run_id: str | None, reporter: Reporter) -> int:
    """Draw runs/<id>/loss.png again from the local copies of the logs, however the run
    ended (or while it runs: from what has reached this machine)."""
    local_dir = find_run(runs_dir, run_id)
    record = load_record(local_dir)
    run = Run(record.plan(str(local_dir / RECORD_FILE)), None, local_dir, reporter,
              writes_logs=False)
    load_local_logs(run, None)
    path = draw_loss_plot(run.tasks, local_dir, record.run_id, reporter)
    if path is None:
        raise Failure(f"run {record.run_id}: no task reported a loss in its log "
                      f"({local_dir}): nothing to plot" + (
                          "" if told_epochs(run.tasks) else f"; {NO_EPOCHS}"))
    reporter.emit(RunNote(record.run_id, f"loss curve: {path}"))
    return 0


def down(runs_dir: Path, run_id: str | None, settings: RunSettings,
         reporter: Reporter) -> int:
    """Artifacts first, then TERM, KILL after the grace, a check of every host, cleanup.
    A submitted run: its job cancelled (its controller does the rest)."""
    local_dir = find_run(runs_dir, run_id)
    submission = submitted_job(local_dir)
    if submission:
        return cancel(local_dir, submission[0], reporter)
    # A background controller would relaunch what is stopped: it goes first.
    background.stop_controller(load_record(local_dir), reporter)
    record = load_record(local_dir)
    if not record.state.active and not _teardown_problems(local_dir):
        # Its end already stopped everything and checked every host; a second summary
        # would only overwrite the real one.
        reporter.emit(RunNote(record.run_id, f"run {record.run_id} has already ended "
                                             f"({_describe(record)}): nothing to stop"))
        return 0
    # A run that has ended, but whose end could not reach a host (lost during the run): what
    # is left there goes, and how the run ended stays in its summary and record.
    ended = None if record.state.active else (_summary(local_dir) or None)
    lock = FollowLock(local_dir)
    # Another controller following the run keeps writing its logs; only without one do we.
    mine = lock.acquire()
    try:
        record, run = _open(runs_dir, local_dir.name, settings, reporter, writes_logs=mine)
        if mine:
            load_local_logs(run, None)
        if ended:
            _apply_summary(run, local_dir)
        reporter.emit(RunNote(record.run_id, f"stopping run {record.run_id} "
                                             f"({_describe(record)}) on {len(run.plan.hosts)} "
                                             "host(s)…"))
        return finish(run, Finish.DOWN, ended)
    finally:
        lock.release()


def _show_local(record: RunRecord, local_dir: Path, reporter: Reporter,
                task: str | None, raw: bool, tail: int | None = None) -> None:
    plan = record.plan(str(local_dir / RECORD_FILE))
    run = Run(plan, None, local_dir, reporter, only_task=task_index(plan, task),
              writes_logs=False, raw=raw)
    if tail is None:
        load_local_logs(run, run.show)
    else:
        _show_tail(run, tail)


def _show_tail(run: Run, count: int) -> None:
    """Each task's last `count` lines as the console shows them (with --verbose, as written),
    read from the end of its local log."""
    for task in run.tasks:
        path = localdir.task_log(run.dir, task.name)
        if path.exists():
            run.show(task, NewLines(b"".join(last_shown(path, count, run.raw))))


def last_shown(path: Path, count: int, raw: bool, piece: int = 1 << 16,
               most: int = 64 << 20) -> list[bytes]:
    """The last `count` lines of the file that the console would show (raw: any line), read
    backwards in pieces, at most `most` bytes: a log of gigabytes costs what its end takes."""
    with path.open("rb") as f:
        end = f.seek(0, os.SEEK_END)
        start, data = end, b""
        while True:
            lines = data.split(b"\n")
            whole = lines[1:] if start > 0 else lines     # the first may be cut
            kept = [line + b"\n" for line in whole if line and (
                raw or shown_line(line.decode("utf-8", "replace")) is not None)]
            if len(kept) >= count or start == 0 or end - start >= most:
                return kept[-count:] if count else []
            step = min(piece, start)
            start -= step
            f.seek(start)
            data = f.read(step) + data
            piece *= 2


def _describe(record: RunRecord) -> str:
    return f"{record.shown_state()}, started {record.started_text()}"


def _summary(local_dir: Path) -> dict:
    try:
        return json.loads((local_dir / localdir.SUMMARY).read_text())
    except (OSError, ValueError):
        return {}


def _teardown_problems(local_dir: Path) -> list:
    """What the run's end could not do, hosts lost during the run included."""
    summary = _summary(local_dir)
    return summary.get("teardown_problems", ["no summary"]) + summary.get("lost_hosts", [])


def _apply_summary(run: Run, local_dir: Path) -> None:
    """Exit codes of an ended run, from its summary.json (the hosts no longer know them)."""
    summary = _summary(local_dir)
    for task, row in zip(run.tasks, summary.get("tasks", [])):
        task.state, task.code = row.get("state", task.state), row.get("exit_code")
