"""Where everything lives on a host: the one home of workdir and run-directory names.

    <workdir>/runs/<run-id>/        one run's directory (RUNS); deleted by its teardown
        run.json                    {"run_id": ...}: whose directory this is
        hosts/<host>.json           {"tasks": [...]}: one per inventory host using the directory
                                    (several when hosts share the workdir, e.g. an NFS home);
                                    the last host whose teardown ends deletes the directory
        tfdeploy-host.zip           this package, run as `python -I tfdeploy-host.zip VERB ...`
        manifest.json               what payload/ must hold
        payload/                    the training program, assembled from the cache
        output/  backup/            TFDEPLOY_OUTPUT_DIR, TFDEPLOY_BACKUP_DIR of the tasks
        worker-<i>.log .pid .exit   task i's output, supervisor and exit code
        build.pid                   the running step of `inv setup` (pip)
    <workdir>/cache/files/<sha256>  content cache of payload and data files (kept)
    <workdir>/data/<tree sha256>    a pushed data directory (kept)
    <workdir>/envs/<key>/           an environment built by `inv setup` (kept)
    <workdir>/filesystem.json       {"id", "inode"}: the same id on every host that shares the
                                    workdir's filesystem, so that such hosts get one push

Everything is created with umask 077: nothing here is readable or writable by others.

Paths are joined with "/" so that a leading `~/` stays for the host's shell to expand.
"""

RUNS = "runs"
CACHE = "cache"
DATA = "data"
ENVS = "envs"

HOST_ZIP = "tfdeploy-host.zip"
RUN_FILE = "run.json"
MANIFEST = "manifest.json"
DATA_MANIFEST = "data-manifest.json"
REQUIREMENTS = "requirements.txt"
PAYLOAD = "payload"
OUTPUT = "output"
BACKUP = "backup"
HOSTS = "hosts"
FILESYSTEM = "filesystem.json"
INLINE = "inline"            # small payload files sent with the manifest: inline/<sha256>
BUILD_PID = "build.pid"
ENV_BUILD = "env-build"
ENV_REPLACED = "env-replaced"
WHEELHOUSE = "wheelhouse"
TASK_PREFIX = "worker-"


def run_dir(workdir, run_id):
    return "%s/%s/%s" % (workdir, RUNS, run_id)


def cache_dir(workdir):
    return "%s/%s" % (workdir, CACHE)


def data_dir(workdir, tree):
    return "%s/%s/%s" % (workdir, DATA, tree)


def env_dir(workdir, key):
    return "%s/%s/%s" % (workdir, ENVS, key)


def task_name(task):
    return "%s%s" % (TASK_PREFIX, task)


def task_file(rundir, task, kind):
    """worker-<task>.<kind>: kind is log, pid or exit."""
    return "%s/%s.%s" % (rundir, task_name(task), kind)


def in_run(rundir, name):
    return "%s/%s" % (rundir, name)


def member_file(rundir, host):
    """hosts/<host>.json: the inventory host `host` uses this run directory."""
    return "%s/%s/%s.json" % (rundir, HOSTS, host)
