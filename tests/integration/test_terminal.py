"""`inv train` in a terminal, as a person sees it: the controller runs on a pseudo-terminal of
150x45 with the default local inventory and real TensorFlow, and everything it wrote to the
terminal is read back."""
from __future__ import annotations

import json
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import fcntl
import time
from pathlib import Path

from matplotlib.image import imread

from deploy.console.lines import is_tensorflow_chatter
from procs import wait_until_gone


REPO = Path(__file__).resolve().parents[2]
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|\r")
# A TensorFlow C++ log prefix anywhere in the output (also after a task's prefix).
CPP_ANYWHERE = re.compile(r"[IWEF]\d{4} \d\d:\d\d:\d+\.\d+\s+\d+ \S+:\d+\]")


def run_on_terminal(args: list[str], timeout: float = 300) -> tuple[int, str]:
    """Run `python -m invoke ARGS` on a new pseudo-terminal of 150x45; its exit status and
    every byte it wrote to the terminal, escape sequences removed."""
    code, out = terminal_bytes(args, timeout)
    return code, ANSI.sub("", out.decode("utf-8", "replace"))


def terminal_bytes(args: list[str], timeout: float = 300) -> tuple[int, bytes]:
    """Run `python -m invoke ARGS` on a new pseudo-terminal of 150x45; its exit status and
    every byte it wrote to the terminal."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 45, 150, 0, 0))
    env = {k: v for k, v in os.environ.items()
           if k not in ("COLUMNS", "LINES", "FORCE_COLOR", "TTY_COMPATIBLE", "NO_COLOR")}
    env["TERM"] = "xterm-256color"
    proc = subprocess.Popen([sys.executable, "-m", "invoke", *args], cwd=REPO, env=env,
                            stdin=slave, stdout=slave, stderr=slave, start_new_session=True)
    os.close(slave)
    out = bytearray()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1.0)
            if not ready:
                if proc.poll() is not None:
                    break
                continue
            try:
                data = os.read(master, 65536)
            except OSError:         # EIO: the controller closed the terminal
                break
            if not data:
                break
            out += data
        code = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
        os.close(master)
    return code, bytes(out)


def test_a_terminal_shows_the_table_and_the_summary_but_no_tensorflow_chatter(tmp_path):
    runs = tmp_path / "runs"
    code, screen = run_on_terminal(["train", "--runs-dir", str(runs),
                                    "--args", "--epochs 3 --steps-per-epoch 5"])
    assert code == 0, screen
    run_dir = next(p for p in runs.iterdir() if p.is_dir())
    # Nothing TensorFlow's C++ runtime wrote and no raw event reached the terminal...
    assert not CPP_ANYWHERE.search(screen), screen
    assert "absl::InitializeLog" not in screen and '"event"' not in screen, screen
    # ...while the local logs keep both.
    for i in range(2):
        log = (run_dir / f"worker-{i}.log").read_text().splitlines()
        assert any(is_tensorflow_chatter(line) for line in log)
        assert any('"event": "epoch"' in line for line in log)
    # The live table was drawn: its header, and a row per task with epochs of the total.
    assert "steps/s" in screen and "loss curve" in screen and "epochs" in screen
    for i in range(2):
        assert re.search(rf"│ worker-{i} +│ local +│ \d+ +│ running +│ [123]/3 ", screen), screen
    # The summary: each task's final loss on its own row, the files the run left.
    summary = json.loads((run_dir / "summary.json").read_text())
    for i, task in enumerate(summary["tasks"]):
        row = rf"│ worker-{i} +│ local +│ exit 0 +│ [\d.]+ s +│ 3/3 +│ {task['final_loss']:.4f} +│"
        assert re.search(row, screen), screen
    assert f"loss curve:  {run_dir / 'loss.png'}" in screen
    assert f"tensorboard --logdir {run_dir / 'tensorboard'}" in screen
    assert any((run_dir / "tensorboard" / "train").glob("events.out.tfevents.*"))
    image = imread(run_dir / "loss.png")
    assert image.shape[0] >= 150 and image.shape[1] >= 200
    assert (image[..., :3] < 0.95).any(axis=-1).mean() > 0.01
    assert wait_until_gone(run_dir.name, timeout=5) == []

    # `inv plot` draws it again from the local logs; `inv logs` shows them as `train` did,
    # and with --verbose as written.
    (run_dir / "loss.png").unlink()
    code, screen = run_on_terminal(["plot", "--runs-dir", str(runs)])
    assert code == 0 and imread(run_dir / "loss.png").shape[1] >= 200, screen
    code, screen = run_on_terminal(["logs", "--runs-dir", str(runs)])
    assert code == 0 and "epoch 3/3" in screen and '"event"' not in screen, screen
    assert not CPP_ANYWHERE.search(screen), screen
    code, screen = run_on_terminal(["logs", "--runs-dir", str(runs), "--verbose"])
    assert code == 0 and '"event": "epoch"' in screen, screen


# A payload that prints what a terminal would obey: a window title (OSC ... BEL), a clipboard
# write (OSC 52), clear screen and cursor moves (CSI), a C1 CSI, a bell, and rich markup that
# would close a style never opened; then a progress bar redrawn with CR.
NASTY = """\
import sys
out = sys.stdout.buffer
out.write(b"\\x1b]0;pwned\\x07title\\n")
out.write(b"\\x1b]52;c;ZXZpbA==\\x07clipboard\\n")
out.write(b"\\x1b[2J\\x1b[Hcleared\\x07\\n")
out.write("\\u009b31mC1\\n".encode())
out.write(b"[/bold] closes nothing [red]nor this[/red]\\n")
out.write(b"progress 10%\\rprogress 50%\\rprogress 100%\\n")
out.flush()
"""


def test_a_payloads_escape_sequences_and_markup_reach_the_terminal_as_plain_text(
        ssh_lab, tmp_path):
    inventory = ssh_lab.write_inventory(tmp_path / "lab.yaml", ssh_lab.hosts[:1])
    payload = tmp_path / "payload"
    payload.mkdir()
    (payload / "train.py").write_text(NASTY)
    runs = tmp_path / "runs"
    code, out = terminal_bytes(["train", "--hosts", str(inventory), "--runs-dir", str(runs),
                                "--payload", str(payload), "--no-check", "--start-timeout",
                                "0"])
    screen = out.decode("utf-8", "replace")
    assert code == 0, screen
    # None of the payload's sequences reached the terminal (rich's own are CSI ... m/K/A etc.)
    for sequence in ("\x1b]", "\x07", "\x1b[2J", "\x1b[H", "\x9b"):
        assert sequence not in screen, (sequence, screen)
    # Shown instead as what they are, and the markup as written.
    for shown in (r"\x1b]0;pwned\x07title", r"\x1b]52;c;ZXZpbA==\x07clipboard",
                  r"\x1b[2J\x1b[Hcleared\x07", r"\x9b31mC1",
                  "[/bold] closes nothing [red]nor this[/red]", "] progress 100%"):
        assert shown in screen, (shown, screen)
    assert "progress 10%" not in screen
    # The local log keeps every byte as the payload wrote it.
    log = (next(p for p in runs.iterdir() if p.is_dir()) / "worker-0.log").read_bytes()
    assert b"\x1b]0;pwned\x07title\n" in log and b"\x1b[2J\x1b[Hcleared\x07" in log
    assert "\u009b31mC1".encode() in log and b"10%\rprogress 50%\rprogress 100%\n" in log
