"""Workdirs shared between hosts (an NFS home mounted on every machine): which hosts share a
filesystem, and which hosts use a run directory. (Whether a workdir is safe to write to:
probe.py, unsafe_workdir.)

Sharing is detected, not guessed from names: the first host to reach a workdir writes
filesystem.json with a random id and the workdir's inode, and every host that reads the same
file and sees the same inode is on the same filesystem (an NFS client reports the server's
inode; a copied workdir has another one).
"""
import json
import os

from deploy.host.layout import FILESYSTEM, HOSTS, member_file
from deploy.host.rundir import read_json, write_json_atomic


def filesystem_id(workdir):
    """The id of the filesystem `workdir` is on, the same on every host that shares it."""
    workdir = os.path.expanduser(workdir)
    inode = os.stat(workdir).st_ino
    path = os.path.join(workdir, FILESYSTEM)
    doc = read_json(path)
    if not doc:
        # Written beside and linked into place: link() fails when another host was first,
        # and then that host's id is the one read (atomic on NFS too).
        tmp = "%s.%s" % (path, os.urandom(8).hex())
        with open(tmp, "w") as f:
            json.dump({"id": os.urandom(16).hex(), "inode": inode}, f)
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
        finally:
            os.unlink(tmp)
        doc = read_json(path) or {}
    return doc.get("id") if doc.get("inode") == inode else None


def join(rundir, host, tasks):
    """Record that inventory host `host` (its tasks `tasks`) uses this run directory."""
    os.makedirs(os.path.join(rundir, HOSTS), exist_ok=True)
    write_json_atomic(member_file(rundir, host), {"tasks": sorted(tasks)})


def member_tasks(rundir, host):
    """The task keys (layout.task_key) of `host` in this run directory; None when no host
    joined it (a run directory of `inv setup`, whose single user owns everything in it)."""
    doc = read_json(member_file(rundir, host)) if host else None
    return None if doc is None else list(doc["tasks"])


def leave(rundir, host):
    """`host` is done with the run directory; True when no other host still uses it."""
    if host:
        try:
            os.unlink(member_file(rundir, host))
        except FileNotFoundError:
            pass
    try:
        return not any(n.endswith(".json") for n in os.listdir(os.path.join(rundir, HOSTS)))
    except FileNotFoundError:
        return True

