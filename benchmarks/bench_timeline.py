"""Where a trivial run's time goes: `inv train` of a payload that prints and exits (no
TensorFlow, checks included, unchanged since a warm-up run) on 4, 16, 64 or 256 SSH lab hosts,
phase by phase on the controller's own clock (deploy/timeline.py), with its peak memory and
threads, and the same hosts' parallel `ssh host python3 noop.py` for scale.

Per repeat, alternating: parallel ssh, then `inv train`. Prints, per phase, the median time
from the controller's start at which it ended (per-host phases: when the last host's ended),
what it added to the one before, and how busy the machine's cores were meanwhile (/proc/stat,
sampled every 10 ms: with every lab host on the same cores, a phase below 100% waited on
something other than the CPU; the kernel counts in ticks of 10 ms, so a phase of a few tens of
milliseconds reads coarsely, even above 100%).

    python benchmarks/bench_timeline.py [--repeats 3] [--hosts 4 16 64 256] [--shared]
    python benchmarks/bench_timeline.py --start-cost [--repeats 9]

--start-cost prints instead the CPU time (user + system, medians) of what starts once per run
or once per host or task: the controller's imports, a host's agent up to its first beat and a
task's supervisor (of `/bin/true`), beside a bare `python -I -S -c pass`; and of one mesh
check connection (both of its ends, in one process), which a lab of N hosts on one machine
pays N * (N - 1) times, with the share of it spent in the kernel; and of a run's host key
checks, 64 hosts against a user's known_hosts of 2,000 hashed lines and 256 against one of
256 (each login looks itself up in every line).
"""
from __future__ import annotations

import argparse
import base64
import hmac
import io
import json
import os
import resource
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench_hosts import NOOP, busy_seconds, parallel_ssh, run_inv, ssh_config
from bench_train import REPO

sys.path.insert(0, str(REPO / "tests"))
from sshlab import SshLab  # noqa: E402

# 127.0.1.1 upwards (127.0.2.2 for 256 hosts): away from the tests' and other benchmarks' labs.
NETWORK, FIRST_OCTET = 1, 1
# In the order a run goes through them; a phase a run did not mark is left out.
PHASES = ("imports", "plan", "login", "agent", "probe", "mesh", "push", "launch",
          "first follow answer", "tasks ended", "teardown", "exit")


def train(inventory: Path, payload: Path, runs: Path, marks: Path,
          ) -> tuple[dict, dict, dict]:
    """One `inv train`: {phase: seconds from its start}; its peak RSS (KiB), peak threads and
    CPU seconds; and {phase: the share of the machine's cores busy during it}."""
    marks.unlink(missing_ok=True)
    threads, busy = [0], []
    running = threading.Event()
    sampler = threading.Thread(target=_sample_busy, args=(busy, running), daemon=True)

    def sample(pid: int) -> None:
        threading.Thread(target=_sample_threads, args=(pid, threads), daemon=True).start()
    started = time.time()
    running.set()
    sampler.start()
    try:
        usage = run_inv("train", "--hosts", str(inventory), "--payload", str(payload),
                        "--entry", "noop.py", "--runs-dir", str(runs),
                        env=dict(os.environ, TFDEPLOY_TIMELINE=str(marks)), running=sample)
    finally:
        running.clear()
        sampler.join()
    ended = time.time()
    phases: dict[str, float] = {}
    for line in marks.read_text().splitlines():
        mark = json.loads(line)
        phases[mark["phase"]] = max(phases.get(mark["phase"], 0.0), mark["t"] - started)
    phases["exit"] = ended - started
    return phases, {"rss": usage.ru_maxrss, "threads": threads[0],
                    "cpu": usage.ru_utime + usage.ru_stime}, busy_shares(phases, busy, started)


def _sample_busy(samples: list, running: threading.Event) -> None:
    """(wall-clock time, the machine's busy CPU-seconds) every 10 ms while `running`."""
    while running.is_set():
        samples.append((time.time(), busy_seconds()))
        time.sleep(0.01)
    samples.append((time.time(), busy_seconds()))


def busy_shares(phases: dict[str, float], samples: list, started: float) -> dict[str, float]:
    """Per phase, the share of the machine's cores' time that was busy between the samples
    nearest its start (the previous phase's end) and its end; a phase shorter than two
    samples has none."""
    cores, shares, begin = os.cpu_count() or 1, {}, 0.0
    for phase, end in sorted(phases.items(), key=lambda item: item[1]):
        inside = [s for s in samples if started + begin <= s[0] <= started + end]
        if len(inside) >= 2 and inside[-1][0] > inside[0][0]:
            shares[phase] = (inside[-1][1] - inside[0][1]) / (
                (inside[-1][0] - inside[0][0]) * cores)
        begin = end
    return shares


def _sample_threads(pid: int, peak: list) -> None:
    status = Path(f"/proc/{pid}/status")
    while True:
        try:
            text = status.read_text()
        except OSError:
            return
        for line in text.splitlines():
            if line.startswith("Threads:"):
                peak[0] = max(peak[0], int(line.split()[1]))
        time.sleep(0.05)


def measure(count: int, repeats: int, shared: bool, tmp: Path) -> None:
    with SshLab(tmp / f"lab{count}", first_octet=FIRST_OCTET, network=NETWORK) as lab:
        hosts = lab.start(count)
        if shared:
            hosts = lab.sharing_workdir(hosts)
        inventory = lab.write_inventory(tmp / f"hosts{count}.yaml", hosts)
        config = ssh_config(lab, hosts, tmp / f"ssh_config{count}")
        payload = tmp / "payload"
        payload.mkdir(exist_ok=True)
        (payload / "noop.py").write_text(NOOP)
        runs, marks = tmp / "runs", tmp / "timeline.jsonl"
        train(inventory, payload, runs, marks)          # the payload is then on every host
        ssh, runs_phases, usages, shares = [], [], [], []
        for _ in range(repeats):
            ssh.append(parallel_ssh(config, hosts, payload / "noop.py"))
            phases, usage, busy = train(inventory, payload, runs, marks)
            runs_phases.append(phases)
            usages.append(usage)
            shares.append(busy)
    where = "sharing one workdir" if shared else "each with its own workdir"
    print(f"{count} SSH hosts on loopback, {where}; {repeats} repeats, alternating; "
          f"medians")
    print(f"  {count} parallel ssh python3 noop.py: {statistics.median(ssh):.2f} s")
    before = 0.0
    for phase in PHASES:
        times = [p[phase] for p in runs_phases if phase in p]
        if len(times) < len(runs_phases):
            continue
        at = statistics.median(times)
        busy = [b[phase] for b in shares if phase in b]
        print(f"  {phase:<22} ended at {at:6.2f} s  (+{at - before:5.2f} s)" + (
            f"  cores busy {statistics.median(busy):4.0%}" if busy else ""))
        before = at
    total = statistics.median(p["exit"] for p in runs_phases)
    print(f"  inv train / parallel ssh: {total / statistics.median(ssh):.2f}x; the controller: "
          f"peak memory {max(u['rss'] for u in usages) / 1024:.0f} MiB, peak threads "
          f"{max(u['threads'] for u in usages)}, CPU "
          f"{statistics.median(u['cpu'] for u in usages):.2f} s", flush=True)


def cpu_ms(argv: list[str], stdin: bytes | None, repeats: int) -> float:
    """Median CPU milliseconds of a process, fed `stdin` until its first line of output."""
    spent = []
    for _ in range(repeats):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        proc = subprocess.Popen(argv, cwd=REPO, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        if stdin:
            proc.stdin.write(stdin)
            proc.stdin.flush()
            proc.stdout.readline()
        proc.stdin.close()
        proc.stdout.read()
        proc.wait()
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        spent.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return statistics.median(spent) * 1000


def start_costs(repeats: int) -> None:
    sys.path.insert(0, str(REPO))
    from deploy.cluster.hostagent import boot_stdin
    from deploy.host import boot
    from deploy.host.layout import agent_code_dir
    from deploy.host.supervisor import supervisor_command
    from deploy.plan.planner import AGENT_BOOT
    agent = [sys.executable, "-I", "-S", "-c", AGENT_BOOT]
    with tempfile.TemporaryDirectory(prefix="bench-start-") as tmp:
        fresh, kept = f"{tmp}/fresh", f"{tmp}/kept"
        stdin = boot_stdin(kept)
        # The kept code as a run's push leaves it (boot.py SourcesInMemory.keep).
        Path(kept, "cache").mkdir(parents=True)
        skip = len(stdin[:stdin.index(b"\n") + 1]) + int(stdin[:stdin.index(b"\n")])
        boot.importer_of(io.BytesIO(stdin[skip:])).keep()
        assert list(Path(agent_code_dir(kept)).iterdir())
        # A supervisor of worker 0 in a run directory (tasks.py launch).
        rundir = Path(tmp, "run")
        rundir.mkdir()
        supervisor = supervisor_command(str(rundir), "0", ["/bin/true"])
        print(f"CPU time, medians of {repeats}")
        for what, argv, stdin in (
                ("python -I -S -c pass", [sys.executable, "-I", "-S", "-c", "pass"], None),
                ("controller's imports (import tasks)", [sys.executable, "-c", "import tasks"],
                 None),
                ("agent to its first beat, compiling", agent, boot_stdin(fresh)),
                ("agent to its first beat, kept code", agent, boot_stdin(kept)),
                ("a task's supervisor of /bin/true", supervisor, None)):
            print(f"  {what:<40} {cpu_ms(argv, stdin, repeats):6.0f} ms"
                  + (f"  ({len(stdin)} bytes sent)" if stdin else ""), flush=True)
    spent = [mesh_connection_us(500) for _ in range(repeats)]
    print(f"  {'a mesh check connection (both ends)':<40} "
          f"{statistics.median(u + s for u, s in spent):6.0f} us  (in the kernel "
          f"{statistics.median(s for _, s in spent):.0f} us)", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-known-hosts-") as tmp:
        for lines, hosts in ((2000, 64), (256, 256)):
            spent = known_hosts_ms(Path(tmp, "known_hosts"), lines, hosts, repeats)
            print(f"  {f'host key lookups of {hosts} hosts':<40} {spent:6.0f} ms  (in a "
                  f"known_hosts of {lines} hashed lines)", flush=True)


# The host key checks of one run's logins, in a process of their own (as a run's are: the
# first one reads the file): CPU milliseconds.
KNOWN_HOSTS_LOOKUPS = """
import sys, time
from deploy.inventory.sshconfig import Hop
from deploy.transport.hostkeys import OpenSshCheck
file, hosts = sys.argv[1], int(sys.argv[2])
started = time.process_time()
for i in range(hosts):
    hop = Hop(f"h{i}", f"10.1.{i // 250}.{i % 250 + 1}", 22)
    assert OpenSshCheck(f"h{i}", hop, (file,), False).known
print((time.process_time() - started) * 1000)
"""


def known_hosts_ms(path: Path, lines: int, hosts: int, repeats: int) -> float:
    """Median CPU milliseconds of `hosts` host key checks (transport/hostkeys.py) against a
    known_hosts of `lines` hashed lines (HashKnownHosts, Debian's default), the hosts among
    them."""
    names = [f"10.1.{i // 250}.{i % 250 + 1}" for i in range(lines)]
    kind = b"ssh-ed25519"
    blob = base64.b64encode(struct.pack(">I", len(kind)) + kind + struct.pack(">I", 32)
                            + os.urandom(32)).decode()
    with path.open("w") as out:
        for name in names:
            salt = os.urandom(20)
            digest = hmac.new(salt, name.encode(), "sha1").digest()
            out.write(f"|1|{base64.b64encode(salt).decode()}|"
                      f"{base64.b64encode(digest).decode()} ssh-ed25519 {blob}\n")
    spent = [float(subprocess.run([sys.executable, "-c", KNOWN_HOSTS_LOOKUPS, str(path),
                                   str(hosts)], cwd=REPO, check=True, capture_output=True,
                                  text=True).stdout) for _ in range(repeats)]
    return statistics.median(spent)


def mesh_connection_us(count: int) -> tuple[float, float]:
    """CPU microseconds per connection of `count` mesh check connections (deploy/host/probe.py:
    a listener's serve and dial_all's dialer) to one listener in this process: (user,
    system). The system part is the kernel's TCP work, which no change in Python takes away."""
    from deploy.host import probe
    listener, anywhere = probe.any_address_socket()
    listener.bind((anywhere, 0))
    listener.listen(1024)
    port = listener.getsockname()[1]
    counts, lock = {"stop": False, port: 0}, threading.Lock()
    server = threading.Thread(target=probe.serve, daemon=True,
                              args=({listener: port}, "h1", "n1", counts, lock))
    server.start()
    started = resource.getrusage(resource.RUSAGE_SELF)
    results, dialer = probe.dial_all([("127.0.0.1", port, "h1")] * count, "n1", 1.0,
                                     lambda now: now + 10)
    dialer.join()
    ended = resource.getrusage(resource.RUSAGE_SELF)
    counts["stop"] = True
    listener.shutdown(socket.SHUT_RDWR)
    server.join()
    listener.close()
    if not all(r and r.get("ok") for r in results):
        raise SystemExit(f"a mesh check connection failed: {results}")
    return ((ended.ru_utime - started.ru_utime) / count * 1e6,
            (ended.ru_stime - started.ru_stime) / count * 1e6)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--hosts", type=int, nargs="+", default=[4, 16, 64, 256])
    parser.add_argument("--shared", action="store_true",
                        help="every host's workdir is the first host's (one shared home)")
    parser.add_argument("--start-cost", action="store_true",
                        help="the CPU time of the controller's and an agent's start instead")
    opts = parser.parse_args()
    if opts.start_cost:
        start_costs(opts.repeats)
        return
    with tempfile.TemporaryDirectory(prefix="bench-timeline-") as tmp:
        for count in opts.hosts:
            measure(count, opts.repeats, opts.shared, Path(tmp))


if __name__ == "__main__":
    main()
