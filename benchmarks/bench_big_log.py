"""`tfdeploy logs --tail N` on a run whose log is gigabytes, against `tail -n N` of the same
file, side by side: the wall time and the peak memory of each, and their ratio.

A real run of the project's payload on the default inventory (two local workers) makes the
run record; its worker-0 log is then grown to SIZE_GB with lines of 100 bytes, as a long
run's would be. The record's other files are left as the run wrote them.

    python benchmarks/bench_big_log.py [SIZE_GB] [N]      # default: 2 GB, 20 lines
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def timed(argv: list[str], cwd: Path) -> tuple[float, int, str]:
    """Wall seconds, peak RSS (KiB) of the child, and its stdout."""
    started = time.monotonic()
    done = subprocess.run(["/usr/bin/time", "-f", "%M", *argv], cwd=cwd, capture_output=True,
                          text=True, check=True)
    return time.monotonic() - started, int(done.stderr.strip().splitlines()[-1]), done.stdout


def main() -> None:
    size_gb = float(sys.argv[1]) if len(sys.argv) > 1 else 2.0
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    work = Path(tempfile.mkdtemp(prefix="tfdeploy-bench-log-"))
    try:
        runs = work / "runs"
        subprocess.run([sys.executable, "-m", "invoke", "train", "--runs-dir", str(runs),
                        "--args", "--epochs 1 --steps-per-epoch 2"], cwd=REPO, check=True,
                       capture_output=True)
        (run_dir,) = [p for p in runs.iterdir() if p.is_dir()]
        log = run_dir / "worker-0.log"
        chunk = b"".join(b"line %010d " % i + b"x" * 83 + b"\n" for i in range(100_000))
        with log.open("ab") as f:
            while f.tell() < size_gb * 1e9:
                f.write(chunk)
        size = log.stat().st_size
        ours = timed([sys.executable, "-m", "invoke", "logs", "--runs-dir", str(runs),
                      "--run", run_dir.name, "--task", "worker-0", "--tail", str(count),
                      "--verbose"], REPO)
        base = timed(["tail", "-n", str(count), str(log)], REPO)
        want = [f"[worker-0 local] {line}" for line in base[2].splitlines()]
        shown = [line for line in ours[2].splitlines() if line.startswith("[worker-0 local] ")]
        assert shown[-count:] == want, \
            f"not the same lines:\n{ours[2][-3000:]}"
        print(f"log of {size / 1e9:.2f} GB, last {count} lines")
        print(f"tfdeploy logs --tail: {ours[0]:.2f} s, peak {ours[1] / 1024:.0f} MiB")
        print(f"tail -n:              {base[0]:.3f} s, peak {base[1] / 1024:.1f} MiB")
        print(f"ratio (time):         {ours[0] / base[0]:.0f}x  (the controller's start-up "
              f"and imports are most of it)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
