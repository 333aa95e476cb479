"""`inv train`: a fresh run from inventory to started tasks, then followed to its end here
(watch.py), left running on its hosts (--detach) for any later shell to pick up, or, with
--detach --restarts N, followed to its end by a controller in the background (background.py).

In phases: prepare (everything that can be checked locally, and the plan), connect and check,
then, inside `ending` (which guarantees the run's end: finish.py), push, launch and follow.
Order matters for "bad input changes nothing anywhere": everything that can be checked locally
(inventory, payload, data, runs directory: preflight.py, as the dry run checks it) is checked
before any host is touched, and once anything has been written to a host, every way out goes
through teardown.
"""
from __future__ import annotations

import contextlib
import os
import time
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Mapping

from deploy.inventory.model import Inventory
from deploy.plan.planner import Options, RunPlan, plan_run
from deploy.plan.ports import task_ports
from deploy.plan.text import plan_document
from deploy.push.data import DataPush
from deploy.push.payload import PayloadPush
from deploy.plan.pythons import payload_need
from deploy.run.background import hand_over
from deploy.run.gpuplace import place_gpus
from deploy.run.hostchecks import check_before_run, probe_asker
from deploy.run.finish import Finish, abandon, finish, runs_dir_flag
from deploy.run.lostport import NewPorts
from deploy.run.preflight import refuse_bad_input, shown_paths
from deploy.run.restarts import Restarter
from deploy.run.run import Run, RunSettings, load_local_logs
from deploy.run.signals import Abandoned, HungUp, OutputClosed
from deploy.run.watch import follow_to_end
from deploy.cluster.session import Session
from deploy.state import localdir
from deploy.state.events import (
    ArchiveNote, Detached, Interrupted, PayloadLeftOut, Pushed, RecordsAt, Reporter,
    RunPlanned, StoppedUnstarted, TasksStarted
)
from deploy.state.record import (
    FollowLock, RunRecord, RunState, new_run_id, write_json, write_record
)
from deploy.timeline import mark


@dataclass
class Prepared:
    """What a run is before any host is touched: its plan (ports still open), and what its
    pushes will send."""
    inventory: Inventory
    plan: RunPlan
    payload: PayloadPush
    data: DataPush


@dataclass(frozen=True)
class Resuming:
    """`inv resume` (resume.py): the attempt it starts, and the copy of the chief's backup
    every host starts it from."""
    attempt: int
    backup: Path


def train(inventory: Inventory, options: Options, settings: RunSettings,
          reporter: Reporter, resuming: Resuming | None = None) -> int:
    prepared = prepare(inventory, options, settings, reporter)
    mark("plan")
    session, checked_ports = connect_and_check(prepared, settings, reporter)
    prepared, checked_ports = on_gpus(prepared, session, settings, reporter, checked_ports)
    run = start_records(prepared, session, settings, reporter, resuming)
    with ending(run, settings) as end:
        push(run, prepared)
        mark("push")
        if resuming is not None:
            carry_kept_backup(run, resuming)
        launch(run, checked_ports, settings)
        mark("launch")
        end.launched = True       # told after: a hangup in the telling leaves them going
        reporter.emit(TasksStarted(len(run.plan.tasks), time.time() - run.started,
                                   tuple(t.endpoint for t in run.plan.tasks)))
        if settings.detach and settings.restarts:
            # A controller that stays: in the background (or, should it not start, here).
            if hand_over(run, settings, end.lock):
                end.code = 0
                return end.code
        elif settings.detach and _all_running(run):
            end.code = _detach(run, settings)
            return end.code
        follow(run, settings)
        mark("tasks ended")
    mark("teardown")
    return end.code


def prepare(inventory: Inventory, options: Options, settings: RunSettings,
            reporter: Reporter) -> Prepared:
    walked = refuse_bad_input(inventory, options, settings.runs_dir)
    run_id = settings.run_id or new_run_id()
    payload = PayloadPush(Path(options.payload), options.entry, run_id,
                          hash_cache=settings.runs_dir / "payload-hashes.json",
                          walked=walked.payload)
    with reporter.status("hashing the data directories…"):
        data = DataPush(inventory, hash_cache=settings.runs_dir / "data-hashes.json",
                        walked=walked.data)
    # From here on every local data source is named by its content: the plan, the record and
    # any relaunch use the same TFDEPLOY_DATA_DIR.
    inventory = data.resolved(inventory)
    plan = plan_run(inventory, options, run_id)
    reporter.emit(RunPlanned(run_id, len(plan.tasks), len(inventory.hosts)))
    if walked.left_out:
        reporter.emit(PayloadLeftOut(shown_paths(walked.left_out, Path(options.payload))))
    return Prepared(inventory, plan, payload, data)


def connect_and_check(prepared: Prepared, settings: RunSettings,
                      reporter: Reporter) -> tuple[Session, Mapping[str, list[int]] | None]:
    """Every host's login and agent, then the checks (closing the session when they fail).
    The ports the checks chose are the run's: the mesh check just proved them reachable from
    every host, and a second probe would cost every host another request."""
    inventory, plan = prepared.inventory, prepared.plan
    # The checks' probe goes right behind each host's agent (hostchecks.py probe_asker).
    first = probe_asker(plan.options.requirements_sha256) if settings.check else None
    with reporter.status(f"connecting to {len(inventory.hosts)} host(s)…"):
        session = Session.open(inventory, settings.connect_timeout, settings.accept_new_host_keys,
                               first)
    if not settings.check:
        return session, None
    push_bytes = {h.name: prepared.payload.total_bytes + prepared.data.bytes_for(h)
                  for h in inventory.hosts}
    report = check_before_run(session, inventory, reporter, plan.options.requirements_sha256,
                              push_bytes, payload_need(Path(plan.options.payload)))
    return session, report.host_ports


def on_gpus(prepared: Prepared, session: Session, settings: RunSettings, reporter: Reporter,
            checked_ports: Mapping[str, list[int]] | None,
            ) -> tuple[Prepared, Mapping[str, list[int]] | None]:
    """The GPUs the hosts give the tasks (gpuplace.py), and the plan made again with them
    (closing the session when they refuse the run). Ports the checks chose for fewer tasks
    than a host now runs (`gpus: free`) are chosen again at launch."""
    try:
        inventory = place_gpus(prepared.inventory, session, prepared.plan.run_id,
                               settings.allow_busy_gpus, reporter)
    except BaseException:
        session.close()
        raise
    if inventory is prepared.inventory:
        return prepared, checked_ports
    plan = plan_run(inventory, prepared.plan.options, prepared.plan.run_id)
    same = all(h.cluster_tasks == len((checked_ports or {}).get(h.name, ()))
               for h in inventory.hosts)
    return (dataclasses.replace(prepared, inventory=inventory, plan=plan),
            checked_ports if same else None)


def start_records(prepared: Prepared, session: Session, settings: RunSettings,
                  reporter: Reporter, resuming: Resuming | None = None) -> Run:
    """The run's local directory and record, written before anything reaches a host: a
    controller lost from here on leaves a record from which `inv down` finds the run."""
    plan = prepared.plan
    local_dir = settings.runs_dir / plan.run_id
    local_dir.mkdir(parents=True, exist_ok=True)
    reporter.emit(RecordsAt(str(local_dir)))
    run = Run(plan, session, local_dir, reporter, raw=settings.verbose,
              limits=settings.fetch_limits)
    if resuming is not None:
        # Its hosts' logs start empty while the local ones go on: whoever follows the run
        # later (the background controller, `inv logs --follow`) reads them from the record.
        run.attempt = resuming.attempt
        run.log_starts = {t.index: run.local_size(t) for t in run.tasks}
    write_record(local_dir, RunRecord.of(plan, RunState.STARTING, run.started,
                                         run.log_starts, restarts=settings.restarts,
                                         attempt=run.attempt))
    return run


class Ending:
    """How the run inside `ending` ended, and its exit status."""

    def __init__(self):
        self.how = Finish.DONE
        self.launched = False
        self.code = 1
        self.lock: FollowLock | None = None     # held while the run is this controller's


@contextlib.contextmanager
def ending(run: Run, settings: RunSettings) -> Iterator[Ending]:
    """The run's end, whatever happens inside: Ctrl-C and SIGTERM stop it, a closed terminal
    leaves a launched run going (detached), a second Ctrl-C abandons the teardown; every other
    way out (success, failure, an error) tears it down (finish.py). Only this controller
    writes the local logs meanwhile (the follow lock)."""
    end = Ending()
    lock = FollowLock(run.dir)
    lock.acquire()
    end.lock = lock
    detached, abandoned = False, None
    try:
        yield end
        detached = run.detached
    except KeyboardInterrupt as interrupt:
        end.how = Finish.by(interrupt)
        run.reporter.emit(Interrupted(end.how == Finish.TERMINATED))
    except HungUp as hangup:
        if not end.launched:                 # nothing was started: nothing to go on
            end.how = Finish.by(hangup)
            run.reporter.emit(StoppedUnstarted(run.plan.run_id, hangup.why,
                                               isinstance(hangup, OutputClosed)))
        else:
            # The terminal (or the pipe's reader) is gone, the run is not: it goes on for
            # `inv logs --follow`.
            detached = True
            _detach(run, settings, hangup)
            end.code = hangup.exit_code
    except Abandoned as exc:                 # a second Ctrl-C while the tasks were stopped
        abandoned = exc
    finally:
        try:
            if abandoned is not None:
                end.code = abandon(run, abandoned)
            elif not detached:
                end.code = finish(run, end.how)
        finally:
            lock.release()


def push(run: Run, prepared: Prepared) -> None:
    """The payload, then the data, to every host; what each host was sent, kept."""
    status, tell = run.reporter.status, lambda line: run.reporter.emit(Pushed(line))
    pushed = prepared.payload.send(run.session, run.plan, status, tell)
    run.filesystems = {name: answer.get("filesystem") for name, answer in pushed["hosts"].items()}
    write_json(run.dir / localdir.PUSH, pushed)
    if any(hp.data_dir for hp in run.plan.hosts):
        write_json(run.dir / localdir.DATA,
                   prepared.data.send(run.session, run.plan, status, tell))


def carry_kept_backup(run: Run, resuming: Resuming) -> None:
    """A resumed run: its tasks' progress so far read from the local logs (which go on, each
    after an attempt marker; the hosts' logs of this attempt start empty: run.log_starts),
    and the kept backup written to every host before anything starts there."""
    load_local_logs(run, None)
    with run.reporter.status("carrying the chief's backup to every host…"):
        run.session.carry_backup(run.plan, run.filesystems, run.limits, resuming.backup, None,
                                 lambda line: run.reporter.emit(ArchiveNote(line)))


def launch(run: Run, checked_ports: Mapping[str, list[int]] | None,
           settings: RunSettings) -> None:
    """The ports (the checks' or probed now), the final plan, then every task started."""
    reporter = run.reporter
    with reporter.status("choosing ports…"):
        ports = (task_ports(run.plan.tasks, checked_ports) if checked_ports
                 else run.session.free_ports(run.plan))
        run.plan = run.plan.with_ports(ports)
    write_json(run.dir / localdir.PLAN, plan_document(run.plan))
    write_record(run.dir, RunRecord.of(run.plan, RunState.STARTING, run.started,
                                       run.log_starts, restarts=settings.restarts,
                                       attempt=run.attempt))
    with reporter.status(f"starting {len(run.plan.tasks)} task(s)…"):
        run.session.launch(run.plan, attempt=run.attempt)


def follow(run: Run, settings: RunSettings) -> None:
    run.set_state(RunState.RUNNING, controller_pid=os.getpid(), background=False)
    restarter = Restarter(settings.restarts) if settings.restarts else None
    follow_to_end(run, settings, restarter, NewPorts(settings.restarts))


def _all_running(run: Run) -> bool:
    """Whether every task is running on its host (a thorough check by the agents). A task that
    already ended means the run is not one to leave alone: it is followed here instead. A task
    seen neither running nor ended, just after its start (its processes found by the run id
    in their environment, read while one of them is starting), is asked about again."""
    for _ in range(RUNNING_ASKS):
        answers, errors = run.session.poll(run.plan, run.offsets())
        states = [answers[t.index].state if t.index in answers else None
                  for t in run.plan.tasks]
        if errors or "exited" in states or all(s == "running" for s in states):
            break
        time.sleep(0.2)
    return not errors and all(s == "running" for s in states)


# How many times a run about to be detached is asked whether every task runs.
RUNNING_ASKS = 5


def _detach(run: Run, settings: RunSettings, hangup: HungUp | None = None) -> int:
    run.detached = True
    run.set_state(RunState.DETACHED, controller_pid=None)
    run.close()
    run.reporter.emit(Detached(run.plan.run_id, len(run.plan.hosts), hangup.why if hangup else "",
                               runs_dir_flag(settings.runs_dir),
                               stdout_closed=isinstance(hangup, OutputClosed)))
    return 0
