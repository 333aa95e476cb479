"""Which inventory a command uses: the file it is given; with none, ./hosts.yaml; and where
there is none (the installed `tfdeploy` run outside a project), the built-in one, which is
the project's own default: two TensorFlow workers on this machine.
"""
from __future__ import annotations

import os
from pathlib import Path

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


def chosen_inventory(path: str) -> tuple[Inventory, str | None]:
    """The inventory at `path` (empty: ./hosts.yaml, else the built-in one), and a note to
    show when the built-in one was taken."""
    if path:
        return load_inventory(path), None
    if Path(DEFAULT_FILE).exists():
        return load_inventory(DEFAULT_FILE), None
    return builtin_inventory(), (f"no --hosts given and no {DEFAULT_FILE} in {Path.cwd()}: "
                                 "using the built-in inventory (two workers on localhost)")
