"""`inv setup` on real sshd servers, offline: a tiny wheel built here is the wheelhouse.
From a bare workdir it builds the environment; a second call reuses it; a changed
requirements.txt builds a new one beside it; `inv train` then runs tasks with it."""
from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from unittest import mock

import pytest
import yaml

from deploy.host import venv as hostenv
from hostpkg import fake_env
from procs import default_signals, end, processes_of_run, wait_until_gone
from sshlab import SshLab


REPO = Path(__file__).resolve().parents[2]
# The PATH of a command run by sshd for root, which SetEnv replaces (OpenSSH's SUPERUSER_PATH).
SSHD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def inv(*args: str) -> subprocess.CompletedProcess:
    # Wide enough that rich does not wrap the paths the assertions look for.
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=REPO, text=True,
                          capture_output=True, timeout=600, env={**os.environ, "COLUMNS": "400"})


def build_wheel(tmp_path: Path, version: str, wheelhouse: Path) -> None:
    src = tmp_path / f"tinypkg-src-{version}"
    (src / "tinypkg").mkdir(parents=True)
    (src / "tinypkg" / "__init__.py").write_text(f"VERSION = {version!r}\n")
    (src / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'
        f'[project]\nname = "tinypkg"\nversion = "{version}"\n')
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-index",
                           "--no-build-isolation", "-w", str(wheelhouse), str(src)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr


def envs(workdir: Path) -> list[Path]:
    """The environments (directories; beside them, each one's build lock)."""
    root = workdir / "envs"
    return sorted(p for p in root.iterdir() if p.is_dir()) if root.exists() else []


def import_version(env: Path) -> str:
    out = subprocess.run([str(env / "bin" / "python"), "-c",
                          "import tinypkg; print(tinypkg.VERSION)"],
                         capture_output=True, text=True, timeout=60)
    return out.stdout.strip()


@pytest.fixture
def setup_lab(ssh_lab, tmp_path):
    """Two lab hosts with fresh workdirs and no `python` in the inventory: the hosts' own
    python3 builds the environments, as on a bare machine."""
    hosts = ssh_lab.hosts[:2]
    workdirs = {h.name: tmp_path / f"work-{h.name}" for h in hosts}
    doc = yaml.safe_load(ssh_lab.inventory_yaml(
        hosts, per_host={n: {"workdir": str(w)} for n, w in workdirs.items()}))
    del doc["defaults"]["python"]
    inventory = tmp_path / "lab.yaml"
    inventory.write_text(yaml.safe_dump(doc, sort_keys=False))
    wheelhouse = tmp_path / "wheelhouse"
    for version in ("1.0", "2.0"):
        build_wheel(tmp_path, version, wheelhouse)
    payload = tmp_path / "payload"
    payload.mkdir()
    (payload / "requirements.txt").write_text("tinypkg==1.0\n")
    (payload / "train.py").write_text(
        "import sys, tinypkg\nprint('ran with', sys.executable, 'tinypkg', tinypkg.VERSION)\n")
    return inventory, workdirs, wheelhouse, payload


def test_setup_builds_reuses_and_rebuilds_on_change(setup_lab, tmp_path):
    inventory, workdirs, wheelhouse, payload = setup_lab
    args = ("setup", "--hosts", str(inventory), "--payload", str(payload),
            "--wheelhouse", str(wheelhouse))
    first = inv(*args)
    assert first.returncode == 0, first.stdout + first.stderr
    assert first.stdout.count("built") >= 2, first.stdout
    assert "setup: 2 built of 2 host(s)" in first.stdout
    assert "python" in first.stdout and "tensorflow" in first.stdout       # the versions table
    built = {}
    for name, work in workdirs.items():
        (env,) = envs(work)
        assert import_version(env) == "1.0"
        assert json.loads((env / "tfdeploy-env.json").read_text())["requirements_sha256"]
        assert list((work / "runs").iterdir()) == []                # setup run dirs removed
        built[name] = env

    again = inv(*args)
    assert again.returncode == 0, again.stdout + again.stderr
    assert again.stdout.count("reused") >= 2 and "built" not in again.stdout, again.stdout
    assert "setup: 2 reused of 2 host(s)" in again.stdout
    for name, work in workdirs.items():
        assert envs(work) == [built[name]]
    # No wheelhouse push and no pip when every host already has the environment.
    assert "pushing the wheelhouse" not in again.stdout

    # The environment is what `inv train` runs the tasks with (no `python` in the inventory).
    runs = tmp_path / "runs"
    # --no-check: this payload is not TensorFlow, which the checks would rightly miss in the
    # environment (they probe the interpreter the tasks will run).
    trained = inv("train", "--hosts", str(inventory), "--payload", str(payload),
                  "--runs-dir", str(runs), "--start-timeout", "0", "--no-check")
    assert trained.returncode == 0, trained.stdout + trained.stderr
    (run_dir,) = [p for p in runs.iterdir() if p.is_dir()]
    for i, name in enumerate(workdirs):
        log = (run_dir / f"worker-{i}.log").read_text()
        assert f"ran with {built[name]}/bin/python tinypkg 1.0" in log, log
    plan = json.loads((run_dir / "plan.json").read_text())
    # The plan names each environment by its requirements; the host key is the host's.
    assert [h["env_python"] for h in plan["hosts"]] == [
        f"{built[n].parent}/{built[n].name.split('-')[0]}-<host key>/bin/python" for n in built]
    dry = inv("train", "--hosts", str(inventory), "--payload", str(payload), "--dry-run")
    assert dry.stdout.count("if `inv setup` built it, else python3") == 2, dry.stdout

    (payload / "requirements.txt").write_text("tinypkg==2.0\n")
    changed = inv(*args)
    assert changed.returncode == 0, changed.stdout + changed.stderr
    for name, work in workdirs.items():
        old, new = built[name], [e for e in envs(work) if e != built[name]]
        assert len(envs(work)) == 2 and len(new) == 1               # a new one beside the old
        assert import_version(new[0]) == "2.0" and import_version(old) == "1.0"


def test_setup_without_requirements_or_with_a_bad_wheelhouse_changes_nothing(setup_lab,
                                                                           tmp_path):
    inventory, workdirs, wheelhouse, payload = setup_lab
    (payload / "requirements.txt").unlink()
    done = inv("setup", "--hosts", str(inventory), "--payload", str(payload))
    assert done.returncode == 2 and "requirements.txt does not exist" in done.stdout
    (payload / "requirements.txt").write_text("tinypkg==1.0\n")
    done = inv("setup", "--hosts", str(inventory), "--payload", str(payload),
               "--wheelhouse", str(tmp_path / "nowhere"))
    assert done.returncode == 2 and "is not a directory" in done.stdout
    assert all(not w.exists() for w in workdirs.values())


def test_a_failing_install_is_reported_per_host_and_leaves_no_env(setup_lab):
    inventory, workdirs, wheelhouse, payload = setup_lab
    (payload / "requirements.txt").write_text("tinypkg==9.9\n")       # not in the wheelhouse
    done = inv("setup", "--hosts", str(inventory), "--payload", str(payload),
               "--wheelhouse", str(wheelhouse))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "failed" in done.stdout and "tinypkg==9.9" in done.stdout, done.stdout
    for work in workdirs.values():
        assert envs(work) == [] and list((work / "runs").iterdir()) == []


def test_ctrl_c_during_setup_stops_pip_on_every_host_and_removes_the_setup_dirs(setup_lab):
    """pip waiting on a package index that never answers (a socket this test owns) is what
    Ctrl-C meets: every host's pip (its own process group, recorded in the setup dir) is
    stopped, the setup dirs are removed, no environment appears, and the exit status is 130."""
    inventory, workdirs, wheelhouse, payload = setup_lab
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    accepted: list[socket.socket] = []

    def hold() -> None:               # accept and never answer, like a hung index
        while True:
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                return
    threading.Thread(target=hold, daemon=True).start()
    port = listener.getsockname()[1]
    (payload / "requirements.txt").write_text(
        f"--index-url http://127.0.0.1:{port}/simple/\ntinypkg==1.0\n")
    proc = subprocess.Popen([sys.executable, "-m", "invoke", "setup", "--hosts", str(inventory),
                             "--payload", str(payload)], cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env={**os.environ, "COLUMNS": "400"}, preexec_fn=default_signals)
    try:
        deadline = time.monotonic() + 180
        while len(accepted) < len(workdirs):          # each host's pip is waiting on it
            assert proc.poll() is None, proc.stdout.read()
            assert time.monotonic() < deadline, "pip never asked the index"
            time.sleep(0.1)
        setup_dirs = []
        for work in workdirs.values():
            (setup_dir,) = (work / "runs").iterdir()     # the host's own: setup id and name
            pip = json.loads((setup_dir / "build.pid").read_text())["pgid"]
            assert pip in processes_of_run(setup_dir.name)
            setup_dirs.append(setup_dir.name)
        assert len(set(setup_dirs)) == len(workdirs)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    finally:
        end(proc)
        listener.close()
        for conn in accepted:
            conn.close()
    assert proc.returncode == 130, out
    for setup_dir in setup_dirs:
        assert wait_until_gone(setup_dir, timeout=5) == []
    for work in workdirs.values():
        assert list((work / "runs").iterdir()) == [] and envs(work) == []


def other_python(than: str) -> str:
    """An interpreter of another build than `than` (a realpath): Debian's python3, the tests'
    own base interpreter, or PyPy, whichever is here and differs."""
    for candidate in ("/usr/bin/python3", sys._base_executable, shutil.which("pypy3")):
        if candidate and os.path.exists(candidate) and os.path.realpath(candidate) != than:
            return os.path.realpath(candidate)
    pytest.fail(f"needs a second Python build beside {than}: Debian's python3 with "
                "python3-venv (.ci/run installs it), or pypy3 with pypy3-venv", pytrace=False)


def test_hosts_sharing_a_workdir_each_build_and_run_the_env_of_their_own_python(tmp_path):
    """Two sshd hosts share one workdir (an NFS home) and both run `python3`, but on h2 that
    is another Python build, put first on its PATH by sshd's SetEnv (with PYENV_VERSION=system,
    so that a pyenv set up by the shell's startup files defers to that PATH). Each host names
    its environment by its own build (deploy/host/envkey.py): two environments of one
    requirements.txt side by side, neither replacing the other, each host's probe and task run
    by its own, both kept by a prune that keeps the payload and freed by one that does not.
    (Hosts sharing a workdir that set up at once: test_shared_stress.py.)"""
    wheelhouse = tmp_path / "wheelhouse"
    build_wheel(tmp_path, "1.0", wheelhouse)
    payload = tmp_path / "payload"
    payload.mkdir()
    (payload / "requirements.txt").write_text("tinypkg==1.0\n")
    (payload / "train.py").write_text(
        "import sys, tinypkg\nprint('ran with', sys.executable, 'tinypkg', tinypkg.VERSION)\n")
    with SshLab(tmp_path / "lab") as lab:
        def inventory(name: str, *members) -> Path:
            doc = yaml.safe_load(lab.inventory_yaml(lab.sharing_workdir(members, name="home")))
            del doc["defaults"]["python"]          # `python3` on each host, its own
            path = tmp_path / f"{name}.yaml"
            path.write_text(yaml.safe_dump(doc, sort_keys=False))
            return path

        def setup(path: Path) -> str:
            done = inv("setup", "--hosts", str(path), "--payload", str(payload),
                       "--wheelhouse", str(wheelhouse))
            assert done.returncode == 0, done.stdout + done.stderr
            return done.stdout

        (h1,) = lab.start(1)
        workdir = lab.sharing_workdir([h1], name="home")[0].workdir
        assert "setup: 1 built of 1 host(s)" in setup(inventory("h1", h1))
        (first,) = envs(workdir)
        base = json.loads((first / "tfdeploy-env.json").read_text())["base"]
        bindir = tmp_path / "other-python"
        bindir.mkdir()
        (bindir / "python3").symlink_to(other_python(base))
        (h2,) = lab.start(1, setenv={"PATH": f"{bindir}:{SSHD_PATH}", "PYENV_VERSION": "system"})
        assert "setup: 1 built of 1 host(s)" in setup(inventory("h2", h2))  # not h1's env
        (second,) = [e for e in envs(workdir) if e != first]
        assert json.loads((second / "tfdeploy-env.json").read_text())["base"] == \
            os.path.realpath(bindir / "python3")
        assert second.name.split("-")[0] == first.name.split("-")[0]      # one requirements.txt
        assert import_version(first) == import_version(second) == "1.0"
        assert "setup: 1 reused of 1 host(s)" in setup(inventory("h1", h1))  # left in place

        both = inventory("both", h1, h2)
        # The probe of `inv check` runs each host's own environment (which lacks TensorFlow).
        checked = inv("check", "--hosts", str(both), "--payload", str(payload))
        assert checked.returncode == 1, checked.stdout + checked.stderr
        for env in (first, second):
            assert f"tensorflow, tf_keras and numpy are not installed for {env}/bin/python" \
                in checked.stdout, checked.stdout
        runs = tmp_path / "runs"
        trained = inv("train", "--hosts", str(both), "--payload", str(payload),
                      "--runs-dir", str(runs), "--start-timeout", "0", "--no-check")
        assert trained.returncode == 0, trained.stdout + trained.stderr
        (run_dir,) = [p for p in runs.iterdir() if p.is_dir()]
        for task, env in enumerate((first, second)):
            log = (run_dir / f"worker-{task}.log").read_text()
            assert f"ran with {env}/bin/python tinypkg 1.0" in log, log

        kept = inv("prune", "--hosts", str(both), "--payload", str(payload),
                   "--runs-dir", str(runs))
        assert kept.returncode == 0, kept.stdout + kept.stderr
        assert envs(workdir) == sorted([first, second])
        freed = inv("prune", "--hosts", str(both), "--runs-dir", str(runs))
        assert freed.returncode == 0, freed.stdout + freed.stderr
        assert "h1: freed" in freed.stdout and "2 environment(s)" in freed.stdout, freed.stdout
        assert envs(workdir) == []


def build_as_holder(envdir: str, want: dict, held, release) -> None:
    """Another host sharing the workdir: it takes the build lock, builds (a fake environment),
    and lets go when told."""
    with hostenv.build_lock(envdir, "h1", lambda event: None):
        held.set()
        release.wait(30)
        fake_env(Path(envdir), want)


def test_hosts_sharing_a_workdir_build_an_environment_once_the_others_wait(tmp_path):
    """h1 builds; h2 (another process, as another host) finds the environment missing, waits
    for the lock saying whose build it waits for, then reuses what h1 built."""
    rundir = tmp_path / "work" / "runs" / "setup-1-h2"
    rundir.mkdir(parents=True)
    (rundir / "requirements.txt").write_text("tinypkg==1.0\n")
    want = hostenv.wanted(str(rundir))
    envdir = tmp_path / "work" / "envs" / "e"
    envdir.parent.mkdir()
    ctx = multiprocessing.get_context("fork")
    held, release = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=build_as_holder, args=(str(envdir), want, held, release))
    holder.start()
    done, told = [], []
    try:
        assert held.wait(10)
        waiter = threading.Thread(target=lambda: done.append(
            hostenv.setup(str(rundir), "h2", False, told.append, str(envdir))))
        with mock.patch.object(hostenv, "WAIT_POLL", 0.05):
            waiter.start()
            time.sleep(0.5)
            assert not done
            release.set()
            waiter.join(30)
    finally:
        release.set()
        holder.join()
    assert done[0]["reused"] is True and done[0]["env"] == str(envdir)
    texts = [event.get("text", "") for event in told]
    assert any(t.startswith("waiting for h1, which builds this environment (") for t in texts)
    assert texts[-1] == "environment built meanwhile: reusing it"
    assert (envdir.parent / "e.lock").read_text() == "h2"     # the last holder's name
    assert not (rundir / "env-build").exists()
