"""`inv` run as a user runs it from a shell of their own, and nothing of this machine's: HOME
a directory of the test's (its ~/.ssh only, so neither this machine's ~/.ssh/config nor a key
in ~/.ssh/id_* can make a test pass by accident), the login's bare PATH, and an ssh-agent only
where the test starts one.
"""
from __future__ import annotations

import getpass
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def inv_as_user(*args: str, home: Path, agent: str | None = None, columns: int = 200,
                timeout: float = 300) -> subprocess.CompletedProcess:
    env = {"COLUMNS": str(columns), "PATH": "/usr/bin:/bin", "HOME": str(home),
           "USER": getpass.getuser(), "LOGNAME": getpass.getuser()}
    if agent:
        env["SSH_AUTH_SOCK"] = agent
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=REPO, text=True,
                          capture_output=True, timeout=timeout, env=env)
