"""TensorBoard curves while a run trains: `inv train` of the project's payload on the default
inventory (two local workers) keeps runs/<id>/tensorboard up with the chief's logs after each
epoch, at most every 10 s, so that `tensorboard --logdir runs/<id>/tensorboard` shows them
grow; at the end it is the link to the fetched output."""
from __future__ import annotations

import json
import struct
import subprocess
import sys
import time
from pathlib import Path

from procs import end, wait_until_gone

REPO = Path(__file__).resolve().parents[2]
EPOCHS = 30


def records(path: Path) -> int:
    """TFRecords in an event file (length, its CRC, data, its CRC): the first is the file's
    version, then one per scalar written; a record still being written is not counted."""
    data, count, at = path.read_bytes(), 0, 0
    while at + 12 <= len(data):
        (length,) = struct.unpack("<Q", data[at:at + 8])
        if at + 12 + length + 4 > len(data):
            break
        at, count = at + 12 + length + 4, count + 1
    return count


def epochs_in_copy(tensorboard: Path) -> int:
    """Epochs the local copy holds: the train split gets epoch_loss and epoch_accuracy each."""
    files = sorted(tensorboard.glob("train/events.out.tfevents.*"))
    return max(((records(f) - 1) // 2 for f in files), default=0)


def chief_epoch(run_dir: Path) -> int:
    log = run_dir / "worker-0.log"
    epochs = [json.loads(line)["epoch"] for line in
              (log.read_text() if log.exists() else "").splitlines()
              if line.startswith("{") and '"event": "epoch"' in line]
    return max(epochs, default=0)


def test_the_chiefs_tensorboard_logs_arrive_while_it_trains(tmp_path):
    runs = tmp_path / "runs"
    out = tmp_path / "controller.out"
    with open(out, "w") as sink:
        controller = subprocess.Popen(
            [sys.executable, "-m", "invoke", "train", "--runs-dir", str(runs), "--args",
             f"--epochs {EPOCHS} --steps-per-epoch 80"],
            cwd=REPO, stdout=sink, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 240
        run_dir = None
        while run_dir is None or chief_epoch(run_dir) < 4:
            assert controller.poll() is None and time.monotonic() < deadline, out.read_text()
            found = [p for p in runs.glob("*") if p.is_dir()] if runs.exists() else []
            run_dir = found[0] if found else None
            time.sleep(0.1)
        fourth = time.monotonic()
        tensorboard = run_dir / "tensorboard"
        while epochs_in_copy(tensorboard) < 4:
            assert time.monotonic() - fourth < 15, (
                f"epoch 4 of the chief not in {tensorboard} 15 s after it ended; "
                f"{epochs_in_copy(tensorboard)} there")
            time.sleep(0.2)
        # Before the tasks finish: training is still going on.
        assert controller.poll() is None and chief_epoch(run_dir) < EPOCHS
        assert tensorboard.is_dir() and not tensorboard.is_symlink()
        assert controller.wait(timeout=300) == 0, out.read_text()
    finally:
        end(controller)
    # At the end: the link to the whole fetched output, every epoch in it.
    assert tensorboard.is_symlink() and epochs_in_copy(tensorboard) == EPOCHS
    assert not list(run_dir.glob(".tensorboard-*"))          # no fetch left half-way
    assert wait_until_gone(run_dir.name, timeout=5) == []
