"""The local run record: runs/<run-id>/record.json, what a new controller needs to reach a run.

A run outlives the shell that started it, so everything needed to find its hosts and tasks
again is kept here: each host's connection fields, the run directories, ports and endpoints,
the options and the run's state. The inventory file may have changed or be gone by then.

No environment value is stored, secret or not: values are needed only to launch, and a
record that never holds any cannot leak one. Re-planning from a record gives the same run
directories, endpoints and commands (the planner is pure), with only tfdeploy's own variables.
"""
from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import time
from pathlib import Path

from deploy.errors import BadInput
from deploy.inventory.datasource import DataSource
from deploy.inventory.model import Host, Inventory
from deploy.inventory.sshconfig import Hop
from deploy.plan.planner import Options, RunPlan, plan_run

RECORD_FILE = "record.json"
LOCK_FILE = ".follow.lock"
VERSION = 1
# The connection fields of a host; `env` is deliberately not among them.
HOST_FIELDS = ("name", "address", "transport", "port", "user", "identity_file", "known_hosts",
               "host_key_policy", "python", "workdir", "cluster_address", "workers",
               "own_python", "gpus", "data", "ssh_config", "jump", "target", "via")
# States: starting, running (a controller follows it), detached, finished, interrupted, down.
ACTIVE_STATES = ("starting", "running", "detached")


class RecordError(BadInput):
    pass


def record_document(plan: RunPlan, state: str, started: float, **extra) -> dict:
    doc = {
        "version": VERSION,
        "run_id": plan.run_id,
        "started": started,
        "state": state,
        "controller_pid": os.getpid(),
        "options": {"payload": plan.options.payload, "entry": plan.options.entry,
                    "args": list(plan.options.args), "grace": plan.options.grace,
                    "requirements_sha256": plan.options.requirements_sha256,
                    "backup": plan.options.backup},
        "hosts": [{**{k: _stored(getattr(hp.host, k)) for k in HOST_FIELDS},
                   "run_dir": hp.run_dir} for hp in plan.hosts],
        "tasks": [{"index": t.index, "name": t.name, "host": t.host.name, "port": t.port,
                   "endpoint": t.endpoint} for t in plan.tasks],
    }
    doc.update(extra)
    return doc


def write_json(path: Path, doc: dict) -> None:
    """Atomically: a reader (another shell's `inv runs`) sees the old or the new file."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    os.replace(tmp, path)


def write_record(run_dir: Path, doc: dict) -> None:
    write_json(run_dir / RECORD_FILE, doc)


def update_record(run_dir: Path, **fields) -> dict:
    doc = load_record(run_dir)
    doc.update(fields)
    write_record(run_dir, doc)
    return doc


def load_record(run_dir: Path) -> dict:
    path = run_dir / RECORD_FILE
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise RecordError(f"{path}: no run record (not a run started by this version of "
                          "tfdeploy, or not a run directory)") from None
    except (OSError, ValueError) as exc:
        raise RecordError(f"{path}: unreadable run record: {exc}") from None
    if not isinstance(doc, dict) or doc.get("version") != VERSION or "run_id" not in doc:
        raise RecordError(f"{path}: not a tfdeploy run record of version {VERSION}")
    return doc


def list_records(runs_dir: Path) -> list[dict]:
    """Every readable record below `runs_dir`, oldest first."""
    found = []
    if runs_dir.is_dir():
        for entry in runs_dir.iterdir():
            if (entry / RECORD_FILE).is_file():
                try:
                    found.append(load_record(entry))
                except RecordError:
                    continue
    return sorted(found, key=lambda d: (d.get("started", 0), d["run_id"]))


def find_run(runs_dir: Path, run_id: str | None) -> Path:
    """The directory of run `run_id` (a unique prefix will do), or of the newest run."""
    if run_id:
        exact = runs_dir / run_id
        if (exact / RECORD_FILE).is_file():
            return exact
        matches = [d["run_id"] for d in list_records(runs_dir)
                   if d["run_id"].startswith(run_id)]
        if len(matches) == 1:
            return runs_dir / matches[0]
        if matches:
            raise RecordError(f"run {run_id!r} is ambiguous in {runs_dir}: {', '.join(matches)}")
        raise RecordError(f"no run {run_id!r} in {runs_dir} (see: inv runs --runs-dir {runs_dir})")
    records = list_records(runs_dir)
    if not records:
        raise RecordError(f"no runs recorded in {runs_dir}")
    return runs_dir / records[-1]["run_id"]


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
    return Hop(**{**fields, "identity_files": tuple(fields["identity_files"])})


def hosts_of(doc: dict) -> tuple[Host, ...]:
    """The hosts as recorded: the same resolved logins and gateways, whatever the ssh config
    says now. (A record written before a field existed gets that field's default.)"""
    def host(fields: dict) -> Host:
        gpus, target = fields.get("gpus"), fields.get("target")
        return Host(**{**fields, "gpus": tuple(gpus) if isinstance(gpus, list) else gpus,
                       "data": DataSource.of(fields.get("data")),
                       "target": _hop(target) if target else None,
                       "via": tuple(_hop(h) for h in fields.get("via") or ())})
    return tuple(host({k: h[k] for k in HOST_FIELDS if k in h}) for h in doc["hosts"])


def plan_of(doc: dict, where: str = "record") -> RunPlan:
    """The run's plan again, from its record: same hosts, run dirs, ports and commands."""
    opts = doc["options"]
    options = Options(payload=opts["payload"], entry=opts["entry"], args=tuple(opts["args"]),
                      grace=float(opts["grace"]),
                      requirements_sha256=opts["requirements_sha256"],
                      backup=opts["backup"])
    ports = {t["index"]: t["port"] for t in doc["tasks"]}
    plan = plan_run(Inventory(path=where, hosts=hosts_of(doc)), options, doc["run_id"], ports)
    recorded = [(t["index"], t["endpoint"]) for t in doc["tasks"]]
    if [(t.index, t.endpoint) for t in plan.tasks] != recorded:
        raise RecordError(f"{where}: its hosts and tasks do not match (edited by hand?)")
    return plan


def controller_alive(doc: dict) -> bool:
    """Whether the controller that last followed the run still runs (on this machine)."""
    pid = doc.get("controller_pid")
    if not pid or pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def shown_state(doc: dict) -> str:
    state = doc.get("state", "?")
    if state == "finished":
        return f"finished (exit {doc.get('exit_code')})"
    if state == "running" and not controller_alive(doc):
        return "running (no controller)"
    return state


class FollowLock:
    """One controller at a time writes a run's local logs: a second one would append the same
    bytes again. An flock is released by the kernel when its holder dies, even by SIGKILL."""

    def __init__(self, run_dir: Path):
        self.path = run_dir / LOCK_FILE
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

    def release(self) -> None:
        if self.file:
            self.file.close()
            self.file = None


def started_text(doc: dict) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(doc.get("started", 0)))
