"""The command the user runs tfdeploy by, for the hints, errors and help texts that name one:
the installed `tfdeploy`, or `inv` in a checkout of this repository (Invoke's runner, which
finds tasks.py in the working directory). A hint naming the other would fail where it is
read (`inv` outside a checkout: "Can't find any collection named 'tasks'!")."""
from __future__ import annotations

import os
import sys

PROGRAM = "tfdeploy" if os.path.basename(sys.argv[0] or "") == "tfdeploy" else "inv"


def command(words: str) -> str:
    """`tfdeploy down --run X` or `inv down --run X`: a command as the user types it."""
    return f"{PROGRAM} {words}"
