"""A payload whose tasks print numbered lines at a steady rate (and an epoch event a second),
and the check that a run's local logs hold each of those lines once, in order: what long-run
tests and benchmarks/bench_soak.py use to show that following a run loses and repeats
nothing."""
from __future__ import annotations

from pathlib import Path

# argv: seconds, lines per second. A task's last line says how many it printed.
PAYLOAD = """\
import json, os, sys, time
seconds, rate = float(sys.argv[1]), int(sys.argv[2])
task = int(os.environ["TFDEPLOY_TASK_INDEX"])
print(json.dumps({"event": "start", "task": task, "epochs": int(seconds)}), flush=True)
n, epoch, start = 0, 0, time.monotonic()
while (elapsed := time.monotonic() - start) < seconds:
    while n < int(elapsed * rate):
        print(f"task {task} line {n:09d}")
        n += 1
    if int(elapsed) > epoch:
        epoch = int(elapsed)
        print(json.dumps({"event": "epoch", "task": task, "epoch": epoch, "loss": 1 / epoch,
                          "seconds": 1.0}))
    sys.stdout.flush()
    time.sleep(0.01)
print(f"task {task} printed {n} lines", flush=True)
"""


def write_payload(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "train.py").write_text(PAYLOAD)
    return directory


def check_logs(run_dir: Path) -> int:
    """Every task's local log holds its numbered lines once each, in order, as many as the task
    said it printed; their count. AssertionError naming the log where not."""
    total = 0
    for log in sorted(run_dir.glob("worker-*.log")):
        task = int(log.stem.split("-")[1])
        lines = log.read_bytes().splitlines()
        numbered = [line for line in lines if line.startswith(b"task %d line " % task)]
        want = [b"task %d line %09d" % (task, n) for n in range(len(numbered))]
        said = [line for line in lines if b" printed " in line]
        if numbered != want or not said or int(said[-1].split()[3]) != len(numbered):
            raise AssertionError(f"{log}: not every line once in order ({len(numbered)} "
                                 f"numbered lines; the task said {said[-1:]!r})")
        total += len(numbered)
    if not total:
        raise AssertionError(f"{run_dir}: no task log holds a numbered line")
    return total
