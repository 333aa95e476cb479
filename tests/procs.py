"""Find a run's processes on this machine by the TFDEPLOY_RUN_ID in their environment.

Lab hosts are all this machine, so every task a run starts shows up here. /proc/<pid>/environ
is the environment a process was exec'd with (later setenv calls do not show), readable for
processes of the same user, or all of them as root.
"""
from __future__ import annotations

import os
import subprocess
import time

RUN_ID_VAR = "TFDEPLOY_RUN_ID"


def processes_of_run(run_id: str) -> list[int]:
    """Pids of live (non-zombie) processes whose environment holds TFDEPLOY_RUN_ID=<run_id>."""
    wanted = f"{RUN_ID_VAR}={run_id}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read()
            if wanted not in environ.split(b"\0"):
                continue
            if _state(entry) == "Z":
                continue
        except OSError:       # vanished, or not ours to read
            continue
        found.append(int(entry))
    return sorted(found)


def end(proc: subprocess.Popen) -> None:
    """A process the test started, killed and reaped if it still runs (its last resort)."""
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def wait_until_gone(run_id: str, timeout: float, interval: float = 0.1) -> list[int]:
    """Poll until no process of the run is left; return the survivors ([] once all are gone)."""
    deadline = time.monotonic() + timeout
    while True:
        left = processes_of_run(run_id)
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(interval)


def wait_for_processes(run_id: str, count: int, timeout: float = 10,
                       interval: float = 0.05) -> list[int]:
    """The run's processes once there are at least `count` (a supervisor starts its task a
    moment after it is itself started), or as many as there are at the timeout."""
    deadline = time.monotonic() + timeout
    while len(found := processes_of_run(run_id)) < count and time.monotonic() < deadline:
        time.sleep(interval)
    return found


def _state(pid: str) -> str:
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    # "pid (comm) S ...": comm may hold spaces and parentheses, so split after the last ')'.
    return stat.rpartition(b")")[2].split()[0].decode()


def default_signals() -> None:
    """A `preexec_fn` for a controller a test signals: SIGINT, SIGTERM and SIGHUP at their
    defaults, whatever the test run inherited (a background job has SIGINT ignored, `nohup`
    SIGHUP), since a controller keeps a signal it inherited as ignored."""
    import signal
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)


# A payload that leaves its task's process group twice, prints the pids, then exits (or, given
# --wait, sleeps): one child in a session of its own (setsid), and the grandchild of a double
# fork in a process group of its own, which ignores SIGTERM as well.
ESCAPING_PAYLOAD = """\
import os, signal, subprocess, sys, time
child = subprocess.Popen(["sleep", "300"], start_new_session=True)
r, w = os.pipe()
if os.fork() == 0:
    if os.fork() == 0:
        os.setpgid(0, 0)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        os.write(w, b"%d\\n" % os.getpid())
        time.sleep(300)
    os._exit(0)
os.wait()
grandchild = int(os.read(r, 64))
assert os.getsid(child.pid) == child.pid and os.getpgid(grandchild) == grandchild
print("escaped", child.pid, grandchild, flush=True)
if "--wait" in sys.argv:
    time.sleep(300)
"""


def escaped_pids(log: str) -> list[int]:
    """The pids an ESCAPING_PAYLOAD printed in `log`."""
    line = next(line for line in log.splitlines() if line.startswith("escaped "))
    return sorted(int(p) for p in line.split()[1:])
