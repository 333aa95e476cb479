"""Reading and writing the small JSON files of a run directory (deploy/host/layout.py)."""
import json
import os

from deploy.host.layout import RUN_FILE, in_run


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def write_json_atomic(path, doc):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f)
    os.replace(tmp, path)


def run_id_of(rundir):
    doc = read_json(in_run(rundir, RUN_FILE))
    if not doc or not doc.get("run_id"):
        raise SystemExit("not a tfdeploy run directory: %s" % rundir)
    return doc["run_id"]
