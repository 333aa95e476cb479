"""From bare hosts to training, end to end and timed: two sshd lab hosts on loopback whose
only Python is the system's `python3` (no TensorFlow), no `python` in the inventory.

Steps: `inv setup --wheelhouse` builds each host's environment from payload/requirements.txt
(offline: the wheels are pushed and installed with --no-index); `inv setup` again reuses it;
`inv train` trains in it; then one line of train.py changes and `inv train` runs again, timed
to both workers' first step (as bench_start.py times it).

    python benchmarks/bare_hosts.py [--wheelhouse DIR] [--args "--epochs 2 --steps-per-epoch 10"]

Without --wheelhouse the wheels are fetched first with `python3 -m pip download` (the hosts'
Python decides which wheels fit).
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from bench_start import rerun_after_change
from bench_train import REPO

sys.path.insert(0, str(REPO / "tests"))
from sshlab import SshLab  # noqa: E402

FIRST_OCTET = 90     # away from the test lab's 127.0.0.2, .3, ... and the other benchmarks'


def inv(*args: str) -> float:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "invoke", *args], cwd=REPO,
                          capture_output=True, text=True)
    elapsed = time.monotonic() - started
    tail = "\n".join(done.stdout.splitlines()[-12:])
    print(f"$ inv {' '.join(args)}\n{tail}\n-> exit {done.returncode} in {elapsed:.1f} s\n",
          flush=True)
    if done.returncode != 0:
        raise SystemExit(done.stderr)
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheelhouse", help="wheels for payload/requirements.txt")
    parser.add_argument("--args", default="--epochs 2 --steps-per-epoch 10")
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bare-hosts-") as tmpdir, \
            SshLab(Path(tmpdir) / "lab", first_octet=FIRST_OCTET) as lab:
        tmp = Path(tmpdir)
        payload = tmp / "payload"
        shutil.copytree(REPO / "payload", payload)
        wheelhouse = opts.wheelhouse
        if not wheelhouse:
            wheelhouse = str(tmp / "wheelhouse")
            subprocess.run(["python3", "-m", "pip", "download", "-q", "-d", wheelhouse,
                            "-r", str(payload / "requirements.txt")], check=True)
        doc = yaml.safe_load(lab.inventory_yaml(lab.start(2)))
        del doc["defaults"]["python"]          # the hosts' own python3, as on a bare machine
        inventory = tmp / "bare.yaml"
        inventory.write_text(yaml.safe_dump(doc, sort_keys=False))
        hosts = ("--hosts", str(inventory))
        setup = ("setup", *hosts, "--payload", str(payload), "--wheelhouse", wheelhouse)
        built, reused = inv(*setup), inv(*setup)
        trained = inv("train", *hosts, "--payload", str(payload), "--runs-dir",
                      str(tmp / "runs"), "--args", opts.args)
        first_step = rerun_after_change(inventory, payload, opts.args.split(), tmp / "runs", 0)
    print(f"inv setup (built): {built:.1f} s; again (reused): {reused:.1f} s; "
          f"inv train: {trained:.1f} s; after a one-line change, to both workers' first step: "
          f"{first_step:.1f} s")


if __name__ == "__main__":
    main()
