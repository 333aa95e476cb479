"""Host side of `inv setup`: one virtual environment per requirements file, built beside the
others and renamed into place. Runs in the run directory of the setup.

    <workdir>/envs/<name>/                a finished environment (its name: envkey.py)
    <workdir>/envs/<name>/tfdeploy-env.json  written last: requirements hash, python version
    <workdir>/envs/<name>.lock            locked by the host building that environment: hosts
                                          sharing the workdir build it once, the others wait
                                          and reuse it (build_lock)
    <rundir>/env-build/                   the environment while it is built; renamed to
                                          envs/<name> only once pip succeeded, so a half-built
                                          one is never used (a failed build goes with the run
                                          directory's cleanup)
    <rundir>/build.pid                    {"pid", "pgid", "started"} of the running step (venv,
                                          pip): its own process group, with TFDEPLOY_RUN_ID in
                                          its environment, so that the agent's cleanup (after
                                          Ctrl-C) stops it before it deletes the run directory

Two requests of the agent (agent.py): `env-status` answers whether the environment of the run
directory's requirements.txt for this host (envkey.env_dir, under the run directory's workdir)
is ready; `env-build` builds it (its `host`: the inventory's name of this host, shown to hosts
that wait for its build), telling each step and pip output line as a frame of its answer, then
the result. The interpreter running the agent is the one the environment is built from and
keyed by. Each host has a run directory of its own, also where hosts share the workdir.
"""
import contextlib
import errno
import fcntl
import hashlib
import json
import os
import subprocess
import sys
import time

from deploy.host import probe
from deploy.host.envkey import env_dir
from deploy.host.layout import (
    BUILD_PID, ENV_BUILD, ENV_REPLACED, REQUIREMENTS, WHEELHOUSE, in_run, workdir_of
)
from deploy.host.hosterror import HostError
from deploy.host.rundir import read_json, run_id_of, write_json_atomic

MARKER = "tfdeploy-env.json"
# <workdir>/envs/<name>.lock: who builds that environment now (build_lock)
LOCK_SUFFIX = ".lock"
WAIT_POLL = 2.0
# Characters of one pip output line told to the controller: a line past it is cut.
TEXT_LIMIT = 2000


class SetupError(HostError):
    pass


def wanted(rundir):
    with open(in_run(rundir, REQUIREMENTS), "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    return {"requirements_sha256": digest, "python": sys.version.split()[0],
            "base": os.path.realpath(sys.executable)}


def ready(envdir, want):
    have = read_json(os.path.join(envdir, MARKER))
    if not isinstance(have, dict):
        return False
    return all(have.get(k) == v for k, v in want.items()) and os.path.exists(
        os.path.join(envdir, "bin", "python"))


def versions(envdir):
    """The environment's versions of probe.PACKAGES, read by its own python as the check reads
    them (probe.py, run from its source)."""
    source = probe.__loader__.get_source(probe.__name__)
    out = subprocess.run([os.path.join(envdir, "bin", "python"), "-I", "-",
                          json.dumps({"versions": True})], input=source,
                         capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise SetupError("the environment's python does not run: %s" % out.stderr.strip()[-300:])
    return json.loads(out.stdout)


def env_of(rundir):
    """This host's environment directory for the run directory's requirements.txt."""
    return env_dir(workdir_of(rundir), wanted(rundir)["requirements_sha256"])


def envstatus(rundir, envdir=None):
    envdir = envdir or env_of(rundir)
    python = sys.version.split()[0]       # the agent's: the one a build would use
    if ready(envdir, wanted(rundir)):
        return {"ready": True, "env": envdir, "python": python, "versions": versions(envdir)}
    return {"ready": False, "env": envdir, "python": python}


def run_logged(argv, rundir, tell):
    """Run one step in a process group of its own, recorded in <rundir>/build.pid: closing
    the SSH channel does not end a pip that is waiting on the network, the agent's cleanup
    does (TERM, then KILL, to that group only, checked against the run id)."""
    run_id = run_id_of(rundir)
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, text=True, errors="replace",
                            start_new_session=True,
                            env=dict(os.environ, TFDEPLOY_RUN_ID=run_id))
    pidfile = in_run(rundir, BUILD_PID)
    write_json_atomic(pidfile, {"pid": proc.pid, "pgid": proc.pid, "started": time.time()})
    for line in proc.stdout:
        if line.strip():
            tell({"event": "log", "text": line.rstrip()[:TEXT_LIMIT]})
    code = proc.wait()
    os.unlink(pidfile)
    if code != 0:
        raise SetupError("%s failed with exit code %d" % (" ".join(argv[:4]), code))


@contextlib.contextmanager
def build_lock(envdir, host, tell):
    """Held while this host builds `envdir`: hosts sharing the workdir (and a Python build, so
    one environment name) build it once. A POSIX record lock (fcntl), which NFS carries between
    machines, on <envdir>.lock, taken without blocking and tried again every WAIT_POLL seconds:
    each try says whose build it waits for (the holder writes its name into the file), and a
    controller gone meanwhile ends the waiter at that line (a broken pipe). The lock goes with
    its holder's process, however that ends."""
    fd = os.open(envdir + LOCK_SUFFIX, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        started = time.monotonic()
        while True:
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno == errno.ENOLCK:
                    break        # NFS without a lock manager: each host builds in its own dir
                if exc.errno not in (errno.EACCES, errno.EAGAIN):
                    raise
            holder = os.pread(fd, 200, 0).decode("utf-8", "replace").strip() or "another host"
            tell({"event": "step", "text": "waiting for %s, which builds this environment (%d s)"
                  % (holder, time.monotonic() - started)})
            time.sleep(WAIT_POLL)
        os.ftruncate(fd, 0)
        os.pwrite(fd, host.encode(), 0)
        yield
    finally:
        os.close(fd)


def setup(rundir, host, wheelhouse, tell, envdir=None):
    """The environment of the run directory's requirements.txt, reused or built; each step
    and pip output line told (`tell`, a frame of the answer), the result answered."""
    envdir = envdir or env_of(rundir)
    want = wanted(rundir)
    if ready(envdir, want):
        tell({"event": "step", "text": "environment exists: reusing it"})
        return reused(envdir)
    os.makedirs(os.path.dirname(envdir), exist_ok=True)
    with build_lock(envdir, host, tell):
        if ready(envdir, want):          # built by another host while this one waited
            tell({"event": "step", "text": "environment built meanwhile: reusing it"})
            return reused(envdir)
        return build_env(rundir, envdir, want, wheelhouse, tell)


def reused(envdir):
    return {"event": "done", "reused": True, "env": envdir, "versions": versions(envdir)}


def build_env(rundir, envdir, want, wheelhouse, tell):
    """Build the environment in the run directory and rename it into place."""
    build = in_run(rundir, ENV_BUILD)
    tell({"event": "step", "text": "creating the virtual environment (python %s)"
          % want["python"]})
    run_logged([sys.executable, "-m", "venv", build], rundir, tell)
    python = os.path.join(build, "bin", "python")
    install = [python, "-m", "pip", "install", "--disable-pip-version-check", "--no-input",
               "-r", in_run(rundir, REQUIREMENTS)]
    if wheelhouse:
        install += ["--no-index", "--find-links", in_run(rundir, WHEELHOUSE)]
    tell({"event": "step", "text": "installing requirements.txt" + (
        " from the wheelhouse" if wheelhouse else "")})
    run_logged(install, rundir, tell)
    with open(os.path.join(build, MARKER), "w") as f:
        json.dump(want, f)
    if os.path.lexists(envdir):
        # A stale one (unfinished, or its marker disagrees): it goes with this run's directory.
        os.rename(envdir, in_run(rundir, ENV_REPLACED))
    os.rename(build, envdir)
    relocate(envdir, build)
    return {"event": "done", "reused": False, "env": envdir, "versions": versions(envdir)}


def relocate(envdir, build):
    """Scripts and activate files name the directory the env was built in; point them at its
    final place (bin/python itself does not depend on it)."""
    old, new = build.encode(), envdir.encode()
    for folder in (os.path.join(envdir, "bin"), envdir):
        for name in os.listdir(folder):
            path = os.path.join(folder, name)
            if os.path.islink(path) or not os.path.isfile(path):
                continue
            with open(path, "rb") as f:
                data = f.read()
            if old in data:
                with open(path, "wb") as f:
                    f.write(data.replace(old, new))
