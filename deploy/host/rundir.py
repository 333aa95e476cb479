"""Reading and writing the small JSON files of a run directory (deploy/host/layout.py)."""
import json
import os

from deploy.host.layout import RUN_FILE, in_run
from deploy.host.hosterror import HostError


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def write_atomic(path, data):
    """Write `data` (text or bytes) beside `path` and rename it into place: a reader sees the
    old file or the new one. The temporary name is this writer's own (pid and random), so two
    writers of one path (hosts sharing a workdir, two controllers sharing a runs directory)
    never rename each other's half-written file; it ends in .tmp, never in the final name's
    suffix."""
    tmp = "%s.%d.%s.tmp" % (path, os.getpid(), os.urandom(4).hex())
    try:
        with open(tmp, "wb" if isinstance(data, bytes) else "w") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_json_atomic(path, doc):
    write_atomic(path, json.dumps(doc))


def run_id_of(rundir):
    doc = read_json(in_run(rundir, RUN_FILE))
    if not doc or not doc.get("run_id"):
        raise HostError("not a tfdeploy run directory: %s" % rundir)
    return doc["run_id"]
