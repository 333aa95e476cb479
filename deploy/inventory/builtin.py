"""Which inventory a command uses: the file it is given, or `slurm` (the Slurm allocation the
command runs in, slurm.py); with none, ./hosts.yaml; and where there is none (the installed
`tfdeploy` run outside a project), the built-in one, which is the project's own default: two
TensorFlow workers on this machine.
"""
from __future__ import annotations

import os
from pathlib import Path

from deploy.commandline import command
from deploy.inventory import slurm
from deploy.inventory.load import load_inventory, parse_inventory
from deploy.inventory.model import Inventory

DEFAULT_FILE = "hosts.yaml"
BUILTIN_NAME = "<built-in inventory>"
BUILTIN_TEXT = """\
hosts:
  - name: local
    transport: local
    workers: 2
"""


def builtin_inventory() -> Inventory:
    return parse_inventory(BUILTIN_TEXT, BUILTIN_NAME, os.environ)


def chosen_inventory(path: str, dry_run: bool = False) -> tuple[Inventory, str | None]:
    """The inventory at `path` (empty: ./hosts.yaml, else the built-in one), and a note to
    show when the built-in one was taken. A dry run on Slurm needs only the allocation's
    variables: where scontrol cannot answer, the nodes' names stand for their addresses."""
    if path == slurm.NAME:
        outside = slurm.OUTSIDE.format(train=command("train"), submit=command("submit"))
        try:
            return slurm.allocation_inventory(os.environ, outside), None
        except slurm.NoScontrol as exc:
            if not dry_run:
                raise
            return (slurm.allocation_inventory(os.environ, outside, scontrol=None),
                    f"{exc}: the plan shows the nodes' names for their addresses")
    if path:
        return load_inventory(path), None
    if Path(DEFAULT_FILE).exists():
        return load_inventory(DEFAULT_FILE), None
    return builtin_inventory(), (f"no --hosts given and no {DEFAULT_FILE} in {Path.cwd()}: "
                                 "using the built-in inventory (two workers on localhost)")
