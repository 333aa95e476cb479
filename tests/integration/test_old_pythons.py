"""Lab hosts whose `python:` is an old or a distribution's interpreter, as on lab servers that
are rarely new: real interpreters (pyenv's 3.6 and 3.8 builds, Debian's /usr/bin/python3)
behind real sshd servers. Each answer must say what is wrong with the Python and what to do,
never pip's or a traceback's words."""
from __future__ import annotations

import glob
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from deploy.host.boot import OLDEST_PYTHON

REPO = Path(__file__).resolve().parents[2]


def inv(*args: str) -> subprocess.CompletedProcess:
    # Wide enough that rich does not wrap the sentences the assertions look for.
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=REPO, text=True,
                          capture_output=True, timeout=300, env={**os.environ, "COLUMNS": "400"})


def pyenv_python(minor: str) -> str:
    """A real CPython `minor` (3.6, 3.8) built with pyenv, as this machine's image has them."""
    found = sorted(glob.glob(str(Path.home() / f".pyenv/versions/{minor}.*/bin/python3")))
    if not found:
        pytest.skip(f"no Python {minor} here (pyenv install {minor} builds one)")
    return found[-1]


def version_of(python: str) -> str:
    return subprocess.run([python, "-c", "import sys; print(sys.version.split()[0])"],
                          capture_output=True, text=True, check=True).stdout.strip()


def python_only_payload(tmp_path: Path) -> Path:
    payload = tmp_path / "payload"
    payload.mkdir()
    (payload / "train.py").write_text("import sys\nprint('trained with Python', "
                                      "sys.version.split()[0])\n")
    return payload


def test_python_too_old_for_the_payloads_tensorflow_is_named_by_check_and_setup(ssh_lab, tmp_path):
    """The project's payload pins tensorflow>=2.16, which has no release for Python 3.8: check
    and setup say so, instead of advising a pip install that would end in TensorFlow 2.13 (or
    in pip's "No matching distribution")."""
    python = pyenv_python("3.8")
    host = ssh_lab.hosts[0]
    inventory = ssh_lab.write_inventory(tmp_path / "hosts.yaml", [host], python=python)
    words = (f"h1 ({host.address}): Python {version_of(python)} is too old for tensorflow>=2.16 "
             f"(needs 3.9+): set python: to a newer interpreter, or inv setup with one")
    checked = inv("check", "--hosts", str(inventory))
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert words in " ".join(checked.stdout.split()), checked.stdout
    assert "pip install" not in checked.stdout
    set_up = inv("setup", "--hosts", str(inventory))
    assert set_up.returncode == 1, set_up.stdout + set_up.stderr
    out = " ".join(set_up.stdout.split())
    assert words.split(": ", 1)[1] in out and "1 failed of 1 host(s)" in out, out
    # Refused before pip: no environment was built, nothing of the setup left.
    envs = Path(host.workdir) / "envs"
    assert not envs.exists() or not [p for p in envs.iterdir() if p.suffix != ".lock"]
    assert not list((Path(host.workdir) / "runs").glob("*"))


@pytest.mark.parametrize("minor", ["3.6", "3.8"])
def test_the_agent_runs_from_its_oldest_python_and_refuses_older_in_words(ssh_lab, tmp_path,
                                                                           minor):
    """--no-check, a payload that needs only Python: 3.8 (the agent's oldest) runs it; 3.6 is
    refused at login, naming its version and the agent's minimum, before anything of the run
    is written on the host or here."""
    python = pyenv_python(minor)
    host = ssh_lab.hosts[1]
    inventory = ssh_lab.write_inventory(tmp_path / "hosts.yaml", [host], python=python)
    runs = tmp_path / "runs"
    done = inv("train", "--hosts", str(inventory), "--payload", str(python_only_payload(tmp_path)),
               "--runs-dir", str(runs), "--no-check", "--start-timeout", "0")
    out = done.stdout + done.stderr
    assert "Traceback" not in out and "AttributeError" not in out, out
    version = version_of(python)
    if tuple(map(int, minor.split("."))) >= OLDEST_PYTHON:
        assert done.returncode == 0, out
        (run_dir,) = [p for p in runs.iterdir() if p.is_dir()]
        assert f"trained with Python {version}" in (run_dir / "worker-0.log").read_text()
        return
    assert done.returncode == 1, out
    flat = " ".join(out.split())
    assert (f"h2 ({host.address}): {python} is Python {version}; tfdeploy's host agent needs "
            f"Python 3.8 or newer: set 'python:' in the inventory to a newer interpreter"
            in flat), flat
    assert not runs.exists() or not [p for p in runs.iterdir() if p.is_dir()]
    assert not Path(host.workdir, "runs").exists() or not list(Path(host.workdir, "runs").iterdir())


def test_debian_system_python_without_tensorflow_is_told_inv_setup(ssh_lab, tmp_path):
    """Debian 12's /usr/bin/python3 is externally managed (PEP 668): `pip install tensorflow`
    ends in "externally-managed-environment" there, so the advice is inv setup."""
    python = "/usr/bin/python3"
    stdlib = subprocess.run([python, "-c", "import os; print(os.path.dirname(os.__file__))"],
                            capture_output=True, text=True).stdout.strip()
    if not Path(stdlib, "EXTERNALLY-MANAGED").is_file():
        pytest.skip(f"{python} is not an externally managed Python here")
    if subprocess.run([python, "-c", "import tensorflow"], capture_output=True).returncode == 0:
        pytest.skip(f"{python} has TensorFlow here")
    host = ssh_lab.hosts[0]
    inventory = ssh_lab.write_inventory(tmp_path / "hosts.yaml", [host], python=python)
    checked = inv("check", "--hosts", str(inventory))
    assert checked.returncode == 1, checked.stdout + checked.stderr
    flat = " ".join(checked.stdout.split())
    assert (f"h1 ({host.address}): tensorflow" in flat and f"not installed for {python} (an "
            f"externally managed Python, where pip install is refused: inv setup builds an "
            f"environment from the payload's requirements.txt)" in flat), flat
    assert "pip install tensorflow" not in flat


def test_the_controllers_install_refuses_an_older_python_before_resolving(tmp_path):
    """`pip install -e .` on Python 3.8 would otherwise end in pip's "No matching distribution
    found for tensorflow>=2.16" (3.9: backtracking for minutes): the project's build backend
    refuses first. Offline here (no index, no build isolation): the refusal needs neither."""
    python = pyenv_python("3.8")
    subprocess.run([python, "-m", "venv", str(tmp_path / "venv")], check=True)
    done = subprocess.run([str(tmp_path / "venv/bin/pip"), "install", "--no-index", "--no-deps",
                           "--no-build-isolation", "-e", str(REPO)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    out = done.stdout + done.stderr
    assert re.search(rf"tfdeploy needs Python 3\.10 or newer; {re.escape(str(tmp_path))}/venv/"
                     rf"bin/python3? is Python {re.escape(version_of(python))}", out), out
    assert "No matching distribution" not in out
