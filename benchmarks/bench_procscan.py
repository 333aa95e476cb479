"""What finding escaped processes costs a teardown: one pass over /proc that reads every
process's environment (deploy/host/teardown.py run_processes), against the pass a
group-only check made before, which read each process's stat and the environment only of
its group's members. Teardown makes one pass per 50 ms while it waits, and one per round.

    python benchmarks/bench_procscan.py [--repeats 200] [--processes 0]

--processes N starts N more processes (`sleep`, each with this environment) for the time of the
measurement, as a host shared by many users or a lab of many hosts on one machine has them.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from deploy.host.teardown import run_processes  # noqa: E402


def stat_pass(pgid: int) -> int:
    """The group-only baseline: every process's stat, no environment (no member matches)."""
    members = 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name, "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            members += int(fields[2]) == pgid
        except (OSError, IndexError, ValueError):
            continue
    return members


def timed(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--processes", type=int, default=0)
    opts = parser.parse_args()
    more = [subprocess.Popen(["sleep", "3600"]) for _ in range(opts.processes)]
    try:
        count = sum(1 for n in os.listdir("/proc") if n.isdigit())
        baseline = timed(lambda: stat_pass(-1), opts.repeats)
        scan = timed(lambda: run_processes("20260101-000000-nobody"), opts.repeats)
    finally:
        for proc in more:
            proc.kill()
            proc.wait()
    print(f"{count} processes on this machine, uid {os.geteuid()}; median of {opts.repeats}")
    print(f"  group-only pass (stat):        {baseline * 1e3:.2f} ms")
    print(f"  run id pass (stat + environ):  {scan * 1e3:.2f} ms  ({scan / baseline:.1f}x)")


if __name__ == "__main__":
    main()
