"""The local directory of a run, runs/<run-id>/ on the controller: the names of its files.

    record.json          the run record (record.py)
    .follow.lock         held by the one controller that writes the local logs
    worker-<i>.log       task i's output, the same bytes as on its host
    plan.json            the plan as launched, secrets as ***
    push.json data.json  what each host was sent
    summary.json         how the run ended: exit codes, losses, teardown problems
    artifacts/           the chief's TFDEPLOY_OUTPUT_DIR, fetched at the end

All of it private to the user (private_umask).
"""
from __future__ import annotations

import os
from pathlib import Path

from deploy.host.layout import task_name

RECORD = "record.json"
FOLLOW_LOCK = ".follow.lock"
PLAN = "plan.json"
PUSH = "push.json"
DATA = "data.json"
SUMMARY = "summary.json"
ARTIFACTS = "artifacts"


def task_log(local_dir: Path, task: int) -> Path:
    return local_dir / f"{task_name(task)}.log"


def private_umask() -> None:
    """Everything the controller writes (records, logs, artifacts) is the user's alone, as on
    the hosts: umask 077 for this process."""
    os.umask(0o077)
