"""A log flood: two tasks on two SSH lab hosts each print N numbered 80-byte lines as fast as
they can, under `inv train` and by hand.

Per repeat, alternating: the two processes run by hand (stdout to a file, the environment
`inv train` gives a task), `inv train` of the same payload, and `inv train` of a trivial run
(one line per task) on the same hosts. Each run of `inv train` is checked: every
runs/<id>/worker-<i>.log holds exactly its task's lines, in order, none lost or duplicated.
Measured: the payload's own printing time (it times itself), the controller's peak memory
(VmHWM of the `inv` process) and its CPU seconds (from wait4). Prints medians and ratios.

    python benchmarks/bench_flood.py [--repeats 3] [--lines 200000]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from bench_train import REPO, line

sys.path.insert(0, str(REPO / "tests"))
from sshlab import SshLab  # noqa: E402

FLOOD = """\
import os, sys, time
lines, task = int(sys.argv[1]), int(os.environ["TFDEPLOY_TASK_INDEX"])
started = time.perf_counter()
for i in range(lines):
    print(f"task {task} line {i:09d} ".ljust(79, "x"))
print(f"printing took {time.perf_counter() - started:.6f} s")
"""


def expected(task: int, lines: int) -> bytes:
    return b"".join(f"task {task} line {i:09d} ".ljust(79, "x").encode() + b"\n"
                    for i in range(lines))


def printing_time(log: bytes, task: int, lines: int, where: str) -> float:
    """The payload's own printing time, after checking that `log` holds exactly its lines."""
    body, _, last = log.rstrip(b"\n").rpartition(b"\n")
    if lines:
        body += b"\n"
    if body != expected(task, lines) or not last.startswith(b"printing took "):
        got = body.count(b"\n")
        raise SystemExit(f"{where}: the log does not hold exactly task {task}'s {lines} lines "
                         f"in order ({got} lines, {len(body)} bytes)")
    return float(last.split()[2])


def by_hand(payload: Path, lines: int, out: Path) -> float:
    """The two processes started here, stdout to a file; the slower one's printing time."""
    procs, files = [], []
    for task in range(2):
        env = dict(os.environ, PYTHONUNBUFFERED="1", TFDEPLOY_TASK_INDEX=str(task))
        files.append(open(out / f"hand-{task}.log", "wb"))
        procs.append(subprocess.Popen([sys.executable, "flood.py", str(lines)], cwd=payload,
                                      env=env, stdout=files[-1], stderr=subprocess.STDOUT))
    codes = [p.wait() for p in procs]
    for f in files:
        f.close()
    if codes != [0, 0]:
        raise SystemExit(f"hand-started processes failed: {codes}")
    return max(printing_time((out / f"hand-{t}.log").read_bytes(), t, lines, "by hand")
               for t in range(2))


class PeakMemory:
    """The high-water mark of a process's resident memory (VmHWM in /proc/<pid>/status),
    read until it exits. Not wait4's ru_maxrss: that one counts the copy of this script a fork
    makes before the exec, and this script holds the expected logs."""

    def __init__(self, pid: int):
        self.status, self.kib, self.done = Path(f"/proc/{pid}/status"), 0, threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        while not self.done.wait(0.05):
            try:
                text = self.status.read_text()
            except OSError:
                return
            for row in text.splitlines():
                if row.startswith("VmHWM:"):
                    self.kib = max(self.kib, int(row.split()[1]))

    def stop(self) -> None:
        self.done.set()
        self.thread.join()


@dataclass
class Controller:
    wall: float
    cpu: float           # user + system seconds of the inv process (and what it waited for)
    max_rss_mb: float
    printing: float      # the slower task's own printing time


def with_tfdeploy(inventory: Path, payload: Path, lines: int, runs: Path) -> Controller:
    runs.mkdir(parents=True)
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "invoke", "train", "--hosts", str(inventory),
                             "--payload", str(payload), "--entry", "flood.py",
                             "--args", str(lines), "--runs-dir", str(runs)],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    peak = PeakMemory(proc.pid)
    output = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    peak.stop()
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.monotonic() - started
    if proc.returncode != 0:
        raise SystemExit(f"inv train failed ({proc.returncode}):\n"
                         + output.decode(errors="replace")[-4000:])
    (run_dir,) = (p for p in runs.iterdir() if p.is_dir())
    printing = max(printing_time((run_dir / f"worker-{t}.log").read_bytes(), t, lines,
                                 f"inv train, {run_dir}/worker-{t}.log") for t in range(2))
    return Controller(wall, usage.ru_utime + usage.ru_stime, peak.kib / 1024, printing)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--lines", type=int, default=200_000, help="lines each task prints")
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, SshLab(Path(tmp) / "lab") as lab:
        tmp = Path(tmp)
        inventory = lab.write_inventory(tmp / "lab.yaml", lab.start(2))
        payload = tmp / "payload"
        payload.mkdir()
        (payload / "flood.py").write_text(FLOOD)
        hand, flood, trivial = [], [], []
        for repeat in range(opts.repeats):
            hand.append(by_hand(payload, opts.lines, tmp))
            flood.append(with_tfdeploy(inventory, payload, opts.lines, tmp / f"flood-{repeat}"))
            trivial.append(with_tfdeploy(inventory, payload, 0, tmp / f"trivial-{repeat}"))
    med = statistics.median
    print(f"2 tasks on 2 SSH hosts, {opts.lines:,} lines of 80 bytes each; {opts.repeats} "
          "repeats, alternating; every worker log held exactly its task's lines in order")
    print(line("payload printing, by hand:", hand, 40))
    print(line("payload printing, inv train:", [c.printing for c in flood], 40))
    print(line("inv train wall, flood:", [c.wall for c in flood], 40))
    print(line("inv train wall, trivial:", [c.wall for c in trivial], 40))
    print(line("controller CPU, flood:", [c.cpu for c in flood], 40))
    print(line("controller CPU, trivial:", [c.cpu for c in trivial], 40))
    rss_flood, rss_trivial = [c.max_rss_mb for c in flood], [c.max_rss_mb for c in trivial]
    print(f"{'controller max RSS, flood:':<40}" + " ".join(f"{x:.0f}" for x in rss_flood)
          + f" MB; median {med(rss_flood):.0f} MB")
    print(f"{'controller max RSS, trivial:':<40}" + " ".join(f"{x:.0f}" for x in rss_trivial)
          + f" MB; median {med(rss_trivial):.0f} MB")
    lines_total = 2 * opts.lines
    extra_cpu = med([c.cpu for c in flood]) - med([c.cpu for c in trivial])
    print(f"ratio payload printing inv train / by hand: "
          f"{med([c.printing for c in flood]) / med(hand):.2f}x")
    print(f"ratio controller max RSS flood / trivial: {med(rss_flood) / med(rss_trivial):.2f}x")
    print(f"controller CPU for the flood beyond a trivial run: {extra_cpu:.2f} s "
          f"({extra_cpu / lines_total * 400_000:.2f} s per 400,000 lines)")


if __name__ == "__main__":
    main()
