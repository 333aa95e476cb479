"""The verbs of the host package: `python -I tfdeploy-host.zip VERB RUNDIR ARGS...`.

Each verb prints one JSON document on stdout (setup: a stream of JSON lines; follow: a stream
of frames, frames.py).
    launch RUNDIR TASK CWD [PY] -- ARGV...  environment as JSON on stdin; starts the task
                                        detached (ARGV[0] becomes PY where that exists)
    supervise RUNDIR TASK -- ARGV...    (internal) runs ARGV, records its exit code
    poll RUNDIR TASK:OFFSET...          state, exit code and new log bytes of tasks
    follow RUNDIR TASK:OFFSET...        the same as a stream, one frame per change, until
                                        every task has ended; takes `stop GRACE` on stdin
    stop RUNDIR GRACE                   TERM every task's group (and setup's pip), KILL later
    cleanup RUNDIR GRACE [HOST]         stop, then delete the run directory once no other host
                                        sharing it (the same workdir) uses it
    push|want|receive RUNDIR CACHE [HOST TASKS]   the payload from the content cache (cache.py)
    data-push|data-want|data-receive RUNDIR DATADIR CACHE   a data directory (data.py)
    envstatus|setup RUNDIR ENVDIR [wheelhouse]              inv setup's environment (env.py)
"""
import json
import os
import sys

from deploy.host import agent, cache, data, env, teardown
from deploy.host.layout import task_key_of, task_name


def task_arg(task):
    """A task key as the controller sends it (layout.task_key), refused when it is none: it
    becomes a file name in the run directory."""
    if task_key_of(task_name(task)) != task:
        raise SystemExit("not a task: %r" % task)
    return task


def parse_offsets(requests):
    return {task_arg(task): int(offset)
            for task, offset in (item.split(":") for item in requests)}


def main(argv):
    # Nothing the tool makes on a host is for other users' eyes: run dirs, logs, the cache.
    os.umask(0o077)
    verb, args = argv[0], argv[1:]
    rest = args[args.index("--") + 1:] if "--" in args else []
    if verb == "launch":
        before = args[:args.index("--")] if "--" in args else args
        out = agent.launch(args[0], task_arg(args[1]), args[2], rest, before[3] if len(before) > 3 else None)
    elif verb == "supervise":
        agent.supervise(args[0], task_arg(args[1]), rest)
        out = None
    elif verb == "poll":
        out = agent.poll(args[0], parse_offsets(args[1:]))
    elif verb == "follow":
        try:
            out = agent.follow(args[0], parse_offsets(args[1:]))
        except BrokenPipeError:
            os._exit(0)
    elif verb == "stop":
        out = teardown.stop(args[0], float(args[1]))
    elif verb == "cleanup":
        out = teardown.cleanup(args[0], float(args[1]), *args[2:3])
    elif verb in ("push", "want", "receive"):
        out = cache.main(verb, args)
    elif verb in ("data-push", "data-want", "data-receive"):
        out = data.main([verb[len("data-"):]] + args)
    elif verb in ("envstatus", "setup"):
        out = env.main(verb, args)
    else:
        raise SystemExit("unknown verb %r" % verb)
    if out is not None:
        sys.stdout.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
