"""Long runs on two SSH lab hosts: a controller that stays flat, and follows that lose and repeat
nothing. Each task prints RATE numbered lines a second and an epoch event each second, for
SECONDS seconds.

soak    `inv train`, not on a terminal. The controller's memory (VmRSS), open files and
        threads are read from /proc every second; its CPU from its rusage at the end. Printed:
        memory and open files at 60 s and at the end, threads, CPU as % of one core over the
        run, lines per second through it; then each task's local log is checked to hold every
        line once, in order.
follow  the run started with `--detach`; `inv logs --follow` started INTERRUPTS times and
        interrupted with SIGINT (Ctrl-C) after a few seconds each time, then followed to the
        end; its exit status, and each task's local log checked as above.

    python benchmarks/bench_soak.py soak [--seconds 300] [--rate 1000]
    python benchmarks/bench_soak.py follow [--seconds 150] [--rate 1000] [--interrupts 8]
"""
from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from numbered import check_logs, write_payload  # noqa: E402
from procs import wait_until_gone  # noqa: E402
from sshlab import SshLab  # noqa: E402

def inv(*args: str, **kw) -> subprocess.Popen:
    # SIGINT at its default in the child, whatever this shell left it at.
    return subprocess.Popen([sys.executable, "-m", "invoke", *args], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
                            **kw)


def proc_sample(pid: int) -> tuple[int, int, int, float]:
    """VmRSS (KiB), open files, threads and CPU seconds (user + system) of `pid`."""
    status = Path(f"/proc/{pid}/status").read_text()
    field = {name: value.split()[0] for name, _, value in
             (line.partition(":") for line in status.splitlines()) if value.strip()}
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")
    return (int(field["VmRSS"]), len(os.listdir(f"/proc/{pid}/fd")), int(field["Threads"]),
            cpu)


def soak(lab: SshLab, hosts, work: Path, seconds: float, rate: int) -> None:
    inventory = lab.write_inventory(work / "hosts.yaml", hosts)
    runs = work / "runs"
    controller = inv("train", "--hosts", str(inventory), "--runs-dir", str(runs),
                     "--payload", str(work / "payload"), "--args", f"{seconds} {rate}")
    output: list[bytes] = []
    threading.Thread(target=lambda: output.extend(controller.stdout), daemon=True).start()
    samples, started = [], time.monotonic()
    try:
        while controller.poll() is None:
            try:
                samples.append((time.monotonic() - started, *proc_sample(controller.pid)))
            except (OSError, KeyError, IndexError, ValueError):
                pass                        # it ended between poll() and the read
            time.sleep(1)
    finally:
        if controller.poll() is None:       # this script failed: its controller goes too
            controller.send_signal(signal.SIGINT)
            controller.wait(timeout=60)
    wall = time.monotonic() - started
    code = controller.returncode
    if code != 0:
        raise SystemExit(b"".join(output).decode(errors="replace")[-3000:])
    (run_dir,) = [p for p in runs.iterdir() if p.is_dir()]
    lines = check_logs(run_dir)
    at60 = next(s for s in samples if s[0] >= 60)
    last = samples[-5]                      # before teardown's fetch and summary
    cpu = samples[-1][4]                    # as last read while it ran
    print(f"soak: exit {code}, {wall:.0f} s, {lines} lines ({lines / wall:.0f}/s) checked")
    print(f"  memory at 60 s {at60[1] / 1024:.1f} MiB, at {last[0]:.0f} s "
          f"{last[1] / 1024:.1f} MiB ({last[1] / at60[1]:.2f}x)")
    print(f"  open files at 60 s {at60[2]}, at {last[0]:.0f} s {last[2]}")
    print(f"  threads at 60 s {at60[3]}, at {last[0]:.0f} s {last[3]}")
    print(f"  CPU {cpu:.1f} s of one core over {wall:.0f} s: {100 * cpu / wall:.1f}%")


def follow(lab: SshLab, hosts, work: Path, seconds: float, rate: int,
           interrupts: int) -> None:
    inventory = lab.write_inventory(work / "hosts.yaml", hosts)
    runs = work / "runs"
    started = inv("train", "--hosts", str(inventory), "--runs-dir", str(runs), "--payload",
                  str(work / "payload"), "--args", f"{seconds} {rate}", "--detach")
    out = started.communicate(timeout=120)[0].decode()
    if started.returncode != 0:
        raise SystemExit(out)
    (run_dir,) = [p for p in runs.iterdir() if p.is_dir()]
    begun = time.monotonic()
    codes = []
    for _ in range(interrupts):
        follower = inv("logs", "--run", run_dir.name, "--runs-dir", str(runs), "--follow")
        time.sleep(random.uniform(3, seconds / (interrupts + 2)))
        follower.send_signal(signal.SIGINT)
        follower.communicate(timeout=60)
        codes.append(follower.returncode)
    last = inv("logs", "--run", run_dir.name, "--runs-dir", str(runs), "--follow")
    last.communicate(timeout=seconds + 120)
    lines = check_logs(run_dir)
    left = wait_until_gone(run_dir.name, timeout=10)
    dirs = [h.name for h in hosts if (Path(h.workdir) / "runs" / run_dir.name).exists()]
    print(f"follow: {interrupts} follows interrupted with Ctrl-C (exit {sorted(set(codes))}), "
          f"then followed to the end: exit {last.returncode}, {time.monotonic() - begun:.0f} s; "
          f"{lines} lines, each once and in order; processes of the run left: {len(left)}, "
          f"run directories left on hosts: {dirs or 'none'}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=("soak", "follow"))
    parser.add_argument("--seconds", type=float)
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--interrupts", type=int, default=8)
    args = parser.parse_args()
    seconds = args.seconds or (300 if args.mode == "soak" else 150)
    work = Path(tempfile.mkdtemp(prefix="tfdeploy-soak-"))
    write_payload(work / "payload")
    with SshLab(work / "lab", first_octet=150) as lab:
        hosts = lab.start(2)
        if args.mode == "soak":
            soak(lab, hosts, work, seconds, args.rate)
        else:
            follow(lab, hosts, work, seconds, args.rate, args.interrupts)


if __name__ == "__main__":
    main()
