"""`inv submit`'s batch script, as text: sbatch's options from the flags, then the same program
running `train --hosts slurm` inside the allocation with the run's id, so that the run it
queues and the run it starts are one (runs/<id>/). Pure: deploy/run/submitted.py writes the
script and submits it.
"""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from deploy.errors import BadInput

# Values that become an #SBATCH line: a line of its own, read by sbatch, not by a shell.
# Slurm's own syntax for each (a partition or account name; a time limit such as 90,
# 1:30:00 or 2-12). Anything else is refused before a script is written.
SLURM_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")
TIME_LIMIT = re.compile(r"^(\d+-)?\d+(:\d{1,2}){0,2}$|^(UNLIMITED|INFINITE|infinite)$")
GPU_SPEC = re.compile(r"^([A-Za-z0-9_.-]+:)?[1-9][0-9]*$")
MAX_NODES = 512                     # as many hosts as an inventory may have


@dataclass(frozen=True)
class BatchRequest:
    run_id: str
    nodes: int
    program: tuple[str, ...]        # how the script runs tfdeploy (commandline.py)
    train_args: tuple[str, ...]     # train's flags after `train --hosts slurm --run-id ID`
    workdir: str                    # absolute: where the script starts, as the user did
    output: str                     # absolute: the job's stdout and stderr (%j: its id)
    gpus_per_node: str = ""
    time: str = ""
    partition: str = ""
    account: str = ""


def batch_script(request: BatchRequest) -> str:
    """The script's text; BadInput naming the flag for a value sbatch would misread."""
    if not 1 <= request.nodes <= MAX_NODES:
        raise BadInput(f"--nodes must be 1 to {MAX_NODES}, not {request.nodes}")
    for flag, value, pattern in (("--gpus-per-node", request.gpus_per_node, GPU_SPEC),
                                 ("--time", request.time, TIME_LIMIT),
                                 ("--partition", request.partition, SLURM_NAME),
                                 ("--account", request.account, SLURM_NAME)):
        if value and not pattern.match(value):
            raise BadInput(f"{flag} {value!r} is not a value Slurm takes for it")
    options = [f"--job-name=tfdeploy-{request.run_id}", f"--nodes={request.nodes}",
               f"--output={request.output}", "--open-mode=append"]
    if request.gpus_per_node:
        # A task per GPU: SLURM_GPUS_PER_NODE tells `--hosts slurm` how many.
        options.append(f"--gpus-per-node={request.gpus_per_node}")
    else:
        options.append("--ntasks-per-node=1")
    options += [f"--{name}={value}" for name, value in (
        ("time", request.time), ("partition", request.partition), ("account", request.account))
        if value]
    if any(c.isspace() or c == "\0" for c in request.output):
        # sbatch splits an #SBATCH line at blanks.
        raise BadInput(f"--runs-dir: the job's output file {request.output!r} would hold a "
                       "blank, which an #SBATCH line cannot carry: choose a directory without")
    argv = [*request.program, "train", "--hosts", "slurm", "--run-id", request.run_id,
            *request.train_args]
    return "\n".join([
        "#!/bin/sh",
        f"# tfdeploy run {request.run_id}: queued by submit; its records are beside this file.",
        *(f"#SBATCH {option}" for option in options),
        # SIGTERM (scancel, the time limit) reaches the controller itself: it stops every
        # task and removes the run's directories before Slurm's KillWait runs out.
        f"cd {shlex.quote(request.workdir)} || exit 1",
        "exec " + " ".join(shlex.quote(word) for word in argv),
        "",
    ])
