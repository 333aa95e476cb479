"""What the `data: {local: DIR}` step of `inv train` costs: per-host shards on two sshd servers.

Each host gets its own shard directory of FILES files of random bytes (default 200 files,
50 MB per shard). Timed, as `inv train` runs it after the payload push: hashing the shard
directories here (remembered hashes reused as a run would) and the data push (ask, send,
assemble <workdir>/data/<tree>). Three cases per repeat: a first push (empty host caches, no
remembered hashes), the same data again (the host has the directory: nothing travels or is
copied), and the data directory deleted on the hosts with their file caches kept (assembled
from the cache, nothing travels).

    python benchmarks/bench_data.py [--repeats 3] [--files 200] [--megabytes 50]
"""
from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "benchmarks"))
from bench_push import make_payload, size_options  # noqa: E402

from deploy.inventory.load import load_inventory  # noqa: E402
from deploy.plan.planner import Options, plan_run  # noqa: E402
from deploy.push.data import DataPush  # noqa: E402
from deploy.push.payload import PayloadPush  # noqa: E402
from deploy.state.record import new_run_id  # noqa: E402
from deploy.cluster.session import Session  # noqa: E402
from sshlab import SshLab  # noqa: E402

HOSTS = 2
FIRST_OCTET = 70     # away from the test lab's 127.0.0.2, .3, ... and bench_push's .60
CASES = ("first push", "same data again", "data dir deleted, cache kept")


def data_step(inventory: Path, payload: Path, tmp: Path) -> float:
    """One run's push, payload first (untimed), then the data step (timed); then teardown."""
    quiet = Console(file=open(os.devnull, "w"))
    inv = load_inventory(str(inventory))
    run_id = new_run_id()
    push = PayloadPush(payload, "train.py", run_id, hash_cache=tmp / "payload-hashes.json")
    session = Session.open(inv, 10.0, False)
    try:
        push.send(session, plan_run(inv, Options(payload=str(payload)), run_id),
                  quiet.status, lambda line: None)
        started = time.monotonic()
        data = DataPush(inv, hash_cache=tmp / "data-hashes.json")
        plan = plan_run(data.resolved(inv), Options(payload=str(payload)), run_id)
        data.send(session, plan, quiet.status, lambda line: None)
        elapsed = time.monotonic() - started
        problems = session.cleanup(plan)          # the run dir goes; cache and data stay
        if problems:
            raise SystemExit(f"cleanup: {problems}")
    finally:
        session.close()
    return elapsed


def main() -> None:
    opts = size_options(__doc__.splitlines()[0], files=200, megabytes=50)
    times: dict[str, list[float]] = {case: [] for case in CASES}
    with tempfile.TemporaryDirectory(prefix="bench-data-") as tmpdir, \
            SshLab(Path(tmpdir) / "lab", first_octet=FIRST_OCTET) as lab:
        tmp = Path(tmpdir)
        lab.start(HOSTS)
        for host in lab.hosts:
            make_payload(tmp / "shards" / host.name, opts.files, opts.megabytes * 1_000_000)
        inventory = lab.write_inventory(tmp / "hosts.yaml", lab.hosts, per_host={
            h.name: {"data": {"local": f"shards/{h.name}"}} for h in lab.hosts})
        payload = tmp / "payload"
        payload.mkdir()
        (payload / "train.py").write_text("print('bench')\n")
        print(f"data: {HOSTS} hosts, each its own shard of {opts.files} files, "
              f"{opts.megabytes} MB of random bytes; sshd on loopback; {opts.repeats} repeats")
        for _ in range(opts.repeats):
            (tmp / "data-hashes.json").unlink(missing_ok=True)
            for host in lab.hosts:
                for name in ("cache", "data"):
                    shutil.rmtree(host.workdir / name, ignore_errors=True)
            for case in CASES:
                if case == CASES[2]:
                    for host in lab.hosts:
                        shutil.rmtree(host.workdir / "data")
                times[case].append(data_step(inventory, payload, tmp))
        for case in CASES:
            t = times[case]
            print(f"{case:29s} " + " ".join(f"{x:.2f}" for x in t) +
                  f" s; median {statistics.median(t):.2f} s")


if __name__ == "__main__":
    main()
