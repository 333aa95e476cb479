"""Many hosts: `inv check` and `inv train` of a trivial payload (a script that prints and
exits, no TensorFlow) on 16 and 64 SSH lab hosts, against the same number of parallel
`ssh host python3 noop.py` (OpenSSH, one ssh_config, strict known_hosts).

Per repeat, alternating: parallel ssh, `inv check`, `inv train` (checks included). Prints
medians and each one's ratio to parallel ssh, and how many CPU-seconds the whole machine was
busy during each (/proc/stat): with every lab host on the same cores, a run's time follows the
work all of its processes do, and the share of the cores left idle. That work is split in two:
this side's (the ssh clients, or the controller) and the hosts' (every session the lab's sshd
servers ended: its login, shell, agent and tasks).

`--key-type rsa` logs both sides in with a 3072-bit RSA key (`ssh-keygen -t rsa`'s default,
still many users' `~/.ssh/id_rsa`) instead of the lab's Ed25519 one: loading an RSA key costs
a Python client far more CPU than an Ed25519 one.

    python benchmarks/bench_hosts.py [--repeats 3] [--hosts 16 64] [--key-type rsa]
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

from bench_train import REPO, line

sys.path.insert(0, str(REPO / "tests"))
from sshlab import SshLab  # noqa: E402

FIRST_OCTET = 150    # away from the test lab's 127.0.0.2, .3, ... and the other benchmarks'
NOOP = "print('noop')\n"


def ssh_config(lab: SshLab, hosts, path: Path) -> Path:
    lines = []
    for host in hosts:
        lines += [f"Host {host.name}", f"  HostName {host.address}", f"  Port {host.port}"]
    lines += ["Host *", f"  User {lab.user}", f"  IdentityFile {lab.identity_file}",
              "  IdentitiesOnly yes", f"  UserKnownHostsFile {lab.known_hosts}",
              "  StrictHostKeyChecking yes", "  BatchMode yes"]
    path.write_text("\n".join(lines) + "\n")
    return path


def parallel_ssh(config: Path, hosts, noop: Path) -> float:
    started = time.monotonic()
    procs = [subprocess.Popen(["ssh", "-F", str(config), host.name, sys.executable, str(noop)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for host in hosts]
    outputs = [p.communicate() for p in procs]
    elapsed = time.monotonic() - started
    failed = [(h.name, err) for h, p, (_, err) in zip(hosts, procs, outputs) if p.returncode]
    if failed:
        raise SystemExit(f"ssh failed on {len(failed)} host(s): {failed[:3]}")
    return elapsed


def inv(*args: str) -> float:
    """`inv ARGS`'s seconds (run_inv)."""
    started = time.monotonic()
    run_inv(*args)
    return time.monotonic() - started


def run_inv(*args: str, env: dict[str, str] | None = None,
            running: Callable[[int], None] | None = None) -> resource.struct_rusage:
    """`inv ARGS` in the repository, with `env` (default: this environment) and its output
    kept; `running(pid)` is called once it has started. Its resource usage; a benchmark that
    cannot go on (SystemExit with the end of its output) when it failed."""
    proc = subprocess.Popen([sys.executable, "-m", "invoke", *args], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if running is not None:
        running(proc.pid)
    output = proc.stdout.read()
    # wait4, not wait: the usage is that of this one process tree.
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"inv {args[0]} failed ({proc.returncode}):\n"
                         f"{output.decode(errors='replace')[-6000:]}")
    return usage


def busy_seconds() -> float:
    """CPU-seconds the machine's cores have been busy since boot (all but idle and iowait)."""
    ticks = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def hosts_seconds(sshd_pids: list[int]) -> float:
    """CPU-seconds of the sessions the lab's sshd servers have ended and reaped (their
    children's, /proc/PID/stat cutime and cstime): the logins, shells, agents and tasks."""
    ticks = 0
    for pid in sshd_pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks += int(fields[13]) + int(fields[14])
    return ticks / os.sysconf("SC_CLK_TCK")


def own_seconds() -> float:
    """CPU-seconds of this process's ended children (the ssh clients, or inv)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


# The moment an ended session takes to be reaped by its sshd, and counted there.
REAPED = 0.3


def busy_during(run: Callable[[], float], busy: dict[str, list[float]],
                sshd_pids: list[int]) -> float:
    """`run()`'s own result; the machine's busy CPU-seconds meanwhile, and this side's and the
    hosts' share of them, appended to `busy`."""
    before = busy_seconds(), own_seconds(), hosts_seconds(sshd_pids)
    elapsed = run()
    time.sleep(REAPED)
    after = busy_seconds(), own_seconds(), hosts_seconds(sshd_pids)
    for key, was, now in zip(("machine", "own", "hosts"), before, after):
        busy[key].append(now - was)
    return elapsed


def measure(count: int, repeats: int, tmp: Path, key_type: str = "ed25519") -> None:
    with SshLab(tmp / f"lab{count}-{key_type}", first_octet=FIRST_OCTET,
                key_type=key_type) as lab:
        hosts = lab.start(count)
        inventory = lab.write_inventory(tmp / f"hosts{count}.yaml", hosts)
        config = ssh_config(lab, hosts, tmp / f"ssh_config{count}")
        payload = tmp / "payload"
        payload.mkdir(exist_ok=True)
        (payload / "noop.py").write_text(NOOP)
        ssh, check, train = [], [], []
        busy = {side: {"machine": [], "own": [], "hosts": []}
                for side in ("ssh", "check", "train")}
        sshd = lab.pids
        for _ in range(repeats):
            ssh.append(busy_during(lambda: parallel_ssh(config, hosts, payload / "noop.py"),
                                   busy["ssh"], sshd))
            check.append(busy_during(lambda: inv("check", "--hosts", str(inventory)),
                                     busy["check"], sshd))
            train.append(busy_during(lambda: inv(
                "train", "--hosts", str(inventory), "--payload", str(payload), "--entry",
                "noop.py", "--runs-dir", str(tmp / "runs")), busy["train"], sshd))
    s = statistics.median(ssh)
    print(f"{count} SSH hosts on loopback, a client key of type {key_type}; {repeats} repeats, "
          "alternating")
    print(line(f"{count} parallel ssh python3 noop.py:", ssh, 40))
    print(line("inv check:", check, 40))
    print(line("inv train (trivial payload):", train, 40))
    print(f"ratio inv check / parallel ssh: {statistics.median(check) / s:.2f}x; "
          f"inv train / parallel ssh: {statistics.median(train) / s:.2f}x")
    cores = os.cpu_count() or 1
    shown, split = [], []
    for what, key, times in (("parallel ssh", "ssh", ssh), ("inv check", "check", check),
                             ("inv train", "train", train)):
        spent = statistics.median(busy[key]["machine"])
        shown.append(f"{what} {spent:.2f} s ({spent / (statistics.median(times) * cores):.0%})")
        split.append(f"{what} {statistics.median(busy[key]['own']):.2f} + "
                     f"{statistics.median(busy[key]['hosts']):.2f} s")
    print(f"machine busy, CPU-seconds (share of its {cores} cores' time): " + ", ".join(shown))
    print("CPU-seconds of the ssh clients or the controller + of the hosts' sessions: "
          + ", ".join(split), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--hosts", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--key-type", choices=("ed25519", "rsa"), default="ed25519",
                        help="the client key both sides log in with")
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-hosts-") as tmp:
        for count in opts.hosts:
            measure(count, opts.repeats, Path(tmp), opts.key_type)


if __name__ == "__main__":
    main()
