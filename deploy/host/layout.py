"""Where everything lives on a host: the one home of workdir and run-directory names.

    <workdir>/runs/<run-id>/        one run's directory (RUNS); deleted by its teardown
        run.json                    {"run_id": ...}: whose directory this is
        hosts/<host>.json           {"tasks": [...]}: one per inventory host using the directory
                                    (several when hosts share the workdir, e.g. an NFS home);
                                    the last host whose teardown ends deletes the directory
        manifest.json               what payload/ must hold
        data-<tree>.json            what a data directory <workdir>/data/<tree> must hold
        payload/                    the training program, assembled from the cache
        output/  backup/            TFDEPLOY_OUTPUT_DIR, TFDEPLOY_BACKUP_DIR of the tasks
        <type>-<i>.log .pid .exit   a task's output, supervisor and exit code: worker-0,
                                    worker-1..., and chief-0, ps-0, evaluator-0 in a
                                    parameter-server cluster
        build.pid                   the running step of `inv setup` (pip)
    <workdir>/cache/files/<sha256>  content cache of payload and data files (kept)
    <workdir>/cache/agent/<python>-<hash>.code
                                    the host package's compiled code for one Python (boot.py;
                                    kept, one per Python)
    <workdir>/data/<tree sha256>    a pushed data directory (kept)
    <workdir>/envs/<name>/          an environment built by `inv setup` (kept); its name, of the
                                    requirements and the host's Python build, machine and libc,
                                    is computed on the host (envkey.py)
    <workdir>/filesystem.json       {"id", "inode"}: the same id on every host that shares the
                                    workdir's filesystem, so that such hosts get one push
    <workdir>/prune.lock            a push's use of the cache against a prune's deletions

Everything is created with umask 077: nothing here is readable or writable by others.

Paths are joined with "/" so that a leading `~/` stays for the host's shell to expand.
"""

import re

from deploy.host.hosterror import HostError

RUNS = "runs"
# What a run id looks like (the controller's new_run_id makes them): it names directories
# here and on every host, so nothing else is taken for one.
RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
CACHE = "cache"
DATA = "data"
ENVS = "envs"

RUN_FILE = "run.json"
MANIFEST = "manifest.json"
# data-<tree sha256>.json: a data tree's manifest, named by its tree (data_manifest), since
# hosts sharing a run directory may push different trees (one shard each)
DATA_MANIFEST = re.compile(r"^data-[0-9a-f]{64}\.json$")
REQUIREMENTS = "requirements.txt"
PAYLOAD = "payload"
OUTPUT = "output"
TENSORBOARD = "output/tensorboard"    # where the payload writes them (TFDEPLOY_OUTPUT_DIR/...)
BACKUP = "backup"
HOSTS = "hosts"
FILESYSTEM = "filesystem.json"
PRUNE_LOCK = "prune.lock"    # <workdir>/prune.lock (cache.pruning_lock)
INLINE = "inline"            # small payload files in the stage, inline/<sha256>: cached at once,
                             # never written into the run directory
BUILD_PID = "build.pid"
ENV_BUILD = "env-build"
ENV_REPLACED = "env-replaced"
WHEELHOUSE = "wheelhouse"
TASK_TYPES = ("chief", "worker", "ps", "evaluator")
TASK_FILE_KINDS = ("log", "pid", "exit")


def host_run_id(run_id, host):
    """The run id of `host`'s own directory of run `run_id` (inv setup's: hosts sharing a
    workdir must not build in one directory): `<run id>-<host>`, or the host's name hashed
    where that would not be a run id."""
    mine = "%s-%s" % (run_id, host)
    if RUN_ID.match(mine):
        return mine
    import hashlib      # here: every task's supervisor imports this module, and hashlib is slow
    return "%s-%s" % (run_id, hashlib.sha256(host.encode()).hexdigest()[:16])


def run_dir(workdir, run_id):
    return "%s/%s/%s" % (workdir, RUNS, run_id)


def cache_dir(workdir):
    return "%s/%s" % (workdir, CACHE)


def agent_code_dir(workdir):
    return "%s/%s/agent" % (workdir, CACHE)


def data_dir(workdir, tree):
    return "%s/%s/%s" % (workdir, DATA, tree)


def data_manifest(tree):
    """The name in the run directory of the manifest of data tree `tree` (its sha256)."""
    return "data-%s.json" % tree


def workdir_of(rundir):
    """The workdir of the run directory <workdir>/runs/<run-id>."""
    return rundir.rstrip("/").rsplit("/", 2)[0]


def task_key(task_type, index):
    """The word that names a task to the host verbs (launch, poll, follow, the members of a
    run directory): a worker's index, as it has always been, else `<type>-<index>`."""
    return str(index) if task_type == "worker" else "%s-%d" % (task_type, index)


def task_name(task):
    """`<type>-<index>` of a task key: worker-0, chief-0, ps-1... The name people see."""
    task = str(task)
    return task if "-" in task else "worker-" + task


def task_key_of(name):
    """The task key a file stem (`worker-3`, `ps-0`) names, or None for another name."""
    kind, _, index = name.rpartition("-")
    if kind not in TASK_TYPES or not index.isdigit() or index != str(int(index)):
        return None
    return task_key(kind, int(index))


def checked_task_key(task):
    """A task key as the controller sends it (task_key), refused when it is none: it becomes
    a file name in the run directory."""
    if task_key_of(task_name(task)) != task:
        raise HostError("not a task: %r" % task)
    return task


def task_keys(filenames, kind):
    """The keys of the tasks that have a `<kind>` file (log, pid, exit) among `filenames`."""
    keys = []
    for name in filenames:
        stem, dot, ext = name.rpartition(".")
        key = task_key_of(stem) if dot and ext == kind else None
        if key is not None:
            keys.append(key)
    return sorted(keys, key=lambda k: (not k.isdigit(), int(k) if k.isdigit() else 0, k))


def task_file(rundir, task, kind):
    """<type>-<index>.<kind>: kind is log, pid or exit."""
    return "%s/%s.%s" % (rundir, task_name(task), kind)


def in_run(rundir, name):
    return "%s/%s" % (rundir, name)


def member_file(rundir, host):
    """hosts/<host>.json: the inventory host `host` uses this run directory."""
    return "%s/%s/%s.json" % (rundir, HOSTS, host)
