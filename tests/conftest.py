"""Shared fixtures: ``ssh_lab``, two real OpenSSH servers on loopback addresses for the session."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

TESTS_DIR = Path(__file__).resolve().parent
if str(TESTS_DIR) not in sys.path:       # `import sshlab` / `import procs` in any import mode
    sys.path.insert(0, str(TESTS_DIR))

from sshlab import SSHD, SshLab  # noqa: E402


@pytest.fixture(scope="session")
def ssh_lab(tmp_path_factory: pytest.TempPathFactory):
    """A started SshLab with two hosts, ``ssh_lab.hosts`` (h1 on 127.0.0.2, h2 on 127.0.0.3).

    Shared by the whole session: tests that need more or odd servers should use an SshLab of
    their own (``with SshLab(tmp_path) as lab: ...``) rather than start more here.
    """
    if not SSHD.is_file():
        pytest.fail(f"{SSHD} is missing: the integration tests need real OpenSSH "
                    "(apt-get install openssh-server)", pytrace=False)
    with SshLab(tmp_path_factory.mktemp("sshlab")) as lab:
        lab.start(2)
        yield lab
