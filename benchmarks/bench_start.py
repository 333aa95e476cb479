"""How long a re-run after a one-line change takes to start training, against starting
TensorFlow by hand.

Per repeat, alternating: two workers started by hand as the tutorial does (TF_CONFIG by hand,
local processes) and `inv train` on two sshd lab hosts on loopback after one line of the
payload's train.py changed (so the push sends that file). Each side is timed from its start
to the moment both workers have printed their `first_step` event: TensorFlow imported, the
cluster formed, the first step run. Both sides then train to the end.

    python benchmarks/bench_start.py [--repeats 3] [--args "--epochs 1 --steps-per-epoch 5"]
"""
from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench_train import REPO, free_port, line, options, two_host_lab

FIRST_STEP = '"event": "first_step"'


class FirstSteps:
    """Counts `first_step` lines over any number of output streams; remembers when the
    expected number was reached."""

    def __init__(self, expected: int, started: float):
        self.expected, self.started = expected, started
        self.seen, self.at = 0, None
        self.lock = threading.Lock()
        self.output: list[str] = []

    def read(self, stream) -> threading.Thread:
        def run():
            for text in stream:
                with self.lock:
                    self.output.append(text)
                    if FIRST_STEP in text:
                        self.seen += 1
                        if self.seen == self.expected:
                            self.at = time.monotonic() - self.started
        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread

    def elapsed(self, what: str) -> float:
        if self.at is None:
            raise SystemExit(f"{what}: {self.seen} of {self.expected} first steps seen:\n"
                             + "".join(self.output[-40:]))
        return self.at


def by_hand(payload: Path, args: list[str], out_dir: Path) -> float:
    cluster = [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]
    started = time.monotonic()
    steps = FirstSteps(2, started)
    procs, readers = [], []
    for index in range(2):
        env = dict(os.environ, TF_USE_LEGACY_KERAS="1", PYTHONUNBUFFERED="1",
                   TFDEPLOY_OUTPUT_DIR=str(out_dir / f"hand-{started}-{index}"),
                   TF_CONFIG=json.dumps({"cluster": {"worker": cluster},
                                         "task": {"type": "worker", "index": index}}))
        procs.append(subprocess.Popen([sys.executable, "train.py", *args], cwd=payload, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                      text=True))
        readers.append(steps.read(procs[-1].stdout))
    codes = [p.wait() for p in procs]
    for reader in readers:
        reader.join()
    if codes != [0, 0]:
        raise SystemExit(f"hand-started workers failed: {codes}")
    return steps.elapsed("by hand")


def rerun_after_change(inventory: Path, payload: Path, args: list[str], runs: Path,
                       repeat: int) -> float:
    entry = payload / "train.py"
    entry.write_text(entry.read_text() + f"# changed for repeat {repeat}\n")
    started = time.monotonic()
    steps = FirstSteps(2, started)
    proc = subprocess.Popen([sys.executable, "-m", "invoke", "train", "--hosts", str(inventory),
                             "--payload", str(payload), "--runs-dir", str(runs),
                             "--args", " ".join(args)],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    reader = steps.read(proc.stdout)
    code = proc.wait()
    reader.join()
    if code != 0:
        raise SystemExit(f"inv train failed ({code}):\n" + "".join(steps.output[-40:]))
    return steps.elapsed("inv train")


def main() -> None:
    opts = options(__doc__, "--epochs 1 --steps-per-epoch 5")
    args = opts.args.split()
    with two_host_lab() as (tmp, inventory):
        payload = tmp / "payload"
        shutil.copytree(REPO / "payload", payload)
        # A first run fills the hosts' file caches: every timed run is a re-run.
        rerun_after_change(inventory, payload, args, tmp / "runs", -1)
        hand, tool = [], []
        for repeat in range(opts.repeats):
            hand.append(by_hand(payload, args, tmp))
            tool.append(rerun_after_change(inventory, payload, args, tmp / "runs", repeat))
    h, t = statistics.median(hand), statistics.median(tool)
    print(f"payload args: {opts.args}; {opts.repeats} repeats, alternating; "
          "time to both workers' first step")
    print(line("by hand (2 processes, TF_CONFIG by hand):", hand, 46))
    print(line("inv train after a one-line change (2 hosts):", tool, 46))
    print(f"ratio inv train / by hand: {t / h:.2f}x (+{t - h:.2f} s)")


if __name__ == "__main__":
    main()
