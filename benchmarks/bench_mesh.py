"""The mesh check at scale without SSH: N mesh probes (deploy/host/probe.py `mesh`, not
driven), each a process of its own as an agent runs it, each listening on a port of
127.0.0.1 and dialing every other one's: N * (N - 1) check connections on this machine, as a
lab of N hosts makes them. Prints each repeat's wall time and the CPU the probes spent (user
and system), and their medians; every probe must reach every other one and answer every other one.

Run it in two checkouts side by side to compare two versions of probe.py:

    python benchmarks/bench_mesh.py [--repeats 3] [--probes 64 256]
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

from bench_train import REPO

sys.path.insert(0, str(REPO))
from deploy.host.probe import free_ports  # noqa: E402

# Each probe: this checkout's probe.py, its answer reduced to (connections that answered,
# callers it answered).
PROBE = ("import json, sys; sys.path.insert(0, sys.argv[2]); from deploy.host import probe; "
         "r = probe.mesh(json.loads(sys.argv[1])); "
         "print(sum(1 for c in r['connects'] if c.get('ok')), sum(r['accepted'].values()))")


def mesh_once(count: int) -> tuple[float, float, float]:
    """One mesh of `count` probes: (wall seconds, user and system CPU-seconds)."""
    ports = free_ports(count)
    names = [f"h{i}" for i in range(count)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    procs = []
    for name, port in zip(names, ports):
        spec = {"host": name, "nonce": "bench", "window": 60, "attempt": 5,
                "listen": {str(port): count - 1},
                "targets": [["127.0.0.1", p, n] for n, p in zip(names, ports) if n != name]}
        procs.append(subprocess.Popen([sys.executable, "-I", "-S", "-c", PROBE,
                                       json.dumps(spec), str(REPO)], stdout=subprocess.PIPE))
    answers = [p.communicate()[0].decode().split() for p in procs]
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    # A caller that gave up on a late answer and dialed again is answered twice: more
    # callers answered than there are peers is no failure.
    failed = [(n, a) for n, a in zip(names, answers)
              if len(a) != 2 or int(a[0]) != count - 1 or int(a[1]) < count - 1]
    if failed:
        raise SystemExit(f"{len(failed)} probe(s) did not reach or hear from every other one "
                         f"(connected, accepted): {failed[:3]}")
    return wall, after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--probes", type=int, nargs="+", default=[64, 256])
    opts = parser.parse_args()
    for count in opts.probes:
        runs = [mesh_once(count) for _ in range(opts.repeats)]
        for what, i in (("wall", 0), ("user", 1), ("system", 2)):
            print(f"{count} probes, {count * (count - 1)} connections, {what}: "
                  + " ".join(f"{r[i]:.2f}" for r in runs)
                  + f" s; median {statistics.median(r[i] for r in runs):.2f} s", flush=True)


if __name__ == "__main__":
    main()
