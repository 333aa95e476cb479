"""The Slurm lab itself (tests/slurmlab.py): two nodes idle at their own addresses, steps on
both, batch jobs, scancel reaching processes that left their job's process group, and nothing
of the lab left once it stops. Skipped, saying why, where Slurm's packages are missing or the
tests do not run as root (.ci/run installs the packages and runs as root)."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import time

import pytest

import procs
from slurmlab import SlurmLab, missing, parse_fields

pytestmark = pytest.mark.skipif(missing() is not None, reason=missing() or "")


@pytest.fixture(scope="module")
def slurm_lab(tmp_path_factory: pytest.TempPathFactory):
    with SlurmLab(tmp_path_factory.mktemp("slurm")) as lab:
        yield lab


def test_nodes_are_idle_at_their_own_addresses(slurm_lab):
    lab = slurm_lab
    assert [(n.name, n.address) for n in lab.nodes] == [("n1", "127.0.5.1"), ("n2", "127.0.5.2")]
    sinfo = lab.run("sinfo", "--noheader", "--Node", "--format=%N %T").stdout.split()
    assert sinfo == ["n1", "idle", "n2", "idle"]
    for node in lab.nodes:
        fields = parse_fields(lab.run("scontrol", "--oneliner", "show", "node", node.name).stdout)
        assert (fields["NodeAddr"], fields["Port"]) == (node.address, str(node.port))
    assert lab.run("scontrol", "show", "hostnames", "n[1-2]").stdout.split() == ["n1", "n2"]


def test_a_step_of_an_allocation_runs_on_both_nodes(slurm_lab):
    done = slurm_lab.salloc(["srun", "sh", "-c", 'echo "$SLURMD_NODENAME $SLURM_JOB_ID '
                             '$SLURM_JOB_NODELIST $SLURM_TASKS_PER_NODE"'], nodes=2)
    assert done.returncode == 0, done.stderr
    assert done.job_id in slurm_lab.jobs
    assert sorted(done.stdout.splitlines()) == [
        f"{node} {done.job_id} n[1-2] 1(x2)" for node in ("n1", "n2")]
    slurm_lab.wait_job(done.job_id, {"COMPLETED"})


def test_a_batch_job_completes_with_exit_code_0_0(slurm_lab):
    job = slurm_lab.sbatch("#!/bin/sh\necho on $SLURMD_NODENAME\n", "--nodelist=n2")
    info = slurm_lab.wait_job(job, {"COMPLETED"})
    assert (info["ExitCode"], info["NodeList"]) == ("0:0", "n2")
    assert (slurm_lab.dir / f"job-{job}.out").read_text() == "on n2\n"
    failing = slurm_lab.sbatch("#!/bin/sh\nexit 3\n")
    info = slurm_lab.wait_job(failing, {"FAILED"})
    assert info["ExitCode"] == "3:0"


def test_scancel_ends_a_running_job_and_the_processes_that_left_it(slurm_lab):
    """A setsid child and a double-forked grandchild that ignores SIGTERM (procs.py's
    ESCAPING_PAYLOAD): Slurm's process tracking reaches both."""
    lab = slurm_lab
    if lab.proctrack != "cgroup":
        pytest.skip(f"proctrack/{lab.proctrack}: a double-forked child escapes scancel "
                    f"({lab.proctrack_note})")
    job = lab.sbatch(f"#!/bin/sh\nexec python3 - --wait <<'EOF'\n{procs.ESCAPING_PAYLOAD}EOF\n")
    out = lab.dir / f"job-{job}.out"
    deadline = time.monotonic() + 20
    while "escaped " not in _read(out):
        assert time.monotonic() < deadline, f"job {job}: {lab.job_state(job)}, {_read(out)!r}"
        time.sleep(0.1)
    pids = procs.escaped_pids(_read(out))
    try:
        assert lab.job_state(job) == "RUNNING"
        lab.scancel(job)
        assert _wait_gone(pids, 10) == []
        assert lab.wait_job(job, {"CANCELLED"})["ExitCode"] == "0:15"
    finally:
        for pid in pids:
            _kill(pid)


def test_a_stopped_lab_leaves_nothing(tmp_path):
    """Stopped with a batch job running and a job whose salloc was killed (which Slurm keeps
    running): no daemon, step daemon or task is left, no port listens, no job cgroup, socket
    or spool remains."""
    with SlurmLab(tmp_path, nodes=2) as lab:
        batch = lab.sbatch("#!/bin/sh\nsleep 300\n")
        salloc = subprocess.Popen(["salloc", "-N1", "-w", "n2", "srun", "sleep", "300"],
                                  env=lab.env(), stderr=subprocess.PIPE, text=True,
                                  start_new_session=True)
        try:
            granted = _granted(salloc)
            lab.wait_job(batch, {"RUNNING"})
            lab.wait_job(granted, {"RUNNING"})
            deadline = time.monotonic() + 20
            while len(_sleeping(lab.leftovers())) < 2:
                assert time.monotonic() < deadline, "the jobs' sleep 300 did not start"
                time.sleep(0.1)
            os.killpg(salloc.pid, signal.SIGKILL)
            salloc.wait()
            assert lab.job_state(granted) == "RUNNING"
            daemons, run_dir, nodes = lab.pids, lab.run_dir, lab.nodes
            ports = [lab.controller_port, *(n.port for n in nodes)]
            job_cgroups = [p for p in _cgroup_dirs() if p.endswith((f"job_{batch}",
                                                                     f"job_{granted}"))]
            assert job_cgroups or lab.proctrack != "cgroup"
            left = lab.leftovers()
        finally:
            procs.end(salloc)
    assert lab.pids == [] and lab.run_dir is None
    assert lab.leftovers() == [], f"left of the lab: {lab.leftovers()} (of {left})"
    assert [pid for pid in daemons if _alive(pid)] == []
    assert not run_dir.exists()
    assert [p for p in ports if _listening(p)] == []
    assert set(job_cgroups) & set(_cgroup_dirs()) == set()


def test_env_talks_to_this_lab_only(tmp_path):
    lab = SlurmLab(tmp_path)
    inherited = {"PATH": "/usr/bin:/bin", "HOME": "/root", "SLURM_JOB_ID": "7",
                 "SLURM_CONF": "/etc/slurm/other.conf", "SBATCH_PARTITION": "gpu",
                 "SALLOC_ACCOUNT": "x", "SRUN_CPUS_PER_TASK": "4", "SQUEUE_FORMAT": "%i"}
    assert lab.env(inherited) == {"PATH": "/usr/bin:/bin", "HOME": "/root",
                                  "SLURM_CONF": str(lab.conf)}


def test_parse_fields_keeps_values_with_spaces():
    text = "JobId=5 JobName=a b Command=/x/run.sh --n 3 WorkDir=/w ExitCode=0:0 Comment=\n"
    assert parse_fields(text) == {"JobId": "5", "JobName": "a b",
                                  "Command": "/x/run.sh --n 3", "WorkDir": "/w",
                                  "ExitCode": "0:0", "Comment": ""}


def _granted(salloc: subprocess.Popen, timeout: float = 30) -> int:
    deadline = time.monotonic() + timeout
    for line in salloc.stderr:
        if "Granted job allocation" in line:
            return int(line.split()[-1])
        assert time.monotonic() < deadline, "salloc was not granted an allocation"
    raise AssertionError(f"salloc ended ({salloc.wait()}) without an allocation")


def _sleeping(pids: list[int]) -> list[int]:
    """Those of `pids` that are `sleep 300`."""
    found = []
    for pid in pids:
        try:
            argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        if os.path.basename(argv[0]) == b"sleep" and argv[1:] == [b"300", b""]:
            found.append(pid)
    return found


def _wait_gone(pids: list[int], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while (left := [p for p in pids if _alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def _alive(pid: int) -> bool:
    try:
        return procs._state(str(pid)) != "Z"
    except OSError:
        return False


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _cgroup_dirs() -> list[str]:
    found = []
    for root, dirs, _ in os.walk("/sys/fs/cgroup"):
        found += [os.path.join(root, d) for d in dirs if d.startswith("job_")]
        dirs[:] = [d for d in dirs if d.startswith(("slurm", "uid_", "job_"))
                   or root == "/sys/fs/cgroup"]
    return found


def _read(path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""
