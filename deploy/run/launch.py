"""`inv train`: a fresh run from inventory to started tasks, then followed to its end here
(watch.py) or left running on its hosts (--detach) for any later shell to pick up.

Order matters for "bad input changes nothing anywhere": everything that can be checked locally
(inventory, payload, data, runs directory: preflight.py, as the dry run checks it) is checked
before any host is touched, and once anything has been
written to a host, every way out goes through teardown.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

from rich.console import Console

from deploy.console.view import say
from deploy.inventory.model import Inventory
from deploy.plan.planner import Options, plan_run
from deploy.plan.ports import task_ports
from deploy.plan.text import plan_document
from deploy.push.data import DataPush
from deploy.push.payload import PayloadPush
from deploy.run.hostchecks import check_before_run
from deploy.run.finish import Finish, abandon, finish, runs_dir_flag
from deploy.run.lostport import NewPorts
from deploy.run.preflight import refuse_bad_input
from deploy.run.restarts import Restarter
from deploy.run.run import Run, RunSettings
from deploy.run.signals import Abandoned, HungUp
from deploy.run.watch import follow_to_end
from deploy.cluster.session import Session
from deploy.state import localdir
from deploy.state.record import (
    FollowLock, RunRecord, RunState, new_run_id, write_json, write_record
)


def train(inventory: Inventory, options: Options, settings: RunSettings,
          console: Console) -> int:
    walked = refuse_bad_input(inventory, options, settings.runs_dir)
    run_id = new_run_id()
    payload = PayloadPush(Path(options.payload), options.entry, run_id,
                          hash_cache=settings.runs_dir / "payload-hashes.json",
                          walked=walked.payload)
    with console.status("hashing the data directories…"):
        data = DataPush(inventory, hash_cache=settings.runs_dir / "data-hashes.json",
                        walked=walked.data)
    # From here on every local data source is named by its content: the plan, the record and
    # any relaunch use the same TFDEPLOY_DATA_DIR.
    inventory = data.resolved(inventory)
    skeleton = plan_run(inventory, options, run_id)
    local_dir = settings.runs_dir / run_id
    count = len(skeleton.tasks)
    console.print(f"run [bold]{run_id}[/]: {count} task(s) on {len(inventory.hosts)} host(s)",
                  highlight=False)
    with console.status(f"connecting to {len(inventory.hosts)} host(s)…"):
        session = Session.open(inventory, settings.connect_timeout, settings.accept_new_host_keys)
    checked_ports = None
    if settings.check:
        # Closes the session when it fails. The ports it chose are the run's: the mesh check
        # just proved them reachable from every host, and a second probe would cost every host
        # another command.
        checked_ports = check_before_run(
            session, inventory, console, options.requirements_sha256,
            {h.name: payload.total_bytes + data.bytes_for(h) for h in inventory.hosts}).host_ports
    local_dir.mkdir(parents=True, exist_ok=True)
    console.print(f"local records in {local_dir}", highlight=False)
    started = time.time()
    # Written before anything reaches a host: a controller lost from here on leaves a record
    # from which `inv down` finds the run.
    write_record(local_dir, RunRecord.of(skeleton, RunState.STARTING, started,
                                         restarts=settings.restarts))
    run = Run(skeleton, session, local_dir, console, raw=settings.verbose,
              limits=settings.fetch_limits)
    # This controller writes the local logs; another one (inv logs --follow) must not too.
    lock = FollowLock(local_dir)
    lock.acquire()
    how = Finish.DONE
    detached = launched = False
    abandoned = None
    try:
        pushed = payload.send(session, skeleton, console)
        run.filesystems = {name: answer.get("filesystem")
                           for name, answer in pushed["hosts"].items()}
        write_json(local_dir / localdir.PUSH, pushed)
        if any(hp.data_dir for hp in skeleton.hosts):
            write_json(local_dir / localdir.DATA, data.send(session, skeleton, console))
        with console.status("choosing ports…"):
            ports = (task_ports(skeleton.tasks, checked_ports) if checked_ports
                     else session.free_ports(skeleton))
            run.plan = plan_run(inventory, options, run_id, ports)
        write_json(local_dir / localdir.PLAN, plan_document(run.plan))
        write_record(local_dir, RunRecord.of(run.plan, RunState.STARTING, started,
                                             restarts=settings.restarts))
        with console.status(f"starting {count} task(s)…"):
            session.launch(run.plan)
        launched = True
        console.print(f"started {count} task(s) in {time.time() - started:.1f} s; "
                      "cluster " + ", ".join(t.endpoint for t in run.plan.tasks), highlight=False)
        if settings.detach and _all_running(run):
            detached = True
            return _detach(run, settings)
        run.set_state(RunState.RUNNING, controller_pid=os.getpid())
        restarter = Restarter(inventory, options, settings.restarts) if settings.restarts else None
        follow_to_end(run, settings, restarter, NewPorts(inventory, options, settings.restarts))
    except KeyboardInterrupt as interrupt:
        how = Finish.by(interrupt)
        say(console, f"{'terminated' if how == Finish.TERMINATED else 'interrupted'}: "
                     "stopping every task of the run…", "yellow")
    except HungUp as hangup:
        if launched:
            # The terminal is gone, the run is not: it goes on for `inv logs --follow`.
            detached = True
            _detach(run, settings, "the terminal closed: ")
            return hangup.exit_code
        how = Finish.INTERRUPTED     # nothing was started: nothing to go on
    except Abandoned as exc:         # a second Ctrl-C while the tasks were being stopped
        abandoned = exc
    finally:
        try:
            if abandoned is not None:
                code = abandon(run, abandoned)
            elif not detached:
                code = finish(run, how)
        finally:
            lock.release()
    return code


def _all_running(run: Run) -> bool:
    """Whether every task is running on its host (a thorough check by the agents). A task that
    already ended means the run is not one to leave alone: it is followed here instead."""
    answers, errors = run.session.poll(run.plan, run.offsets())
    return not errors and all(t.index in answers and answers[t.index].state == "running"
                              for t in run.plan.tasks)


def _detach(run: Run, settings: RunSettings, why: str = "") -> int:
    run.set_state(RunState.DETACHED, controller_pid=None)
    run.close()
    rid, flag = run.plan.run_id, runs_dir_flag(settings.runs_dir)
    run.console.print(f"{why}run [bold]{rid}[/] is running detached on "
                      f"{len(run.plan.hosts)} host(s); nothing was torn down.", highlight=False)
    say(run.console, f"  follow it:  inv logs --run {rid} --follow{flag}\n"
                     f"  its state:  inv status --run {rid}{flag}\n"
                     f"  stop it:    inv down --run {rid}{flag}")
    return 0

