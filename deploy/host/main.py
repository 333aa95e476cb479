"""The verbs of the host package as a program of its own: `python -I tfdeploy-host.zip VERB
RUNDIR ARGS...`, for what runs apart from the run's agent (agent.py, which takes every step of
a run as a request): the supervisor of each task, and the steps of `inv setup`.

Each verb prints one JSON document on stdout (setup: a stream of JSON lines).
    supervise RUNDIR TASK -- ARGV...    (internal) runs ARGV, records its exit code
    cleanup RUNDIR GRACE [HOST]         stop, then delete the run directory once no other host
                                        sharing it (the same workdir) uses it
    envstatus RUNDIR                    whether inv setup's environment for the run
                                        directory's requirements.txt is ready on this host
    setup RUNDIR HOST [wheelhouse]      build it, once for hosts sharing the workdir (venv.py,
                                        envkey.py)
"""
import json
import os
import sys

from deploy.host import tasks, teardown, venv
from deploy.host.layout import checked_task_key
from deploy.host.protocol import HostError


def main(argv):
    try:
        run_verb(argv)
    except HostError as exc:      # a program's error: its words on stderr, exit status 1
        raise SystemExit(str(exc)) from None


def run_verb(argv):
    # Nothing the tool makes on a host is for other users' eyes: run dirs, logs, the cache.
    os.umask(0o077)
    verb, args = argv[0], argv[1:]
    rest = args[args.index("--") + 1:] if "--" in args else []
    if verb == "supervise":
        tasks.supervise(args[0], checked_task_key(args[1]), rest)
        out = None
    elif verb == "cleanup":
        out = teardown.cleanup(args[0], float(args[1]), *args[2:3])
    elif verb in ("envstatus", "setup"):
        out = venv.main(verb, args)
    else:
        raise HostError("unknown verb %r" % verb)
    if out is not None:
        sys.stdout.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
