"""`inv train` on two SSH hosts against the tutorial's way: two workers started by hand.

Both sides train the default payload with the same arguments, in one process of this script,
alternating, so machine load affects both alike. The hosts are real sshd servers on loopback
(the test lab). Prints the median wall time of each and their ratio.

    python benchmarks/bench_train.py [--repeats 3] [--args "--epochs 3 --steps-per-epoch 20"]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from sshlab import SshLab  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def by_hand(args: list[str], out_dir: Path) -> float:
    """Two workers with TF_CONFIG set by hand, as the tutorial does."""
    cluster = [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]
    started = time.monotonic()
    procs = []
    for index in range(2):
        env = dict(os.environ, TF_USE_LEGACY_KERAS="1", PYTHONUNBUFFERED="1",
                   TFDEPLOY_OUTPUT_DIR=str(out_dir / f"hand-{started}"),
                   TF_CONFIG=json.dumps({"cluster": {"worker": cluster},
                                         "task": {"type": "worker", "index": index}}))
        procs.append(subprocess.Popen([sys.executable, "train.py", *args], cwd=REPO / "payload",
                                      env=env, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL))
    codes = [p.wait() for p in procs]
    elapsed = time.monotonic() - started
    if codes != [0, 0]:
        raise SystemExit(f"hand-started workers failed: {codes}")
    return elapsed


def with_tfdeploy(inventory: Path, args: list[str], runs: Path) -> float:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "invoke", "train", "--hosts", str(inventory),
                           "--runs-dir", str(runs), "--args", " ".join(args)],
                          cwd=REPO, capture_output=True, text=True)
    elapsed = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"inv train failed:\n{done.stdout}\n{done.stderr}")
    return elapsed


def options(doc: str, default_args: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--args", default=default_args)
    return parser.parse_args()


def line(label: str, times: list[float], width: int = 28) -> str:
    """`label   8.22 9.18 8.50 s; median 8.50 s`"""
    return (f"{label:<{width}}" + " ".join(f"{x:.2f}" for x in times)
            + f" s; median {statistics.median(times):.2f} s")


@contextlib.contextmanager
def two_host_lab():
    """(a scratch directory, an inventory of two sshd lab hosts), removed afterwards."""
    with tempfile.TemporaryDirectory() as tmp, SshLab(Path(tmp) / "lab") as lab:
        yield Path(tmp), lab.write_inventory(Path(tmp) / "lab.yaml", lab.start(2))


def main() -> None:
    opts = options(__doc__, "--epochs 3 --steps-per-epoch 20")
    args = opts.args.split()
    with two_host_lab() as (tmp, inventory):
        hand, tool = [], []
        for _ in range(opts.repeats):
            hand.append(by_hand(args, tmp))
            tool.append(with_tfdeploy(inventory, args, tmp / "runs"))
    h, t = statistics.median(hand), statistics.median(tool)
    print(f"payload args: {opts.args}; {opts.repeats} repeats, alternating")
    print("by hand (2 processes, TF_CONFIG by hand): " + " ".join(f"{x:.2f}" for x in hand)
          + f" s; median {h:.2f} s")
    print("inv train (2 SSH hosts on loopback):       " + " ".join(f"{x:.2f}" for x in tool)
          + f" s; median {t:.2f} s")
    print(f"ratio inv train / by hand: {t / h:.2f}x")


if __name__ == "__main__":
    main()
