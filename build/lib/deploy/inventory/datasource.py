"""The inventory's `data:` field: where a host's tasks find their data (TFDEPLOY_DATA_DIR).

Two forms:
    data: {local: ./shards/a}            a directory on this machine (relative to the inventory
                                         file's directory), pushed once and kept on the host
                                         by content in <workdir>/data/<tree sha256>
    data: {remote: /srv/datasets/mnist}  a directory already on the host (absolute or ~/)

Pure: parsing checks the local directory exists, nothing else; no host is asked here.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

FORMS = ("local", "remote")
DATA_DIR = "data"           # <workdir>/data/<tree sha256>: local data, outside every run dir
TREE_PLACEHOLDER = "<tree-sha256>"


@dataclass(frozen=True)
class DataSource:
    kind: str                 # "local" or "remote"
    path: str                 # local: absolute path on this machine; remote: path on the host
    given: str = ""           # as written in the inventory (shown in plans)
    tree: str | None = None   # local: sha256 of the directory's manifest, once hashed

    @property
    def shown(self) -> str:
        return f"{self.kind} {self.given or self.path}"

    def document(self) -> dict:
        return {"kind": self.kind, "path": self.path, "given": self.given, "tree": self.tree}

    @classmethod
    def of(cls, doc: dict | None) -> "DataSource | None":
        return None if doc is None else cls(**doc)


def host_data_dir(workdir: str, source: DataSource | None) -> str | None:
    """TFDEPLOY_DATA_DIR on the host: the remote path, or the local data's content-keyed
    directory below the workdir (a placeholder until the tree has been hashed)."""
    if source is None:
        return None
    if source.kind == "remote":
        return source.path
    return f"{workdir}/{DATA_DIR}/{source.tree or TREE_PLACEHOLDER}"


def parse_data(value, base: Path, fail) -> DataSource:
    """`value` as written under `data:`; `base` is the inventory file's directory; `fail`
    turns a message into the inventory's error (naming file, line, host and field)."""
    if not isinstance(value, dict) or not value:
        raise fail("must be {local: DIR} (a directory here, pushed once) or {remote: PATH} "
                   f"(a directory already on the host), not {value!r}")
    unknown = [k for k in value if k not in FORMS]
    if unknown:
        raise fail(f"unknown key {unknown[0]!r} (known: {', '.join(FORMS)})")
    if len(value) > 1:
        raise fail("give either local or remote, not both")
    (kind, path), = value.items()
    if not isinstance(path, str) or not path or "\0" in path or "\n" in path:
        raise fail(f"{kind}: must be a non-empty path, not {path!r}")
    if kind == "remote":
        if not (path.startswith("/") or path.startswith("~/")):
            raise fail(f"remote: must be absolute or start with ~/ (a path on the host), "
                       f"not {path!r}")
        if ".." in path.split("/"):
            raise fail(f"remote: must not contain '..', not {path!r}")
        return DataSource("remote", _normalized(path), given=path)
    local = Path(os.path.expanduser(path))
    local = local if local.is_absolute() else base / local
    if not local.exists():
        raise fail(f"local: directory {str(local)!r} does not exist")
    if not local.is_dir():
        raise fail(f"local: {str(local)!r} is not a directory")
    return DataSource("local", os.path.abspath(local), given=path)


def _normalized(path: str) -> str:
    parts = [p for p in path.split("/") if p not in ("", ".")]
    return ("/" if path.startswith("/") else "") + "/".join(parts)
