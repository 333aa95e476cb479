"""Slurm nodes (`--hosts slurm`): each command is a job step of one task on its node, started
by srun beside the run's other steps (deploy/inventory/slurm.py's srun_argv). srun is a local
process whose stdin and stdout are the step's, byte for byte (-u), so a node's agent talks
over it as a local host's does over its pipes; what the step writes on stderr goes to srun's
stderr, a file here, never into the agent's channel."""
from __future__ import annotations

import os

from deploy.inventory.slurm import srun_argv
from deploy.transport.local import LocalTransport

# What srun needs of the controller's environment to reach its cluster: where its config is
# (Slurm's clients find the rest through it). The allocation's own SLURM_* variables stay
# out: srun_argv names the job and the node, and a step's task gets its step's variables.
CLIENT_VARIABLES = ("SLURM_CONF",)


class SlurmTransport(LocalTransport):
    def argv(self, line: str) -> list[str]:
        # When the job ends (scancel, its time limit) Slurm sends SIGTERM to every process of
        # every step: the agent ignores it and stays until the controller, which gets it too,
        # has stopped every task and removed the run's directories. (The tasks' supervisors
        # set their own handlers: a task gets SIGTERM as it would anyway.)
        return srun_argv(self.host) + super().argv("trap '' TERM; " + line)

    def environment(self) -> dict[str, str]:
        return {**super().environment(),
                **{k: os.environ[k] for k in CLIENT_VARIABLES if k in os.environ}}
