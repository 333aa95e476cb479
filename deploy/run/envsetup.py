"""`setup`: on every host in parallel, the virtual environment of the payload's
requirements.txt, reused when it exists, built beside the others when it does not; a live row
per host while it works and a table of the resulting versions.
"""
from __future__ import annotations

import hashlib
import io
import json
import tarfile
import threading
import time
from pathlib import Path

from deploy.host.layout import REQUIREMENTS, RUN_FILE, WHEELHOUSE
from deploy.host.protocol import SetupEvent
from deploy.inventory.model import Inventory
from deploy.plan.envbuild import HostSetup, SetupPlan, plan_setup
from deploy.push.bundle import BundleError, add_bytes
from deploy.cluster.hostagent import Reply
from deploy.plan.pythons import PythonNeed, payload_need, python_problem
from deploy.cluster.parallel import on_all
from deploy.cluster.session import Session, checked
from deploy.state.record import new_run_id
from deploy.state.envprogress import HostProgress
from deploy.state.events import Reporter, SetupDone, SetupPlanned, setup_of


def requirements_hash(payload: Path) -> str | None:
    """sha256 of the payload's requirements.txt, or None when it has none."""
    path = payload / "requirements.txt"
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def wheel_files(wheelhouse: Path) -> list[Path]:
    if not wheelhouse.is_dir():
        raise BundleError(f"wheelhouse {wheelhouse} is not a directory")
    files = sorted(p for p in wheelhouse.iterdir() if p.is_file())
    if not files:
        raise BundleError(f"wheelhouse {wheelhouse} holds no files (expected *.whl)")
    return files


def stage(run_id: str, requirements: bytes) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=1) as tar:
        add_bytes(tar, RUN_FILE, json.dumps({"run_id": run_id}).encode())
        add_bytes(tar, REQUIREMENTS, requirements)
    return buf.getvalue()


def wheel_tar(files: list[Path]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:   # wheels are zip files already
        for path in files:
            tar.add(path, arcname=f"{WHEELHOUSE}/{path.name}")
    return buf.getvalue()


def setup(inventory: Inventory, payload: Path, wheelhouse: Path | None, connect_timeout: float,
          accept_new_host_keys: bool, reporter: Reporter) -> int:
    requirements = payload / "requirements.txt"
    if not requirements.is_file():
        raise BundleError(f"{requirements} does not exist: setup installs the payload's "
                          "requirements.txt")
    wheels = wheel_files(wheelhouse) if wheelhouse else []
    data = requirements.read_bytes()
    run_id = "setup-" + new_run_id()
    plan = plan_setup(inventory, run_id, bool(wheels))
    reporter.emit(SetupPlanned(str(requirements), len(plan.hosts), len(wheels),
                               str(wheelhouse) if wheels else None,
                               tuple(h.name for h in inventory.hosts if h.own_python),
                               str(inventory.path)))
    with reporter.status(f"connecting to {len(inventory.hosts)} host(s)…"):
        session = Session.open(inventory, connect_timeout, accept_new_host_keys)
    progress = {hp.host.name: HostProgress(hp.host.name) for hp in plan.hosts}
    try:
        _run(session, plan, {hp.host.name: stage(hp.run_id, data) for hp in plan.hosts}, wheels,
             progress, reporter, payload_need(payload))
    finally:
        problems = _cleanup(session, plan)
        session.close()
    reporter.emit(SetupDone(tuple(setup_of(p) for p in progress.values()), problems))
    failed = [p for p in progress.values() if p.state == "failed"]
    return 1 if failed or problems else 0


def _run(session: Session, plan: SetupPlan, stages: dict[str, bytes], wheels: list[Path],
         progress: dict[str, HostProgress], reporter: Reporter,
         need: PythonNeed | None) -> None:
    t = session.transports
    with reporter.status("checking existing environments…"):
        status = session.ask_all("checking environments", plan.hosts, lambda hp: hp.status,
                                 timeout=120, body=lambda hp: stages[hp.host.name])
    todo = []
    for hp in plan.hosts:
        p = progress[hp.host.name]
        p.env = status[hp.host.name].env      # where this host keeps its environment
        wrong_python = python_problem(status[hp.host.name].python, need)
        if status[hp.host.name].ready:
            p.state, p.line, p.ended = "reused", "environment exists: reused", time.monotonic()
            p.versions = status[hp.host.name].versions
        elif wrong_python:
            # pip would end, minutes later, in "No matching distribution found".
            p.state, p.line, p.ended = "failed", wrong_python, time.monotonic()
        else:
            todo.append(hp)
    if wheels and todo:
        data = wheel_tar(wheels)
        with reporter.status(f"pushing the wheelhouse ({len(data) / 2**20:.1f} MiB) to "
                             f"{len(todo)} host(s)…"):
            on_all("pushing the wheelhouse", todo, lambda hp: hp.host.name,
                   lambda hp: checked(t[hp.host.name].run(hp.wheels.line, stdin=data,
                                                          timeout=1800), hp.host, "wheelhouse"))
    if todo:
        _build_all(session, todo, progress, reporter)


def _build_all(session: Session, todo: list[HostSetup], progress: dict[str, HostProgress],
               reporter: Reporter) -> None:
    """Every host's build at once, each step and pip line a frame of its answer, shown live.
    Ctrl-C leaves the loop; the cleanup that follows stops each host's pip (its recorded
    process group)."""
    lock = threading.Lock()

    def build(hp: HostSetup) -> Reply:
        p = progress[hp.host.name]
        p.state, p.started = "building", time.monotonic()

        def on_frame(event: SetupEvent) -> None:
            with lock:
                p.apply(event)

        def on_end(reply: Reply) -> None:
            with lock:
                if reply.answer is not None:
                    p.apply(reply.answer)
                else:
                    p.state, p.line = "failed", reply.error
                p.ended = time.monotonic()
        return session.agents[hp.host.name].ask(hp.build, "building the environment",
                                                on_frame=on_frame, on_end=on_end)

    replies = [build(hp) for hp in todo]
    with reporter.setup_progress(progress) as refresh:
        while not all(reply.done.is_set() for reply in replies):
            time.sleep(0.2)
            with lock:
                refresh()


def _cleanup(session: Session, plan: SetupPlan) -> dict[str, str]:
    """Delete each host's setup run directory (a failed build inside it goes too)."""
    results, errors = session.ask_each("cleanup", plan.hosts, lambda hp: hp.cleanup,
                                       timeout=120)
    problems = {name: str(error) for name, error in errors.items()}
    problems.update({name: f"processes left: {list(stopped.survivors)}"
                     for name, stopped in results.items() if stopped.survivors})
    return problems

