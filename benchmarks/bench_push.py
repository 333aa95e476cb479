"""The incremental payload push against `rsync -a`, both over the same four sshd servers.

A payload of FILES files of random bytes (default 1,000 files, 100 MB) is pushed three ways,
each by both sides, alternating: a first push (empty host caches / empty rsync targets), a
push with nothing changed, and a push after one file changed. Our side is what `inv train`
does before it starts tasks: connect, hash the payload (files unchanged since the last push
by their stat are not read again, as rsync does not read them), ask each host what it lacks, send only
that, assemble payload/ on every host; it is timed from before the SSH connections to the end
of the push. rsync runs as four `rsync -a -e "ssh ..."` processes in parallel, one per host,
strict about host keys as we are. Prints each time, the medians and the ratios ours / rsync.

Also the CPU seconds each side used (medians), which move much less with the machine's load than
the times do: this machine (the controller process, or rsync's local rsync and ssh processes)
and the hosts (every sshd session with what it ran, read from the lab's sshd listeners once
they reaped them). Our teardown of the run directory is left out of both.

    python benchmarks/bench_push.py [--repeats 3] [--files 1000] [--megabytes 100]
"""
from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))
from deploy.inventory.load import load_inventory  # noqa: E402
from deploy.plan.planner import Options, plan_run  # noqa: E402
from deploy.push.payload import PayloadPush  # noqa: E402
from deploy.state.record import new_run_id  # noqa: E402
from deploy.cluster.session import Session  # noqa: E402
from sshlab import SshLab  # noqa: E402

HOSTS = 4
FIRST_OCTET = 60     # away from the test lab's 127.0.0.2, .3, ...
CASES = ("first push", "no change", "one file changed")


def make_payload(root: Path, files: int, total: int) -> None:
    (root / "data").mkdir(parents=True)
    (root / "train.py").write_text("print('bench')\n")
    size = total // files
    for i in range(files - 1):
        (root / "data" / f"part-{i:04d}.bin").write_bytes(os.urandom(size))


def host_cpu(lab: SshLab) -> float:
    """CPU seconds of every sshd session the lab's listeners have reaped (with its children)."""
    total = 0
    for pid in lab.pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[13]) + int(fields[14])            # cutime, cstime
    return total / os.sysconf("SC_CLK_TCK")


def local_cpu(children: bool) -> float:
    t = os.times()
    return t.children_user + t.children_system if children else t.user + t.system


def ours(lab: SshLab, inventory: Path, payload: Path, hashes: Path) -> tuple[float, float, float]:
    quiet = Console(file=open(os.devnull, "w"))
    cpu, hosts = local_cpu(False), host_cpu(lab)
    started = time.monotonic()
    inv = load_inventory(str(inventory))
    run_id = new_run_id()
    push = PayloadPush(payload, "train.py", run_id, hash_cache=hashes)   # as inv train does
    plan = plan_run(inv, Options(payload=str(payload)), run_id)
    session = Session.open(inv, 10.0, False)
    try:
        push.send(session, plan, quiet.status, lambda line: None)
        elapsed = time.monotonic() - started
        cpu = local_cpu(False) - cpu
    finally:
        session.close()
    hosts = reaped(lab) - hosts
    session = Session.open(inv, 10.0, False)
    try:
        problems = session.cleanup(plan)          # the run dir goes; the cache stays
        if problems:
            raise SystemExit(f"cleanup: {problems}")
    finally:
        session.close()
    reaped(lab)
    return elapsed, cpu, hosts


def reaped(lab: SshLab) -> float:
    """host_cpu once the sessions just closed have ended and been reaped."""
    time.sleep(0.3)
    return host_cpu(lab)


def rsync(lab: SshLab, payload: Path) -> tuple[float, float, float]:
    cpu, hosts = local_cpu(True), host_cpu(lab)
    started = time.monotonic()
    procs = []
    for host in lab.hosts:
        ssh = (f"ssh -i {lab.identity_file} -o UserKnownHostsFile={lab.known_hosts} "
               f"-o StrictHostKeyChecking=yes -o BatchMode=yes -p {host.port}")
        dest = f"{lab.user}@{host.address}:{host.workdir}/rsync-target/"
        procs.append(subprocess.Popen(["rsync", "-a", "-e", ssh, f"{payload}/", dest]))
    codes = [p.wait() for p in procs]
    elapsed = time.monotonic() - started
    if any(codes):
        raise SystemExit(f"rsync failed: {codes}")
    return elapsed, local_cpu(True) - cpu, reaped(lab) - hosts


def reset(lab: SshLab, hashes: Path, trash: Path) -> None:
    """Empty host caches, rsync targets and our remembered hashes: the next push is a first
    push for both sides, reading every file. The old ones are moved into `trash`, deleted
    only at the end: on a filesystem without a journal (this machine's) ext4 does not reuse an
    inode freed in the last minute or more, and creating a file scans past every such inode
    of its block group, which made the first push after deleting 8,000 files largely a
    measure of that scan (2-6 ms per file created, for both sides)."""
    hashes.unlink(missing_ok=True)
    for host in lab.hosts:
        host.workdir.mkdir(parents=True, exist_ok=True)
        for name in ("cache", "rsync-target"):
            if (host.workdir / name).exists():
                trash.mkdir(exist_ok=True)
                (host.workdir / name).rename(trash / f"{len(list(trash.iterdir()))}")
        (host.workdir / "rsync-target").mkdir()


def size_options(description: str, files: int, megabytes: int) -> argparse.Namespace:
    """--repeats, --files and --megabytes; and SIGTERM made to unwind like Ctrl-C, so the
    lab's sshd servers are stopped on the way out."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--files", type=int, default=files)
    parser.add_argument("--megabytes", type=int, default=megabytes)
    opts = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    return opts


def main() -> None:
    opts = size_options(__doc__.splitlines()[0], files=1000, megabytes=100)
    times: dict[tuple[str, str], list[tuple[float, float, float]]] = {
        (c, s): [] for c in CASES for s in ("ours", "rsync")}
    with tempfile.TemporaryDirectory(prefix="bench-push-") as tmp, \
            SshLab(Path(tmp) / "lab", first_octet=FIRST_OCTET) as lab:
        lab.start(HOSTS)
        inventory = lab.write_inventory(Path(tmp) / "hosts.yaml", lab.hosts)
        payload = Path(tmp) / "payload"
        hashes = Path(tmp) / "payload-hashes.json"
        make_payload(payload, opts.files, opts.megabytes * 1_000_000)
        print(f"payload: {opts.files} files, {opts.megabytes} MB of random bytes; "
              f"{HOSTS} sshd hosts on loopback; {opts.repeats} repeats, alternating")
        for repeat in range(opts.repeats):
            reset(lab, hashes, Path(tmp) / "trash")
            for case in CASES:
                if case == "one file changed":
                    victim = payload / "data" / f"part-{repeat:04d}.bin"
                    victim.write_bytes(os.urandom(victim.stat().st_size))
                # Alternate which side goes first, so caches warmed by one do not favour it.
                order = ("ours", "rsync") if repeat % 2 == 0 else ("rsync", "ours")
                for side in order:
                    times[(case, side)].append(ours(lab, inventory, payload, hashes)
                                               if side == "ours" else rsync(lab, payload))
        for case in CASES:
            o, r = times[(case, "ours")], times[(case, "rsync")]
            mo, mr = (statistics.median(t for t, _, _ in side) for side in (o, r))
            print(f"{case:17s} ours  " + " ".join(f"{t:.2f}" for t, _, _ in o)
                  + f" s; median {mo:.2f} s")
            print(f"{'':17s} rsync " + " ".join(f"{t:.2f}" for t, _, _ in r)
                  + f" s; median {mr:.2f} s")
            print(f"{'':17s} ratio ours / rsync: {mo / mr:.2f}x")
            for name, side in (("ours", o), ("rsync", r)):
                here, hosts = (statistics.median(x[i] for x in side) for i in (1, 2))
                print(f"{'':17s} cpu {name:5s} here {here:.2f} s, hosts {hosts:.2f} s "
                      f"(medians)")


if __name__ == "__main__":
    main()
