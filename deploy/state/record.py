"""The local run record: runs/<run-id>/record.json, what a new controller needs to reach a run.

A run outlives the shell that started it, so everything needed to find its hosts and tasks
again is kept here: each host's connection fields, the run directories, ports and endpoints,
the options and the run's state. The inventory file may have changed or be gone by then.

This module alone reads and writes the file: a RunRecord is a frozen value, its state an
Enum, and a file is validated when it is read, so a damaged or foreign record.json is refused
with its path named instead of failing somewhere later.

No environment value is stored, secret or not: values are needed only to launch, and a
record that never holds any cannot leak one. Re-planning from a record gives the same run
directories, endpoints and commands (the planner is pure), with only tfdeploy's own variables.
"""
from __future__ import annotations

import dataclasses
import enum
import fcntl
import json
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from deploy.commandline import command
from deploy.errors import BadInput
from deploy.host.layout import RUN_ID
from deploy.host.rundir import write_atomic
from deploy.inventory.datasource import DataSource
from deploy.inventory.load import MAX_WORKERS_PER_HOST, workdir_problem
from deploy.inventory.model import ROLES, EnvValue, Host, Inventory
from deploy.inventory.sshconfig import Hop
from deploy.plan.planner import Options, RunPlan, plan_run
from deploy.state import localdir

RECORD_FILE = localdir.RECORD
VERSION = 1
# A record is read back at most this large: anything bigger is not one of ours.
MAX_RECORD_BYTES = 16 << 20
# The connection fields of a host; `env` is deliberately not among them.
HOST_FIELDS = ("name", "address", "transport", "port", "user", "identity_file", "known_hosts",
               "host_key_policy", "python", "workdir", "cluster_address", "workers",
               "own_python", "gpus", "data", "ssh_config", "jump", "target", "via", "role",
               "slurm_job")


# The types a recorded host field may have, checked when read: a record edited out of shape
# is refused naming its file, not met by a TypeError in the middle of `inv down`.
_OPTIONAL = type(None)
_HOST_TYPES = {
    "name": (str,), "address": (str,), "transport": (str,), "port": (int, _OPTIONAL),
    "user": (str, _OPTIONAL), "identity_file": (str, _OPTIONAL), "known_hosts": (str,),
    "host_key_policy": (str,), "python": (str,), "workdir": (str,), "cluster_address": (str,),
    "workers": (int,), "own_python": (bool,), "gpus": (list, tuple, str, _OPTIONAL),
    "data": (dict, _OPTIONAL), "ssh_config": (str,), "jump": (str, _OPTIONAL),
    "target": (dict, _OPTIONAL), "via": (list, tuple, _OPTIONAL), "role": (str,),
    "slurm_job": (str,),
}


class RecordError(BadInput):
    pass


class RunState(enum.Enum):
    STARTING = "starting"        # being pushed and launched
    RUNNING = "running"          # a controller follows it
    DETACHED = "detached"        # running with no controller following it
    FINISHED = "finished"        # its tasks ended and it was torn down
    INTERRUPTED = "interrupted"  # stopped by Ctrl-C or a signal
    DOWN = "down"                # stopped by `inv down`

    @property
    def active(self) -> bool:
        """Whether its tasks and run directories may still be on its hosts."""
        return self in (RunState.STARTING, RunState.RUNNING, RunState.DETACHED)


@dataclass(frozen=True)
class RecordedTask:
    index: int
    name: str
    host: str
    port: int | None
    endpoint: str
    role: str = "worker"             # a record written before roles existed: a worker
    # Bytes of its local log written before its log on its host began: the host's log starts
    # empty for a resumed run (`inv resume`) and on a spare a lost host's task moved to, while
    # the local log goes on. A later controller reads the host's log from the local size less
    # these.
    log_start: int = 0


@dataclass(frozen=True)
class RunRecord:
    run_id: str
    started: float
    state: RunState
    options: Options
    hosts: tuple[Host, ...]          # as resolved at launch, without their env
    run_dirs: tuple[str, ...]        # each host's run directory, for the reader of the file
    tasks: tuple[RecordedTask, ...]
    controller_pid: int | None = None
    attempt: int = 1
    restarts: int = 0
    exit_code: int | None = None
    ended: float | None = None
    # Its controller is the background one of `--detach --restarts N` (run/background.py),
    # on this machine, with no terminal: `inv down` stops it before the run.
    background: bool = False

    @classmethod
    def of(cls, plan: RunPlan, state: RunState, started: float,
           log_starts: Mapping[int, int] | None = None, **fields) -> "RunRecord":
        """`log_starts`: task index -> its RecordedTask.log_start (absent: 0)."""
        return cls(run_id=plan.run_id, started=started, state=state, options=plan.options,
                   controller_pid=fields.pop("controller_pid", os.getpid()),
                   **_planned(plan, log_starts or {}), **fields)

    def replanned(self, plan: RunPlan, log_starts: Mapping[int, int]) -> "RunRecord":
        """The same run with the hosts, ports and options of a new plan (a relaunch)."""
        return dataclasses.replace(self, options=plan.options, **_planned(plan, log_starts))

    def log_starts(self) -> dict[int, int]:
        """Task index -> its log_start, for the tasks whose host's log began after bytes of
        the local log."""
        return {t.index: t.log_start for t in self.tasks if t.log_start}

    def plan(self, where: str = "record",
             envs: Mapping[str, Mapping[str, EnvValue]] | None = None) -> RunPlan:
        """The run's plan again: same hosts, run dirs, ports and commands; with `envs` (host
        name -> its env, as the controller that launched the run had them), the same
        environments too, for a relaunch."""
        hosts = self.hosts if envs is None else tuple(
            dataclasses.replace(h, env=envs.get(h.name, {})) for h in self.hosts)
        try:
            ports = {t.index: t.port for t in self.tasks}
            plan = plan_run(Inventory(path=where, hosts=hosts), self.options, self.run_id,
                            ports)
        except (TypeError, ValueError, AttributeError, IndexError) as exc:
            # A record edited out of shape in a way its reading could not see.
            raise RecordError(f"{where}: not a usable tfdeploy run record: {exc}") from None
        recorded = [(t.index, t.endpoint, t.role) for t in self.tasks]
        if [(t.index, t.endpoint, t.role) for t in plan.tasks] != recorded:
            raise RecordError(f"{where}: its hosts and tasks do not match (edited by hand?)")
        return plan

    def controller_alive(self) -> bool:
        """Whether the controller that last followed the run still runs (on this machine)."""
        pid = self.controller_pid
        if not pid or pid == os.getpid():
            return False
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def shown_state(self) -> str:
        if self.state is RunState.FINISHED:
            return f"finished (exit {self.exit_code})"
        if self.state is RunState.RUNNING and not self.controller_alive():
            return "running (no controller)"
        if self.state is RunState.RUNNING and self.background:
            return f"running (background controller, pid {self.controller_pid})"
        return self.state.value

    def started_text(self) -> str:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.started))

    def document(self) -> dict:
        return {
            "version": VERSION,
            "run_id": self.run_id,
            "started": self.started,
            "state": self.state.value,
            "controller_pid": self.controller_pid,
            "options": dataclasses.asdict(self.options) | {"args": list(self.options.args)},
            "hosts": [{**{k: _stored(getattr(host, k)) for k in HOST_FIELDS}, "run_dir": rundir}
                      for host, rundir in zip(self.hosts, self.run_dirs)],
            "tasks": [dataclasses.asdict(t) for t in self.tasks],
            "attempt": self.attempt,
            "restarts": self.restarts,
            "exit_code": self.exit_code,
            "ended": self.ended,
            "background": self.background,
        }

    @classmethod
    def from_document(cls, doc: Any, where: str) -> "RunRecord":
        """The record a file holds, or RecordError naming the file and what is wrong."""
        def fail(message: str) -> RecordError:
            return RecordError(f"{where}: not a usable tfdeploy run record: {message}")
        if not isinstance(doc, dict) or doc.get("version") != VERSION:
            raise RecordError(f"{where}: not a tfdeploy run record of version {VERSION}")
        run_id = doc.get("run_id")
        if not isinstance(run_id, str) or not RUN_ID.match(run_id):
            raise fail(f"run_id {run_id!r} is not a run id")
        try:
            state = RunState(doc.get("state"))
        except ValueError:
            raise fail(f"unknown state {doc.get('state')!r}") from None
        try:
            hosts = doc["hosts"]
            if not isinstance(hosts, list) or not hosts:
                raise fail("'hosts' must be a non-empty list")
            return cls(
                run_id=run_id, started=_number(doc["started"], "started", fail), state=state,
                options=_options(doc["options"]),
                hosts=tuple(_host({k: h[k] for k in HOST_FIELDS if k in h}) for h in hosts),
                run_dirs=tuple(str(h.get("run_dir", "")) for h in hosts),
                tasks=tuple(_task(t, fail) for t in doc["tasks"]),
                controller_pid=doc.get("controller_pid"),
                attempt=int(doc.get("attempt") or 1), restarts=int(doc.get("restarts") or 0),
                exit_code=doc.get("exit_code"), ended=doc.get("ended"),
                background=doc.get("background") is True)
        except RecordError:
            raise
        except KeyError as exc:
            raise fail(f"field {exc.args[0]!r} is missing") from None
        except (TypeError, ValueError, AttributeError, IndexError) as exc:
            raise fail(str(exc)) from None


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)


def write_json(path: Path, doc: dict) -> None:
    """Atomically: a reader (another shell's `inv runs`) sees the old or the new file."""
    write_atomic(str(path), json.dumps(doc, indent=2) + "\n")


def write_record(run_dir: Path, record: RunRecord) -> None:
    write_json(run_dir / RECORD_FILE, record.document())


def update_record(run_dir: Path, **changes) -> RunRecord:
    """The record on disk with `changes` (RunRecord fields), written back."""
    record = dataclasses.replace(load_record(run_dir), **changes)
    write_record(run_dir, record)
    return record


def load_record(run_dir: Path) -> RunRecord:
    path = run_dir / RECORD_FILE
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_RECORD_BYTES + 1)
    except FileNotFoundError:
        raise RecordError(f"{path}: no run record (not a run started by this version of "
                          "tfdeploy, or not a run directory)") from None
    except OSError as exc:
        raise RecordError(f"{path}: unreadable run record: {exc}") from None
    if len(raw) > MAX_RECORD_BYTES:
        raise RecordError(f"{path}: unreadable run record: larger than "
                          f"{MAX_RECORD_BYTES >> 20} MiB")
    try:
        doc = json.loads(raw)
    except ValueError as exc:
        raise RecordError(f"{path}: unreadable run record: {exc}") from None
    except RecursionError:
        raise RecordError(f"{path}: unreadable run record: nested too deeply") from None
    return RunRecord.from_document(doc, str(path))


def list_records(runs_dir: Path) -> list[RunRecord]:
    """Every readable record below `runs_dir`, oldest first."""
    return read_records(runs_dir)[0]


def read_records(runs_dir: Path) -> tuple[list[RunRecord], list[str]]:
    """Every readable record below `runs_dir`, oldest first, and why each other one is not
    (its file and the reason: damaged, foreign, of another version)."""
    _check_is_dir(runs_dir)
    found, damaged = [], []
    if runs_dir.is_dir():
        for entry in sorted(runs_dir.iterdir()):
            if (entry / RECORD_FILE).is_file():
                try:
                    found.append(load_record(entry))
                except RecordError as exc:
                    damaged.append(str(exc))
    return sorted(found, key=lambda r: (r.started, r.run_id)), damaged


def find_run(runs_dir: Path, run_id: str | None,
             records: list[RunRecord] | None = None) -> Path:
    """The directory of run `run_id` (a unique prefix will do), or of the newest run.
    `records`: the readable ones, when the caller has read them already."""
    _check_is_dir(runs_dir)
    # A submitted run (run/submitted.py) is found by its id before its record is written.
    if run_id and RUN_ID.match(run_id) and any((runs_dir / run_id / name).is_file()
                                               for name in (RECORD_FILE, localdir.SLURM_JOB)):
        return runs_dir / run_id
    if records is None:
        records = list_records(runs_dir)
    if run_id:
        matches = [r.run_id for r in records if r.run_id.startswith(run_id)]
        if len(matches) == 1:
            return runs_dir / matches[0]
        if matches:
            raise RecordError(f"run {run_id!r} is ambiguous in {runs_dir}: {', '.join(matches)}")
        raise RecordError(f"no run {run_id!r} in {runs_dir} "
                          f"(see: {command('runs')} --runs-dir {runs_dir})")
    if not records:
        raise RecordError(f"no runs recorded in {runs_dir}")
    return runs_dir / records[-1].run_id


def _check_is_dir(runs_dir: Path) -> None:
    if runs_dir.exists() and not runs_dir.is_dir():
        raise RecordError(f"runs directory {runs_dir} is not a directory")


class FollowLock:
    """One controller at a time writes a run's local logs: a second one would append the same
    bytes again. An flock is released by the kernel when its holder dies, even by SIGKILL."""

    def __init__(self, run_dir: Path):
        self.path = run_dir / localdir.FOLLOW_LOCK
        self.file = None

    def acquire(self) -> bool:
        self.file = open(self.path, "a+")
        try:
            fcntl.flock(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.file.close()
            self.file = None
            return False
        return True

    @classmethod
    def inherited(cls, run_dir: Path, fd: int) -> "FollowLock":
        """The lock as held through `fd`, the same open file as the holder that passed it
        (a background controller's, run/background.py): held all along, never free between."""
        lock = cls(run_dir)
        lock.file = os.fdopen(fd, "a+")
        return lock

    def release(self) -> None:
        if self.file:
            self.file.close()
            self.file = None


def _planned(plan: RunPlan, log_starts: Mapping[int, int]) -> dict:
    return {"hosts": tuple(hp.host for hp in plan.hosts),
            "run_dirs": tuple(hp.run_dir for hp in plan.hosts),
            "tasks": tuple(RecordedTask(t.index, t.name, t.host.name, t.port, t.endpoint,
                                        t.role, log_start=log_starts.get(t.index, 0))
                           for t in plan.tasks)}


def _task(fields: dict, fail) -> RecordedTask:
    """A recorded task, its log_start checked: one edited out of shape is refused here, not
    met by a TypeError while the logs are read."""
    task = RecordedTask(**fields)
    start = task.log_start
    if isinstance(start, bool) or not isinstance(start, int) or start < 0:
        raise fail(f"task {task.name!r}: 'log_start' must be a whole number of bytes")
    return task


def _number(value, field: str, fail) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise fail(f"{field!r} must be a number")
    return float(value)


def _options(fields: dict) -> Options:
    return Options(payload=fields["payload"], entry=fields["entry"], args=tuple(fields["args"]),
                   grace=float(fields["grace"]),
                   requirements_sha256=fields["requirements_sha256"])


def _stored(value):
    """The resolved SSH logins (Hop) and the data source (with its tree hash: the same
    TFDEPLOY_DATA_DIR on re-plan) as plain mappings; everything else is JSON already."""
    if isinstance(value, DataSource):
        return value.document()
    if isinstance(value, Hop):
        return dataclasses.asdict(value)
    if isinstance(value, tuple) and value and isinstance(value[0], Hop):
        return [dataclasses.asdict(hop) for hop in value]
    return value


def _hop(fields: dict) -> Hop:
    """A recorded login; lists back to tuples (a field a record predates keeps its default)."""
    hop = Hop(**{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})
    if not (isinstance(hop.name, str) and isinstance(hop.hostname, str)
            and isinstance(hop.port, int) and not isinstance(hop.port, bool)
            and 1 <= hop.port <= 65535 and isinstance(hop.user, (str, _OPTIONAL))
            and all(isinstance(f, str) for f in hop.identity_files)):
        raise TypeError(f"SSH login {fields!r} is out of shape")
    return hop


def _host(fields: dict) -> Host:
    """A host as recorded: the same resolved logins and gateways, whatever the ssh config
    says now. (A record written before a field existed gets that field's default.)"""
    for key, value in fields.items():
        kind = _HOST_TYPES[key]
        if not isinstance(value, kind) or (isinstance(value, bool) and bool not in kind):
            raise TypeError(f"host field {key!r} cannot be {value!r}")
    workers, workdir = fields.get("workers", 1), fields.get("workdir", Host.workdir)
    if not 1 <= workers <= MAX_WORKERS_PER_HOST:
        raise ValueError(f"host field 'workers' cannot be {workers!r}")
    if fields.get("role", "worker") not in ROLES:
        raise ValueError(f"host field 'role' cannot be {fields['role']!r}")
    problem = workdir_problem(workdir)
    if problem:
        raise ValueError(f"host field 'workdir' {problem}")
    gpus, target = fields.get("gpus"), fields.get("target")
    return Host(**{**fields, "gpus": tuple(gpus) if isinstance(gpus, list) else gpus,
                   "data": DataSource.of(fields.get("data")),
                   "target": _hop(target) if target else None,
                   "via": tuple(_hop(h) for h in fields.get("via") or ())})
