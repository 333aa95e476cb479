"""Everything about a run that can be checked without a host: the inventory's lints, the
payload and its entry script, the ignore files, the local data directories and the runs
directory. `inv train` checks through here before it touches anything, and `inv train
--dry-run` through the same function, so a dry run that passes means the real run will not
refuse the same input.

The payload and data are walked (names, kinds, symlinks, permissions, ignore rules), not
hashed: hashing is the push's work, and a dry run stays quick on a large dataset.
"""
from __future__ import annotations

from pathlib import Path

from deploy.inventory.model import Inventory
from deploy.plan.lints import refuse_problems
from deploy.plan.planner import Options
from deploy.push.bundle import checked_payload
from deploy.push.data import local_data
from deploy.state.localdir import check_runs_dir


def refuse_bad_input(inventory: Inventory, options: Options, runs_dir: Path) -> None:
    """BadInput for the first thing a run would refuse; nothing is written anywhere."""
    payload = Path(options.payload)
    checked_payload(payload, options.entry)
    local_data(inventory)
    check_runs_dir(runs_dir)
    refuse_problems(inventory, payload)
