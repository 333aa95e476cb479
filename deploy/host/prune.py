"""Host side of `inv prune`: free what no run needs any more, inside the workdir's own layout.

    prune(WORKDIR, HOST, KEEP, AGE, dry)   KEEP (JSON with the request): {"files": [sha256...],
                               "runs": [run id...], "requirements": [sha256...]}, what the
                               controller knows is needed (the current payload, the runs it
                               has records of, and the requirements.txt files of both)

A run directory is deleted when it is not kept, holds no live process here, none of its tasks
may still run on another host sharing the workdir (a task without an exit file that is not
this host's), and nothing in it changed for AGE seconds. A cached file goes when no kept run's
manifest names it, the controller does not keep it, and nothing else links it (a data tree or
a payload: deleting it would free nothing). An environment goes unless it was built from kept
requirements, whichever host built it: hosts sharing the workdir each have their own
(envkey.py), and a run of another host may need its own.

Only names of the layout are touched (run ids with their run.json, sha256 file names,
environment names); symbolic links are never followed. The answer says per kind what went (or
would go, with `dry`): counts, and the bytes really freed (a file counts once all its names
go: Freed). Hosts sharing the workdir may prune while others push: the deletions happen under
the cache's pruning lock (cache.pruning_lock).
"""
import collections
import os
import re
import shutil
import stat
import time

from deploy.host.cache import HEX64, pruning_lock
from deploy.host.probe import unsafe_workdir
from deploy.host.envkey import ENV_NAME, built_from
from deploy.host.layout import (
    BUILD_PID, CACHE, DATA_MANIFEST, ENVS, MANIFEST, RUN_FILE, RUN_ID, RUNS, task_file, task_keys
)
from deploy.host.hosterror import HostError
from deploy.host.rundir import read_json
from deploy.host.share import member_tasks
from deploy.host.teardown import live_groups

# How earlier versions of tfdeploy named environments: freed, since nothing looks for them.
OLD_ENV_NAME = re.compile(r"^[0-9a-f]{16}$")
KINDS = ("runs", "files", "envs")


class Freed:
    """What a prune frees, counted per file (inode) rather than per name: the payload in a run
    directory is hard links into the cache, so deleting a run directory frees its payload's
    bytes only when their cached names go too. A file counts, for the kind of its last name
    seen (cached files after run directories: the content is the cache's), once every one of
    its names is among those going."""

    def __init__(self):
        self.names = collections.Counter()     # (device, inode) -> names of it going
        self.stats, self.kinds = {}, {}
        self.counts = collections.Counter()    # kind -> entries going (runs, files, envs)

    def going(self, kind, path):
        """`path` (a file, or a directory with everything in it) goes, as one `kind`."""
        self.counts[kind] += 1
        for name in _files_under(path):
            try:
                st = os.lstat(name)
            except OSError:
                continue
            key = (st.st_dev, st.st_ino)
            self.names[key] += 1
            self.stats[key], self.kinds[key] = st, kind

    def other_names(self, st):
        """How many names of the file `st` stay (that are not going)."""
        return st.st_nlink - self.names[(st.st_dev, st.st_ino)]

    def report(self):
        freed = {kind: {"count": self.counts[kind], "bytes": 0} for kind in KINDS}
        for key, st in self.stats.items():
            if self.names[key] >= st.st_nlink:
                freed[self.kinds[key]]["bytes"] += st.st_size
        return freed


def _files_under(path):
    if not os.path.isdir(path) or os.path.islink(path):
        yield path
        return
    for folder, _, files in os.walk(path):
        for name in files:
            yield os.path.join(folder, name)


def newest_change(path):
    """The latest mtime of the directory and anything in it."""
    newest = os.lstat(path).st_mtime
    for folder, dirs, files in os.walk(path):
        for name in dirs + files:
            try:
                newest = max(newest, os.lstat(os.path.join(folder, name)).st_mtime)
            except OSError:
                pass
    return newest


def maybe_live(rundir, run_id, host):
    """Whether a process of the run may still be running: here (checked in /proc), or on
    another host sharing the workdir (a task of another host that has not recorded its exit:
    that host alone can tell)."""
    mine = {str(t) for t in member_tasks(rundir, host) or []}
    pid_files = [(None, os.path.join(rundir, BUILD_PID))] + [
        (task, task_file(rundir, task, "pid")) for task in task_keys(os.listdir(rundir), "pid")]
    alive = None                 # one look at /proc for the run, once a pid file asks for it
    for task, path in pid_files:
        info = read_json(path)
        if info:
            alive = alive or live_groups(run_id)
            if alive(info["pgid"]):
                return True
        if task is not None:
            ended = os.path.exists(task_file(rundir, task, "exit"))
            if not ended and task not in mine:
                return True
    return False


def run_dirs(workdir):
    """(run id, path) of the directories under runs/ that are provably run directories."""
    runs = os.path.join(workdir, RUNS)
    if not os.path.isdir(runs) or os.path.islink(runs):
        return []
    found = []
    for name in sorted(os.listdir(runs)):
        path = os.path.join(runs, name)
        if (RUN_ID.match(name) and not os.path.islink(path) and os.path.isdir(path)
                and (read_json(os.path.join(path, RUN_FILE)) or {}).get("run_id") == name):
            found.append((name, path))
    return found


def needed_files(rundir):
    needed = set()
    for name in [MANIFEST] + [n for n in os.listdir(rundir) if DATA_MANIFEST.match(n)]:
        doc = read_json(os.path.join(rundir, name)) or {}
        needed.update(entry[1] for entry in doc.get("files", []))
    return needed


def prune(workdir, host, keep, age, dry, now=None):
    workdir = os.path.expanduser(workdir)
    problem = unsafe_workdir(workdir)
    if problem:
        raise HostError(problem)
    now = time.time() if now is None else now
    if dry:                    # deletes nothing, so races with nothing, and writes no lock
        return _prune(workdir, host, keep, age, True, now)
    # Exclusive against pushes (cache.pruning_lock): every push that already counted on a
    # cached file has its manifest in its run directory, seen here; none counts on one while
    # this prune deletes.
    with pruning_lock(os.path.join(workdir, CACHE), exclusive=True):
        return _prune(workdir, host, keep, age, False, now)


def _prune(workdir, host, keep, age, dry, now):
    freed, gone = Freed(), []
    needed = set(keep.get("files", []))
    for run_id, path in run_dirs(workdir):
        if (run_id in keep.get("runs", []) or maybe_live(path, run_id, host)
                or now - newest_change(path) < age):
            needed |= needed_files(path)
            continue
        freed.going("runs", path)
        gone.append(path)
    files = os.path.join(workdir, CACHE, "files")
    for name in sorted(os.listdir(files)) if os.path.isdir(files) else []:
        path = os.path.join(files, name)
        st = os.lstat(path)
        # A file linked elsewhere too (a data tree, a kept payload) would free nothing.
        if not HEX64.match(name) or name in needed or not stat.S_ISREG(st.st_mode) \
                or freed.other_names(st) > 1:
            continue
        freed.going("files", path)
        gone += [path, os.path.join(workdir, CACHE, "verified", name)]
    envs = os.path.join(workdir, ENVS)
    for name in sorted(os.listdir(envs)) if os.path.isdir(envs) else []:
        path = os.path.join(envs, name)
        if not (ENV_NAME.match(name) or OLD_ENV_NAME.match(name)) \
                or built_from(name, keep.get("requirements", [])) or os.path.islink(path) \
                or not os.path.isdir(path):
            continue
        freed.going("envs", path)
        gone.append(path)
    if not dry:
        for path in gone:
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
    return freed.report()
