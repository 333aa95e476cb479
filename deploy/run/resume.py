"""`inv resume`: a run that ended without finishing (a task failed, a host was lost, Ctrl-C,
`inv down`) starts again from the copy of the chief's backup its controller kept
(runs/<id>/backup/, restarts.py), on the hosts of a given inventory (a replacement VM in place
of a lost one) or of its record: the same payload, entry and arguments, pushed again where a
host lacks them, in the same local run directory, its logs going on after an attempt marker.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from deploy.commandline import command
from deploy.errors import BadInput
from deploy.inventory.model import Inventory
from deploy.run.launch import Resuming, train
from deploy.run.run import RunSettings
from deploy.state import localdir
from deploy.state.events import Reporter
from deploy.state.record import RunState, find_run, load_record


def resume(runs_dir: Path, run_id: str, inventory: Inventory | None, settings: RunSettings,
           reporter: Reporter) -> int:
    local_dir = find_run(runs_dir, run_id)
    record = load_record(local_dir)
    name = record.run_id
    if record.state.active and record.controller_alive():
        raise BadInput(f"run {name} is {record.state.value}, followed by a controller "
                       f"(pid {record.controller_pid}): nothing to resume")
    if record.state.active:
        raise BadInput(f"run {name} may still run on its hosts ({record.state.value}): "
                       f"`{command('down')} --run {name}` first, then resume it")
    if record.state == RunState.FINISHED and record.exit_code == 0:
        raise BadInput(f"run {name} finished (exit 0): nothing to resume")
    backup = localdir.kept_backup(local_dir)
    if not backup.is_file():
        raise BadInput(f"run {name} kept no backup to resume from ({backup} is missing): "
                       "its controller keeps a copy of the chief's TFDEPLOY_BACKUP_DIR after "
                       "each epoch, and this chief ended none or wrote nothing there")
    if inventory is None:
        # The record's hosts as the run last had them (a host it gave up on stays a spare).
        # Their `env` is not recorded: give the inventory to have it.
        inventory = Inventory(path=str(local_dir / localdir.RECORD), hosts=record.hosts)
    settings = dataclasses.replace(settings, run_id=name, runs_dir=runs_dir)
    return train(inventory, record.options, settings, reporter,
                 Resuming(attempt=record.attempt + 1, backup=backup))
