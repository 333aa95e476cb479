"""Everything about a run that can be checked without a host: the inventory's lints, the
payload and its entry script, the ignore files, the local data directories and the runs
directory. `inv train` checks through here before it touches anything, and `inv train
--dry-run` through the same function, so a dry run that passes means the real run will not
refuse the same input.

The payload and data are walked (names, kinds, symlinks, permissions, ignore rules), not
hashed: hashing is the push's work, and a dry run stays quick on a large dataset. What was
walked is returned, so that a real run's push hashes those files instead of walking again.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from deploy.inventory.model import Host, Inventory
from deploy.plan.lints import refuse_problems
from deploy.plan.planner import Options
from deploy.push.bundle import checked_payload, left_out_of
from deploy.push.data import local_data
from deploy.state.localdir import check_runs_dir


@dataclass(frozen=True)
class Walked:
    payload: list[Path]                              # the payload's files that travel
    data: dict[str, tuple[Host, list[Path]]]         # local data directories (local_data)
    left_out: list[Path] = field(default_factory=list)   # tfdeploy's own, in the payload


def refuse_bad_input(inventory: Inventory, options: Options, runs_dir: Path) -> Walked:
    """BadInput for the first thing a run would refuse; nothing is written anywhere."""
    payload = Path(options.payload)
    walked = Walked(checked_payload(payload, options.entry, runs_dir), local_data(inventory),
                    left_out_of(payload, runs_dir))
    check_runs_dir(runs_dir)
    refuse_problems(inventory, payload)
    return walked


def shown_paths(paths: list[Path], payload: Path) -> tuple[str, ...]:
    """`runs/`, `.tfdeploy-cache/`: paths as the payload holds them."""
    return tuple(path.resolve().relative_to(payload.resolve()).as_posix() +
                 ("/" if path.is_dir() else "") for path in paths)
