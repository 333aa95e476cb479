"""A real Slurm on this one machine: munged, slurmctld and one slurmd per node, started and
stopped by the tests as tests/sshlab.py starts sshd.

Node nI is `slurmd -N nI` (Debian's slurmd has multiple-slurmd support) with NodeAddr
127.0.5.I and a port of its own; slurmctld answers at 127.0.0.1 under this machine's short
hostname; munged runs with the lab's own key and socket. Clients reach this lab, and no
other Slurm, through `env()` (SLURM_CONF and nothing inherited that steers Slurm's clients):

    with SlurmLab(tmp_path) as lab:
        done = lab.salloc(["srun", "hostname"], nodes=2)
        job = lab.sbatch("#!/bin/sh\\ntrue\\n")
        lab.wait_job(job, {"COMPLETED"})

Config, state, logs and job outputs are under `base_dir/slurm` (wiped at each start, kept
afterwards for a post-mortem); munged's socket and slurmd's spool (where each step has a
socket) are in a short directory of their own under /tmp, removed at stop, since a socket's
path must fit in 108 bytes. `stop()` (on leaving the `with` block, also after a failure)
cancels every job of the lab, ends each daemon by the pid of its own Popen (SIGKILL to its
process group if it lingers), then any process left that carries the lab's SLURM_CONF in its
environment (step daemons, tasks), and removes the cgroups it created. docs/slurm-lab.md
has how it is set up and what was measured with it.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from ipaddress import ip_address, ip_network
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import procs
from sshlab import LabError, _tail

PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")
DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sinfo", "srun", "salloc", "sbatch", "squeue", "scontrol", "scancel")
LOOPBACK = ip_network("127.0.0.0/8")
FIRST_NODE_ADDRESS = "127.0.5.1"
CONTROLLER_ADDRESS = "127.0.0.1"
CGROUP_ROOT = Path("/sys/fs/cgroup")
SUN_PATH_MAX = 107                  # bytes of a unix socket's path, without the NUL
STEP_SOCKET_NAME = 32               # "<node>_<job id>.<step id>" in slurmd's spool, at most
READY_TIMEOUT = 30.0
STOP_GRACE = 10.0
START_ATTEMPTS = 3                  # a probed port can be taken before a daemon binds it
CLIENT_TIMEOUT = 30.0
# What a client inherits that would point it at another cluster or change what it asks:
# SLURM_* (an allocation's own variables, SLURM_CONF) and each command's input variables.
CLIENT_VARIABLE_PREFIXES = ("SLURM_", "SALLOC_", "SBATCH_", "SRUN_", "SQUEUE_", "SINFO_",
                            "SCONTROL_", "SCANCEL_")


class SlurmUnavailable(LabError):
    """This machine cannot run the lab at all (packages missing, not root): tests skip."""


@dataclass(frozen=True)
class SlurmNode:
    name: str              # n1, n2, ...
    address: str           # its NodeAddr, 127.0.5.N
    port: int              # its slurmd's port
    log: Path              # its slurmd's log (slurmstepd logs there too)


@dataclass(frozen=True)
class Finished:
    """A client command that ran to its end (salloc: with the job it was granted)."""
    job_id: int | None
    returncode: int
    stdout: str
    stderr: str


@dataclass
class _Daemon:
    name: str
    proc: subprocess.Popen
    log: Path


def missing() -> str | None:
    """Why this machine cannot run the lab (as a test skip reason), or None if it can."""
    absent = [name for name in (*DAEMONS, *CLIENTS) if _which(name) is None]
    if absent:
        return (f"the Slurm lab needs {', '.join(absent)}: apt-get install "
                f"--no-install-recommends {' '.join(PACKAGES)} (.ci/run installs them)")
    if os.geteuid() != 0:
        return "the Slurm lab runs its daemons as root (SlurmUser=root, munged's own key)"
    return None


def _which(name: str) -> str | None:
    """Where a daemon or client is: on PATH, or in the system directories Debian puts them
    in (a PATH without /usr/sbin is common for a non-login root)."""
    return shutil.which(name, path=os.pathsep.join([os.environ.get("PATH", ""),
                                                    "/usr/sbin", "/usr/bin"]))


class SlurmLab:
    """A Slurm cluster of `nodes` nodes on this machine. Use as a context manager.

    `proctrack` is "cgroup", "linuxproc" or "auto" (cgroup where the lab comes up with it,
    else linuxproc; `self.proctrack` says which it runs). `kill_wait` is Slurm's KillWait
    (seconds between SIGTERM and SIGKILL when a job ends; Slurm's default is 30) and
    `min_job_age` its MinJobAge (how long an ended job stays visible to scontrol).
    """

    def __init__(self, base_dir: Path, nodes: int = 2, *, first_address: str = FIRST_NODE_ADDRESS,
                 cpus: int = 4, proctrack: str = "auto", kill_wait: int = 5,
                 min_job_age: int = 300) -> None:
        if not 1 <= nodes <= 16:
            raise ValueError(f"nodes must be 1 to 16, not {nodes}")
        if proctrack not in ("auto", "cgroup", "linuxproc"):
            raise ValueError(f"proctrack must be auto, cgroup or linuxproc, not {proctrack!r}")
        self.dir = Path(base_dir).resolve() / "slurm"
        self.conf = self.dir / "slurm.conf"
        first = ip_address(first_address)
        self._addresses = [str(first + i) for i in range(nodes)]
        self._cpus, self._kill_wait, self._min_job_age = cpus, kill_wait, min_job_age
        self._proctrack_wanted = proctrack
        self.proctrack = ""
        self.proctrack_note = ""                # why "auto" did not get cgroup
        self.nodes: list[SlurmNode] = []
        self.jobs: set[int] = set()             # every job id a helper saw granted
        self.controller_port = 0
        self.munge_socket: Path | None = None
        self.hostname = socket.gethostname().split(".")[0]
        self._daemons: list[_Daemon] = []
        self._run_dir: Path | None = None       # short: munge socket, slurmd spools
        self._cgroups_before: set[Path] | None = None
        self._script_count = 0

    # -- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> SlurmLab:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        """Start munged, slurmctld and the slurmds; return once every node is idle and a
        step runs on all of them. LabError (with the daemons' logs) if not within
        READY_TIMEOUT."""
        if self._daemons:
            raise LabError("this lab is already running: stop() it first")
        reason = missing()
        if reason:
            raise SlurmUnavailable(reason)
        for address in self._addresses:
            _check_bindable(address)
        tries = ["cgroup", "linuxproc"] if self._proctrack_wanted == "auto" \
            else [self._proctrack_wanted]
        for proctrack in tries:
            for attempt in range(1, START_ATTEMPTS + 1):
                try:
                    self._start_once(proctrack)
                    return
                except LabError as exc:
                    logs = self._log_tails()
                    self.stop()
                    if attempt < START_ATTEMPTS and "Address already in use" in logs:
                        continue
                    if proctrack == "cgroup" and len(tries) > 1 and "cgroup" in logs.lower():
                        # This machine's cgroups do not serve: the next proctrack.
                        self.proctrack_note = "proctrack/cgroup failed here: " + "; ".join(
                            line.strip() for line in logs.splitlines()
                            if "cgroup" in line.lower())[:500]
                        break
                    raise LabError(f"{exc}\n{logs}") from None

    def stop(self) -> None:
        """Cancel every job of the lab, end the daemons, then any process left that carries
        the lab's SLURM_CONF (step daemons, tasks, clients), and remove the lab's cgroups
        and short directory."""
        if self._controller_up():
            self._cancel_all()
        daemons, self._daemons = self._daemons, []
        # slurmds first (they tell the controller), munged last (the others use it to stop).
        for group in ([d for d in daemons if d.name.startswith("slurmd")],
                      [d for d in daemons if d.name == "slurmctld"],
                      [d for d in daemons if d.name == "munged"]):
            _end(group)
        self._kill_leftovers()
        if self._cgroups_before is not None:
            for path in sorted(set(_slurm_cgroups(self.nodes)) - self._cgroups_before):
                _remove_cgroup_tree(path)
            self._cgroups_before = None
        if self._run_dir is not None:
            shutil.rmtree(self._run_dir, ignore_errors=True)
            self._run_dir = None

    def leftovers(self) -> list[int]:
        """Live processes whose environment holds this lab's SLURM_CONF: every daemon, step
        daemon and task of the lab carries it (slurmstepd leaves the daemons' sessions, so
        the sessions alone would miss it), as does every client started with env()."""
        return processes_with(f"SLURM_CONF={self.conf}")

    def _kill_leftovers(self) -> None:
        deadline = time.monotonic() + STOP_GRACE
        while (left := self.leftovers()) and time.monotonic() < deadline:
            for pid in left:
                _kill(pid, signal.SIGKILL)
            time.sleep(0.05)

    @property
    def pids(self) -> list[int]:
        """Pids of the daemons this lab started and has not stopped yet."""
        return [d.proc.pid for d in self._daemons]

    @property
    def run_dir(self) -> Path | None:
        """The short directory of munged's socket and slurmd's spools (None when stopped)."""
        return self._run_dir

    # -- clients -----------------------------------------------------------------------------

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """An environment for Slurm's clients (and what they start) that talks to this lab
        only: `base` (default os.environ) without any SLURM_* or client input variable,
        and SLURM_CONF naming the lab's slurm.conf (which names munged's socket)."""
        env = {k: v for k, v in (os.environ if base is None else base).items()
               if not k.startswith(CLIENT_VARIABLE_PREFIXES)}
        env["SLURM_CONF"] = str(self.conf)
        return env

    def run(self, *args: str, timeout: float = CLIENT_TIMEOUT,
            check: bool = True) -> subprocess.CompletedProcess:
        """A client command (`lab.run("scontrol", "show", "node", "n1")`) against this lab."""
        try:
            done = subprocess.run(list(args), env=self.env(), capture_output=True, text=True,
                                  timeout=timeout, stdin=subprocess.DEVNULL, cwd=self.dir)
        except subprocess.TimeoutExpired as exc:
            raise LabError(f"{' '.join(args)} did not end within {timeout:.0f}s") from exc
        if check and done.returncode != 0:
            raise LabError(f"{' '.join(args)} exited {done.returncode}: "
                           f"{done.stderr.strip() or done.stdout.strip()}")
        return done

    def salloc(self, cmd: Sequence[str], nodes: int | None = None, *,
               options: Sequence[str] = (), timeout: float = 120,
               env: Mapping[str, str] | None = None, cwd: Path | None = None) -> Finished:
        """`salloc -N<nodes> [options] cmd...` to its end (nodes: all of the lab's), `cmd`
        run here in `cwd` (default the lab's directory) with env(env). The job it was
        granted is recorded, so stop() cancels it if salloc left it behind."""
        argv = ["salloc", f"-N{nodes or len(self.nodes)}", *options, *cmd]
        try:
            done = subprocess.run(argv, env=self.env(env), capture_output=True, text=True,
                                  timeout=timeout, stdin=subprocess.DEVNULL,
                                  cwd=cwd or self.dir)
        except subprocess.TimeoutExpired as exc:
            self._note_job(_text(exc.stderr))
            raise LabError(f"{' '.join(argv)} did not end within {timeout:.0f}s") from exc
        return Finished(self._note_job(done.stderr), done.returncode, done.stdout, done.stderr)

    def sbatch(self, script: str, *options: str) -> int:
        """Submit `script` (its text, #! line included) with `sbatch --parsable [options]`;
        its output goes to <lab>/job-<id>.out unless options say otherwise. The job id."""
        self._script_count += 1
        path = self.dir / f"script-{self._script_count}.sh"
        path.write_text(script)
        done = self.run("sbatch", "--parsable", f"--output={self.dir}/job-%j.out", *options,
                        str(path))
        job_id = int(done.stdout.strip().split(";")[0])
        self.jobs.add(job_id)
        return job_id

    def job(self, job_id: int) -> dict[str, str] | None:
        """`scontrol show job` as a dict (JobState, ExitCode, NodeList, ...), or None once
        the controller has forgotten the job (MinJobAge after it ended)."""
        done = self.run("scontrol", "--oneliner", "show", "job", str(job_id), check=False)
        if done.returncode != 0:
            if "Invalid job id" in done.stderr:
                return None
            raise LabError(f"scontrol show job {job_id} exited {done.returncode}: "
                           f"{done.stderr.strip()}")
        return parse_fields(done.stdout)

    def job_state(self, job_id: int) -> str | None:
        """JobState (PENDING, RUNNING, COMPLETING, COMPLETED, CANCELLED, FAILED, ...), or None
        once the job is forgotten."""
        info = self.job(job_id)
        return None if info is None else info.get("JobState")

    def wait_job(self, job_id: int, states: Iterable[str] = ("COMPLETED",),
                 timeout: float = 30.0) -> dict[str, str]:
        """The job's fields once its state is one of `states`; LabError naming the last
        state seen if not within `timeout` seconds."""
        wanted = set(states)
        deadline = time.monotonic() + timeout
        while True:
            info = self.job(job_id)
            state = None if info is None else info.get("JobState")
            if info is not None and state in wanted:
                return info
            if time.monotonic() >= deadline:
                raise LabError(f"job {job_id} is {state or 'gone'}, not "
                               f"{' or '.join(sorted(wanted))}, after {timeout:.0f}s")
            time.sleep(0.1)

    def queue(self) -> list[int]:
        """Ids of the jobs the controller still lists in its queue (not yet ended)."""
        out = self.run("squeue", "--noheader", "--format=%i").stdout
        return [int(w) for w in out.split()]

    def scancel(self, *job_ids: int) -> None:
        if job_ids:
            self.run("scancel", *map(str, job_ids))

    # -- internals ---------------------------------------------------------------------------

    def _start_once(self, proctrack: str) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)
        for sub in ("state", "log", "run"):
            (self.dir / sub).mkdir(parents=True)
        # A new short directory each time; munged wants every directory above its socket
        # searchable by all, /tmp included (1777).
        self._run_dir = Path(tempfile.mkdtemp(prefix="tfslurm-", dir="/tmp"))
        self._run_dir.chmod(0o755)
        spool = self._run_dir / "spool"
        if len(str(spool / "n16" / ("x" * STEP_SOCKET_NAME))) > SUN_PATH_MAX:
            raise LabError(f"{spool} is too long a path for step sockets")
        self.proctrack = proctrack
        self.controller_port = _free_port()
        self.nodes = [SlurmNode(f"n{i + 1}", address, _free_port(),
                                self.dir / "log" / f"slurmd-n{i + 1}.log")
                      for i, address in enumerate(self._addresses)]
        for node in self.nodes:
            (spool / node.name).mkdir(parents=True)
        self._cgroups_before = set(_slurm_cgroups(self.nodes))
        self._start_munged()
        self._write_configs()
        self._spawn("slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.conf)])
        for node in self.nodes:
            self._spawn(f"slurmd-{node.name}", ["slurmd", "-D", "-N", node.name,
                                                 "-f", str(self.conf)])
        self._wait_ready()

    def _start_munged(self) -> None:
        assert self._run_dir is not None
        key = self.dir / "munge.key"
        with open(key, "wb", opener=lambda p, f: os.open(p, f, 0o600)) as f:
            f.write(os.urandom(1024))
        self.munge_socket = self._run_dir / "munge.socket"
        self._spawn("munged", ["munged", "--foreground", f"--socket={self.munge_socket}",
                               f"--key-file={key}", f"--pid-file={self.dir / 'run/munged.pid'}",
                               f"--seed-file={self.dir / 'run/munged.seed'}",
                               f"--log-file={self.dir / 'log/munged.log'}"])
        _until(lambda: self.munge_socket.is_socket(), 10, "munged did not create its socket",
               self._daemons)

    def _write_configs(self) -> None:
        assert self._run_dir is not None
        d = self.dir
        nodes = "\n".join(
            f"NodeName={n.name} NodeHostname={self.hostname} NodeAddr={n.address} "
            f"Port={n.port} CPUs={self._cpus} Sockets=1 CoresPerSocket={self._cpus} "
            "ThreadsPerCore=1 State=UNKNOWN" for n in self.nodes)
        self.conf.write_text(f"""\
# tfdeploy test lab: {len(self.nodes)} nodes on this machine (tests/slurmlab.py)
ClusterName=tfdlab
SlurmctldHost={self.hostname}({CONTROLLER_ADDRESS})
SlurmctldPort={self.controller_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.munge_socket}
StateSaveLocation={d}/state
SlurmdSpoolDir={self._run_dir}/spool/%n
SlurmctldPidFile={d}/run/slurmctld.pid
SlurmdPidFile={d}/run/slurmd-%n.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
PlugStackConfig={d}/plugstack.conf
ProctrackType=proctrack/{self.proctrack}
TaskPlugin=task/none
SelectType=select/cons_tres
# Cores only: without memory configured, CR_Core_Memory gives a job all of a node's memory.
SelectTypeParameters=CR_Core
# The nodes' CPUs as written here, not as the machine has them.
SlurmdParameters=config_overrides
SchedulerType=sched/builtin
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MailProg=/bin/true
ReturnToService=2
# Seconds from SIGTERM to SIGKILL when a job ends (Slurm's default: 30).
KillWait={self._kill_wait}
MinJobAge={self._min_job_age}
# Batch jobs start about 1 s after sbatch, not 3 (the default delay).
SchedulerParameters=batch_sched_delay=0
# Job cgroups are slurm_<node>/uid_0/job_<id>: apart from another lab's running meanwhile.
FirstJobId={_first_job_id()}
{nodes}
PartitionName=lab Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")
        # Slurm reads cgroup.conf beside slurm.conf; autodetect takes v1 or v2 as mounted.
        (d / "cgroup.conf").write_text(f"CgroupPlugin=autodetect\nCgroupMountpoint={CGROUP_ROOT}\n"
                                       "IgnoreSystemd=yes\n")
        (d / "plugstack.conf").write_text("")

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = self.dir / "log" / f"{name}.out"
        with open(log, "ab") as out:
            proc = subprocess.Popen([_which(argv[0]), *argv[1:]], env=self.env(),
                                    stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True,
                                    cwd=self.dir)
        self._daemons.append(_Daemon(name, proc, log))

    def _wait_ready(self) -> None:
        names = {n.name for n in self.nodes}
        state: dict[str, str] = {}

        def idle() -> bool:
            done = self.run("sinfo", "--noheader", "--Node", "--format=%N %T", check=False,
                            timeout=5)
            state.clear()
            state.update(line.split()[:2] for line in done.stdout.splitlines()
                         if len(line.split()) >= 2)
            return done.returncode == 0 and all(state.get(n) == "idle" for n in names)

        deadline = time.monotonic() + READY_TIMEOUT
        _until(idle, READY_TIMEOUT, "the nodes did not become idle", self._daemons,
               lambda: f"sinfo: {state or 'no answer'}")
        left = max(1.0, deadline - time.monotonic())
        done = self.run("srun", f"-N{len(self.nodes)}", "true", check=False, timeout=left)
        if done.returncode != 0:
            raise LabError(f"srun -N{len(self.nodes)} true exited {done.returncode}: "
                           f"{done.stderr.strip()}")
        # Its job completes a moment later; until then a new job of all nodes would wait.
        _until(lambda: not self.queue(), max(1.0, deadline - time.monotonic()),
               "the first job did not leave the queue", self._daemons)

    def _controller_up(self) -> bool:
        return any(d.name == "slurmctld" and d.proc.poll() is None for d in self._daemons)

    def _cancel_all(self) -> None:
        """scancel every job the controller knows of (all of them are the lab's, including
        those recorded in self.jobs), then wait until they have left the queue and their
        steps have ended."""
        try:
            queued = self.queue()
            self.scancel(*queued)
            _until(lambda: not self.queue(), STOP_GRACE, "jobs did not leave the queue", [])
        except LabError:
            pass                # the daemons and what carries the lab's SLURM_CONF end next

    def _note_job(self, stderr: str) -> int | None:
        found = re.search(r"Granted job allocation (\d+)", stderr or "")
        if not found:
            return None
        job_id = int(found.group(1))
        self.jobs.add(job_id)
        return job_id

    def _log_tails(self) -> str:
        parts = []
        for daemon in self._daemons:
            code = daemon.proc.poll()
            status = "running" if code is None else f"exited {code}"
            parts.append(f"--- {daemon.name} ({status}), {daemon.log}:\n{_tail(daemon.log, 15)}")
        return "\n".join(parts)


def parse_fields(text: str) -> dict[str, str]:
    """`Key=value Key2=value two ...` (scontrol --oneliner) as a dict: a value runs up to
    the next ` Key=` (so values with spaces, like Command, survive)."""
    keys = list(re.finditer(r"(?:^|\s)([A-Za-z][A-Za-z0-9_:/]*)=", text))
    fields = {}
    for this, following in zip(keys, keys[1:] + [None]):
        end = following.start() if following else len(text)
        fields[this.group(1)] = text[this.end():end].strip()
    return fields


def _first_job_id() -> int:
    """Job ids apart from another lab's running at the same time: their cgroups
    (slurm_<node>/uid_0/job_<id>) are named by node and job id alone."""
    return 1000 + int.from_bytes(os.urandom(3), "big") * 3


def _check_bindable(address: str) -> None:
    if ip_address(address) not in LOOPBACK:
        raise LabError(f"refusing to use {address}: the Slurm lab only uses 127.0.0.0/8")
    with socket.socket() as s:
        try:
            s.bind((address, 0))
        except OSError as exc:
            raise LabError(f"cannot bind to {address}: {exc} (is it an address of lo?)")


def _free_port() -> int:
    """A port free on every address: slurmd and slurmctld bind it on all of them (Slurm's
    NoInAddrAny would bind every slurmd to the hostname's one address instead)."""
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        return s.getsockname()[1]


def _until(ready, timeout: float, what: str, daemons: Sequence[_Daemon],
           detail=lambda: "") -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        dead = [d for d in daemons if d.proc.poll() is not None]
        if dead:
            raise LabError(f"{what}: {dead[0].name} exited {dead[0].proc.returncode}")
        if time.monotonic() >= deadline:
            extra = detail()
            raise LabError(f"{what} within {timeout:.0f}s" + (f" ({extra})" if extra else ""))
        time.sleep(0.1)


def _end(daemons: Sequence[_Daemon]) -> None:
    """SIGTERM each daemon; SIGKILL its process group (start_new_session made it its own)
    if it has not ended after STOP_GRACE, while it is not yet reaped (its pid cannot be
    anyone else's then); reap it."""
    for d in daemons:
        if d.proc.poll() is None:
            _kill(d.proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE
    for d in daemons:
        try:
            d.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(d.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            d.proc.wait()


def processes_with(variable: str) -> list[int]:
    """Pids of live (non-zombie) processes whose environment holds `variable` (NAME=value)."""
    wanted = variable.encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            if wanted not in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"):
                continue
            if procs._state(entry) == "Z":
                continue
        except OSError:
            continue
        found.append(int(entry))
    return sorted(found)


def _slurm_cgroups(nodes: Sequence[SlurmNode]) -> list[Path]:
    """Each controller's slurm_<node> cgroup directories (multiple-slurmd names them so)."""
    names = {f"slurm_{n.name}" for n in nodes}
    found = []
    for controller in (CGROUP_ROOT.iterdir() if CGROUP_ROOT.is_dir() else ()):
        for path in (controller, *(controller.iterdir() if controller.is_dir() else ())):
            for name in names:
                candidate = path / name
                if candidate.is_dir():
                    found.append(candidate)
    return sorted(set(found))


def _remove_cgroup_tree(top: Path) -> None:
    """rmdir a cgroup and its children, deepest first; one still in use stays."""
    for path in sorted((p for p in [top, *top.rglob("*")] if p.is_dir()),
                       key=lambda p: len(p.parts), reverse=True):
        try:
            path.rmdir()
        except OSError:
            pass


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _text(data: bytes | str | None) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else (data or "")
