"""The local directory of a run, runs/<run-id>/ on the controller: the names of its files.

    record.json          the run record (record.py)
    .follow.lock         held by the one controller that writes the local logs
    controller.log       what the background controller of `--detach --restarts N` says
                         (run/background.py): restarts, recoveries, the summary
    <type>-<i>.log       a task's output, the same bytes as on its host (worker-0.log,
                         and chief-0.log, ps-0.log, evaluator-0.log with roles)
    plan.json            the plan as launched, secrets as ***
    push.json data.json  what each host was sent
    summary.json         how the run ended: exit codes, losses, teardown problems
    loss.png             every task's loss per epoch (console/plot.py; `inv plot` redraws it)
    artifacts/           the chief's TFDEPLOY_OUTPUT_DIR, fetched at the end
    tensorboard          -> artifacts/tensorboard: the chief's TensorBoard logs, where the
                         payload writes them (TFDEPLOY_OUTPUT_DIR/tensorboard); while the run
                         is followed, a copy kept up after each epoch (livetensorboard.py)
    .tensorboard-*/      one fetch of those logs' new bytes, unpacked before they are added
    backup/chief.tar.gz  the chief's TFDEPLOY_BACKUP_DIR as of its last epoch, renewed from
                         what changed (cluster/keptbackup.py): carried to the hosts of a new
                         attempt (--restarts, `inv resume`), the chief's own lost or not;
                         removed once the run finished with exit 0
    batch.sh             a submitted run's batch script (`inv submit`, run/submitted.py)
    slurm-job.json       its Slurm job's id and when it was submitted
    slurm-<job>.out      the job's output: what the controller inside it printed

All of it private to the user (private_umask).
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from deploy.errors import BadInput

RECORD = "record.json"
FOLLOW_LOCK = ".follow.lock"
CONTROLLER_LOG = "controller.log"
PLAN = "plan.json"
PUSH = "push.json"
DATA = "data.json"
SUMMARY = "summary.json"
ARTIFACTS = "artifacts"
LOSS_PLOT = "loss.png"
TENSORBOARD = "tensorboard"
BATCH_SCRIPT = "batch.sh"
SLURM_JOB = "slurm-job.json"
KEPT_BACKUP = "backup"


def job_output(local_dir: Path, job_id: str) -> Path:
    """A submitted run's job output (`%j` in the batch script: sbatch puts the id in)."""
    return local_dir / f"slurm-{job_id}.out"


def kept_backup(local_dir: Path) -> Path:
    """The controller's copy of the chief's backup (Session.keep_backup)."""
    return local_dir / KEPT_BACKUP / "chief.tar.gz"


def drop_kept_backup(local_dir: Path) -> None:
    """A run that finished with exit 0 is never resumed: its copy of the backup (as large as
    the model's checkpoint) goes."""
    shutil.rmtree(local_dir / KEPT_BACKUP, ignore_errors=True)


def task_log(local_dir: Path, name: str) -> Path:
    """The local log of the task named `name` (`worker-0`, `chief-0`: its TaskPlan's name)."""
    return local_dir / f"{name}.log"


def link_tensorboard(local_dir: Path) -> Path | None:
    """runs/<id>/tensorboard, a link to the TensorBoard logs among the fetched artifacts (the
    chief's output is fetched once, not twice) in place of the copy kept while the run was
    followed (run/livetensorboard.py), which they hold whole; that copy when they are not
    there (the fetch failed); None when the payload wrote none."""
    logs = local_dir / ARTIFACTS / TENSORBOARD
    link = local_dir / TENSORBOARD
    if not logs.is_dir():
        return link if link.is_dir() and not link.is_symlink() else None
    if link.is_dir() and not link.is_symlink():
        shutil.rmtree(link)
    if not link.is_symlink() and not link.exists():
        link.symlink_to(Path(ARTIFACTS) / TENSORBOARD, target_is_directory=True)
    return link


def check_runs_dir(runs_dir: Path) -> None:
    """BadInput unless `runs_dir` is a directory this process can write into, or one it can
    create: checked before anything runs, so that a run never starts without its records."""
    if runs_dir.exists():
        if not runs_dir.is_dir():
            raise BadInput(f"runs directory {runs_dir} is not a directory (it holds the local "
                           "run records: give a directory with --runs-dir)")
        if not os.access(runs_dir, os.W_OK | os.X_OK):
            raise BadInput(f"runs directory {runs_dir} is not writable")
        return
    existing = runs_dir.absolute().parent
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise BadInput(f"runs directory {runs_dir} cannot be created: {existing} is not a "
                       "directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise BadInput(f"runs directory {runs_dir} cannot be created: {existing} is not "
                       "writable")


def private_umask() -> None:
    """Everything the controller writes (records, logs, artifacts) is the user's alone, as on
    the hosts: umask 077 for this process."""
    os.umask(0o077)
