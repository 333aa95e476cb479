"""What the checks add to `inv train`: the same 2-host run with and without `--no-check`,
alternating, on two sshd lab hosts on loopback; plus `inv check` alone.

Whole-run times move by seconds with the machine's load (TensorFlow start-up dominates), so
the check's own time, as `inv train` reports it ("checked 2 host(s) in X s"), is the figure
to read; the whole-run medians are shown beside it.

    python benchmarks/bench_check.py [--repeats 3] [--args "--epochs 2 --steps-per-epoch 5"]
"""
from __future__ import annotations

import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench_train import REPO, line, options, two_host_lab

CHECKED = re.compile(r"checked \d+ host\(s\) in ([0-9.]+) s")


def train(inventory: Path, args: list[str], runs: Path, *flags: str) -> tuple[float, float]:
    """(whole command wall time, the check's own time as train reports it; 0 without it)."""
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "invoke", "train", "--hosts", str(inventory),
                           "--runs-dir", str(runs), "--args", " ".join(args), *flags],
                          cwd=REPO, capture_output=True, text=True)
    elapsed = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"inv train failed:\n{done.stdout}\n{done.stderr}")
    match = CHECKED.search(done.stdout)
    return elapsed, float(match.group(1)) if match else 0.0


def check_alone(inventory: Path) -> float:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "invoke", "check", "--hosts", str(inventory)],
                          cwd=REPO, capture_output=True, text=True)
    elapsed = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"inv check failed:\n{done.stdout}\n{done.stderr}")
    return elapsed


def main() -> None:
    opts = options(__doc__, "--epochs 2 --steps-per-epoch 5")
    args = opts.args.split()
    with two_host_lab() as (tmp, inventory):
        checked, unchecked, alone, step = [], [], [], []
        for _ in range(opts.repeats):
            wall, check = train(inventory, args, tmp / "runs")
            checked.append(wall)
            step.append(check)
            unchecked.append(train(inventory, args, tmp / "runs", "--no-check")[0])
            alone.append(check_alone(inventory))
    print(f"payload args: {opts.args}; {opts.repeats} repeats, alternating; 2 SSH hosts")
    print(line("inv train (checks first):", checked))
    print(line("inv train --no-check:", unchecked))
    print(line("inv check (whole command):", alone))
    print(line("check step inside train:", step))
    print(f"checks add {statistics.median(checked) - statistics.median(unchecked):+.2f} s "
          f"to the median inv train")


if __name__ == "__main__":
    main()
