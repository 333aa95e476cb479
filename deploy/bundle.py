"""The bytes pushed to every host: payload, agent and the run's identity, as one tar.gz."""
from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path

from .planner import AGENT_FILE, PAYLOAD_DIR

AGENT_SOURCE = Path(__file__).with_name("agent.py")
SKIPPED = {"__pycache__", ".git", ".ipynb_checkpoints"}


class BundleError(ValueError):
    pass


def payload_files(payload: Path) -> list[Path]:
    """Regular files of the payload, symlinks inside it followed (hosts get their content);
    a symlink leaving the payload is refused."""
    root = payload.resolve()
    files = []
    for dirpath, dirnames, filenames in os.walk(payload, followlinks=True):
        here = Path(dirpath)
        dirnames[:] = sorted(d for d in dirnames if d not in SKIPPED)
        for name in [*dirnames, *filenames]:
            path = here / name
            if path.is_symlink() and not _inside(path.resolve(), root):
                raise BundleError(f"{path}: symlink points outside the payload ({path.resolve()})")
        if here != payload and here.is_symlink() and _inside(root, here.resolve()):
            raise BundleError(f"{here}: symlink loops back into the payload")
        for name in sorted(filenames):
            path = here / name
            if path.suffix != ".pyc" and path.is_file():
                files.append(path.relative_to(payload))
    return sorted(files)


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def build_bundle(payload: Path, entry: str, run_id: str) -> bytes:
    if not payload.is_dir():
        raise BundleError(f"payload directory {payload} does not exist")
    entry_path = payload / entry
    if not _inside(entry_path.resolve(), payload.resolve()) or not entry_path.is_file():
        raise BundleError(f"entry script {entry!r} not found in payload {payload}")
    buf = io.BytesIO()
    # dereference: a symlink inside the payload arrives as the file it points to.
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=1, dereference=True) as tar:
        _add_bytes(tar, "run.json", json.dumps({"run_id": run_id}).encode())
        tar.add(AGENT_SOURCE, arcname=AGENT_FILE)
        for rel in payload_files(payload):
            tar.add(payload / rel, arcname=f"{PAYLOAD_DIR}/{rel.as_posix()}", recursive=False)
    return buf.getvalue()


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))
