"""The `data: {local: DIR}` push as the controller runs it: hash each data directory here
(remembered hashes: unchanged large files are not read again), name it by the hash of its
manifest, and give each host that lacks that tree exactly the contents its cache lacks. The
host keeps the assembled tree in <workdir>/data/<tree sha256> (deploy/host/datatree.py), so a run
with the same data finds it there and nothing travels or is copied.

Everything local (missing files, symlinks out of a data directory) is checked before any
host is touched; errors name the inventory file, the host and the field.
"""
from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import tarfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path


from deploy.host.layout import data_manifest
from deploy.inventory.model import Host, Inventory, InventoryError
from deploy.plan.planner import HostPlan, RunPlan
from deploy.push.bundle import (
    BundleError, FileEntry, FileStream, SharedStreams, add_bytes, file_entry, manifest_document,
    payload_files
)
from deploy.push.hashcache import HashCache
from deploy.push.payload import Status, Tell, refuse_without_room, size_text
from deploy.cluster.session import Session


@dataclass(frozen=True)
class DataTree:
    root: Path
    files: tuple[FileEntry, ...]
    manifest: bytes          # the exact bytes whose sha256 names the tree on the hosts

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.manifest).hexdigest()

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    @classmethod
    def of(cls, root: Path, hashes: HashCache, walked: list[Path] | None = None) -> "DataTree":
        """The tree of `root`, its files hashed (`walked`: its files, when already listed)."""
        if walked is None:
            walked = payload_files(root, what="data directory")
        files = tuple(file_entry(root, rel, hashes) for rel in walked)
        return cls(root, files, json.dumps(manifest_document(files)).encode())

    def stage(self) -> bytes:
        """The data step's tar.gz: the manifest, into the run dir under the tree's name."""
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=1) as tar:
            add_bytes(tar, data_manifest(self.sha256), self.manifest)
        return buf.getvalue()


def local_data(inventory: Inventory) -> dict[str, tuple[Host, list[Path]]]:
    """Every local data directory of the inventory (walked once however many hosts use it),
    the first host that uses it, and its files; InventoryError naming the file, the host and
    the field for what would stop its push. A dry run checks the data through here too."""
    found: dict[str, tuple[Host, list[Path]]] = {}
    for host in inventory.hosts:
        data = host.data
        if data is None or data.kind != "local" or data.path in found:
            continue
        with _located(inventory, host):
            found[data.path] = host, payload_files(Path(data.path), what="data directory")
    return found


@contextmanager
def _located(inventory: Inventory, host: Host):
    try:
        yield
    except (BundleError, OSError) as exc:
        raise InventoryError(inventory.path, f"local: {exc}", host=host.name,
                             field="data") from None


class DataPush:
    """Every local data directory of the inventory, hashed once however many hosts use it."""

    def __init__(self, inventory: Inventory, hash_cache: Path | None = None,
                 walked: dict[str, tuple[Host, list[Path]]] | None = None):
        """`walked`: local_data(inventory), when it was already called."""
        # Saved only after a push that reached every host (as the payload's hashes are).
        self.hashes = HashCache(hash_cache)
        self.trees: dict[str, DataTree] = {}
        if walked is None:
            walked = local_data(inventory)
        for path, (host, files) in walked.items():
            with _located(inventory, host):
                self.trees[path] = DataTree.of(Path(path), self.hashes, files)
        self.streams = SharedStreams()

    def resolved(self, inventory: Inventory) -> Inventory:
        """The inventory with each local data source named by its tree's hash, which gives the
        planner every host's TFDEPLOY_DATA_DIR."""
        hosts = tuple(h if h.data is None or h.data.kind != "local" else dataclasses.replace(
            h, data=dataclasses.replace(h.data, tree=self.trees[h.data.path].sha256))
            for h in inventory.hosts)
        return dataclasses.replace(inventory, hosts=hosts)

    def bytes_for(self, host: Host) -> int:
        """What the push of `host`'s local data directory may write there (0: none)."""
        data = host.data
        return self.trees[data.path].size if data is not None and data.kind == "local" else 0

    def content(self, tree: DataTree, wanted: frozenset[str]) -> FileStream:
        return self.streams.get(tree.root, tree.files, wanted)

    def summary(self, plans: list[HostPlan], answers: dict[str, dict]) -> str:
        """`data: 3 of 40 file(s) new (1.2 MiB) → 2 of 2 host(s)`: contents some host lacked,
        counted once per data directory."""
        total = new = size = 0
        for path, tree in self.trees.items():
            lacking = set().union(*(set(answers[hp.host.name]["missing"]) |
                                    set(answers[hp.host.name]["received"])
                                    for hp in plans if hp.host.data.path == path))
            total += len(tree.files)
            new += sum(1 for f in tree.files if f.sha256 in lacking)
            size += sum({f.sha256: f.size for f in tree.files if f.sha256 in lacking}.values())
        # A host sharing a workdir with another that pushes the same tree is sent nothing.
        receivers = sum(1 for a in answers.values()
                        if not a.get("shared_with") and (a["missing"] or a["received"]))
        return (f"data: {new} of {total} file(s) new ({size_text(size)}) → "
                f"{receivers} of {len(answers)} host(s)")

    def send(self, session: Session, plan: RunPlan, status: Status, tell: Tell) -> dict:
        """Push every host's local data; returns the record of what each host was sent (and
        where each host's TFDEPLOY_DATA_DIR is, remote ones included). `status` and `tell`
        as for the payload (payload.py)."""
        plans = [hp for hp in plan.hosts if hp.data_push is not None]
        answers: dict[str, dict] = {}
        if plans:
            stages = {path: tree.stage() for path, tree in self.trees.items()}
            size = sum(tree.size for tree in self.trees.values())
            with status(f"data: {len(self.trees)} dir(s), {size_text(size)}; asking "
                        f"{len(plans)} host(s) what they lack…") as shown:
                def on_answers(wants: dict[str, dict]) -> None:
                    refuse_without_room(plans, wants, {f.sha256: f.size for t in self.trees.values()
                                                       for f in t.files}, "data")
                    tell(self.summary(plans, wants))
                    shown.update("data: sending and assembling on every host…")
                answers = session.push(
                    plans, "data", lambda hp: hp.data_push,
                    lambda hp: stages[hp.host.data.path],
                    lambda hp, wanted: self.content(self.trees[hp.host.data.path], wanted),
                    on_answers, group=lambda hp: hp.host.data.tree)
            self.hashes.save()
        record = {}
        for hp in plan.hosts:
            if hp.data_dir is None:
                continue
            record[hp.host.name] = {"source": hp.host.data.shown, "dir": hp.data_dir}
            answer = answers.get(hp.host.name)
            if answer is not None:
                record[hp.host.name].update(
                    tree=hp.host.data.tree, files=answer["files"], present=answer["present"],
                    missing=answer["missing"], received=answer["received"],
                    bytes=answer.get("bytes", 0))
                if answer.get("shared_with"):
                    record[hp.host.name]["shared_with"] = answer["shared_with"]
        return {"hosts": record}
