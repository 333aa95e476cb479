"""The command the user runs tfdeploy by, for the hints, errors and help texts that name one:
the installed `tfdeploy`, or `inv` in a checkout of this repository (Invoke's runner, which
finds tasks.py in the working directory). A hint naming the other would fail where it is
read (`inv` outside a checkout: "Can't find any collection named 'tasks'!")."""
from __future__ import annotations

import os
import shutil
import sys

PROGRAM = "tfdeploy" if os.path.basename(sys.argv[0] or "") == "tfdeploy" else "inv"


def command(words: str) -> str:
    """`tfdeploy down --run X` or `inv down --run X`: a command as the user types it."""
    return f"{PROGRAM} {words}"


def program_argv() -> tuple[str, ...]:
    """How a script (`submit`'s batch script) runs this same program: the installed `tfdeploy`
    by its path, or Invoke with this Python, which finds tasks.py where the script starts."""
    if PROGRAM == "tfdeploy":
        return (sys.executable, os.path.abspath(shutil.which(sys.argv[0]) or sys.argv[0]))
    return (sys.executable, "-m", "invoke")
