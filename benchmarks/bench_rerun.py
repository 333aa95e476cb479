"""A trivial payload, unchanged since the last run, on 4 SSH hosts: `inv train` (checks
included) against doing the same by hand with OpenSSH: 4 parallel `rsync -a` of the payload
followed by `ssh host python3 noop.py` (one ssh_config, strict known_hosts).

One warm-up of each side first (the payload is then on every host: the measured runs are
re-runs), then alternating repeats. Prints each time, the medians and the ratio.

    python benchmarks/bench_rerun.py [--repeats 3] [--hosts 4]
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_hosts import NOOP, inv, ssh_config
from bench_train import REPO, line

sys.path.insert(0, str(REPO / "tests"))
from sshlab import SshLab  # noqa: E402

FIRST_OCTET = 140


def by_hand(config: Path, hosts, payload: Path) -> float:
    """Per host, in parallel: rsync the payload, then run it."""
    started = time.monotonic()
    procs = []
    for host in hosts:
        target = f"{host.workdir}/by-hand"
        script = (f"rsync -a -e 'ssh -F {config}' {payload}/ {host.name}:{target}/ && "
                  f"ssh -F {config} {host.name} {sys.executable} {target}/noop.py")
        procs.append(subprocess.Popen(["/bin/sh", "-c", script], stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE))
    outputs = [p.communicate() for p in procs]
    elapsed = time.monotonic() - started
    failed = [err for p, (_, err) in zip(procs, outputs) if p.returncode]
    if failed:
        raise SystemExit(f"by hand failed on {len(failed)} host(s): {failed[:2]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--hosts", type=int, default=4)
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-rerun-") as tmp:
        tmp = Path(tmp)
        with SshLab(tmp / "lab", first_octet=FIRST_OCTET) as lab:
            hosts = lab.start(opts.hosts)
            for host in hosts:
                Path(host.workdir).mkdir(parents=True, exist_ok=True)
            inventory = lab.write_inventory(tmp / "hosts.yaml", hosts)
            config = ssh_config(lab, hosts, tmp / "ssh_config")
            payload = tmp / "payload"
            payload.mkdir()
            (payload / "noop.py").write_text(NOOP)
            train = ("train", "--hosts", str(inventory), "--payload", str(payload),
                     "--entry", "noop.py", "--runs-dir", str(tmp / "runs"))
            by_hand(config, hosts, payload)
            inv(*train)
            hand, ours = [], []
            for _ in range(opts.repeats):
                hand.append(by_hand(config, hosts, payload))
                ours.append(inv(*train))
    h = statistics.median(hand)
    print(f"{opts.hosts} SSH hosts on loopback, payload unchanged since the last run; "
          f"{opts.repeats} repeats, alternating")
    print(line(f"{opts.hosts} parallel rsync -a + ssh python3 noop.py:", hand, 44))
    print(line("inv train (checks included):", ours, 44))
    print(f"ratio inv train / by hand: {statistics.median(ours) / h:.2f}x")


if __name__ == "__main__":
    main()
