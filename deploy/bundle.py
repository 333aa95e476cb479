"""The bytes pushed to every host: payload, agent and the run's identity, as one tar.gz."""
from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

from .planner import AGENT_FILE, PAYLOAD_DIR

AGENT_SOURCE = Path(__file__).with_name("agent.py")
SKIPPED = {"__pycache__", ".git", ".ipynb_checkpoints"}


class BundleError(ValueError):
    pass


def payload_files(payload: Path) -> list[Path]:
    """Regular files of the payload; a symlink leaving the payload is refused."""
    root = payload.resolve()
    files = []
    for path in sorted(payload.rglob("*")):
        rel = path.relative_to(payload)
        if any(part in SKIPPED for part in rel.parts) or path.suffix == ".pyc":
            continue
        if path.is_symlink():
            target = path.resolve()
            if root not in target.parents and target != root:
                raise BundleError(f"{path}: symlink points outside the payload ({target})")
        if path.is_file():
            files.append(rel)
    return files


def build_bundle(payload: Path, entry: str, run_id: str) -> bytes:
    if not payload.is_dir():
        raise BundleError(f"payload directory {payload} does not exist")
    if not (payload / entry).is_file():
        raise BundleError(f"entry script {entry!r} not found in payload {payload}")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=1) as tar:
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
