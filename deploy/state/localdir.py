"""The local directory of a run, runs/<run-id>/ on the controller: the names of its files.

    record.json          the run record (record.py)
    .follow.lock         held by the one controller that writes the local logs
    worker-<i>.log       task i's output, the same bytes as on its host
    plan.json            the plan as launched, secrets as ***
    push.json data.json  what each host was sent
    summary.json         how the run ended: exit codes, losses, teardown problems
    loss.png             every task's loss per epoch (console/plot.py; `inv plot` redraws it)
    artifacts/           the chief's TFDEPLOY_OUTPUT_DIR, fetched at the end
    tensorboard          -> artifacts/tensorboard: the chief's TensorBoard logs, where the
                         payload writes them (TFDEPLOY_OUTPUT_DIR/tensorboard)
"""
from __future__ import annotations

from pathlib import Path

from deploy.host.layout import task_name

RECORD = "record.json"
FOLLOW_LOCK = ".follow.lock"
PLAN = "plan.json"
PUSH = "push.json"
DATA = "data.json"
SUMMARY = "summary.json"
ARTIFACTS = "artifacts"
LOSS_PLOT = "loss.png"
TENSORBOARD = "tensorboard"


def task_log(local_dir: Path, task: int) -> Path:
    return local_dir / f"{task_name(task)}.log"


def link_tensorboard(local_dir: Path) -> Path | None:
    """runs/<id>/tensorboard, a link to the TensorBoard logs among the fetched artifacts (the
    chief's output is fetched once, not twice); None when the payload wrote none."""
    logs = local_dir / ARTIFACTS / TENSORBOARD
    link = local_dir / TENSORBOARD
    if not logs.is_dir():
        return None
    if not link.is_symlink() and not link.exists():
        link.symlink_to(Path(ARTIFACTS) / TENSORBOARD, target_is_directory=True)
    return link
