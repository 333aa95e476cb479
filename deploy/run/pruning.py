"""`inv prune`: free, on every host, the cached files, environments and finished run
directories that no live run and not the current payload needs (deploy/host/prune.py decides
on the host, where the processes and files are).

Hosts are asked one after the other: hosts that share a workdir see one cache, and the first
of them frees it (the others then find nothing more to free).
"""
from __future__ import annotations

from pathlib import Path

from deploy.errors import BadInput, TfdeployError
from deploy.inventory.model import Inventory
from deploy.plan.retention import Keep, prune_request
from deploy.push.bundle import file_entry, payload_files
from deploy.push.hashcache import HashCache
from deploy.run.envsetup import requirements_hash
from deploy.cluster.session import Session
from deploy.state.events import HostPruned, PruneDone, Reporter
from deploy.state.record import list_records

KINDS = (("files", "cached file(s)"), ("envs", "environment(s)"), ("runs", "run director(ies)"))


def keep_of(payload: Path | None, runs_dir: Path) -> Keep:
    """The payload's contents and requirements, and every run a local record calls active."""
    files, requirements, runs = set(), set(), set()
    if payload is not None:
        if not payload.is_dir():
            raise BadInput(f"payload directory {payload} does not exist")
        hashes = HashCache(runs_dir / "payload-hashes.json")
        files = {file_entry(payload, rel, hashes).sha256 for rel in payload_files(payload)}
        requirements.add(requirements_hash(payload))
    for record in list_records(runs_dir):
        if record.state.active:
            runs.add(record.run_id)
            requirements.add(record.options.requirements_sha256)
    return Keep(frozenset(files), frozenset(runs), frozenset(requirements) - {None})


def prune(inventory: Inventory, payload: Path | None, runs_dir: Path, older_than: float,
          dry_run: bool, connect_timeout: float, accept_new_host_keys: bool,
          reporter: Reporter) -> int:
    keep = keep_of(payload, runs_dir)
    failed = 0
    for host in inventory.hosts:
        try:
            session, errors = Session.open_each([host], connect_timeout, accept_new_host_keys)
            try:
                if errors:
                    raise errors[host.name]
                freed = session.agents[host.name].ask(
                    prune_request(host, older_than, dry_run), "prune",
                    keep.document()).wait(600)
            finally:
                session.close()
        except TfdeployError as exc:    # reported with its host; the others are still pruned
            reporter.emit(HostPruned(host.name, dry_run, {}, str(exc)))
            failed += 1
            continue
        reporter.emit(HostPruned(host.name, dry_run, {
            label: (getattr(freed, kind).count, getattr(freed, kind).bytes)
            for kind, label in KINDS}))
    reporter.emit(PruneDone(dry_run))
    return 1 if failed else 0
