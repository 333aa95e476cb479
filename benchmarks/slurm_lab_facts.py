"""What the Slurm test lab (tests/slurmlab.py) does, measured: the facts docs/slurm-lab.md
quotes for the `--hosts slurm` work (issue 28). Prints one section per fact.

    python benchmarks/slurm_lab_facts.py [--repeats 10] [--purge]

Starts its own labs (root, Debian's slurmctld slurmd slurm-client munge) under a temporary
directory and stops them. --purge also waits out MinJobAge (a lab with MinJobAge=5 and one
with 30: several minutes).
"""
from __future__ import annotations

import argparse
import os
import select
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
import procs  # noqa: E402
from slurmlab import SlurmLab  # noqa: E402

# An agent's channel at its barest: every byte read from stdin written back to stdout.
ECHO = """\
import os, sys
loud = "--loud" in sys.argv
while True:
    data = os.read(0, 65536)
    if not data:
        break
    os.write(1, data)
    if loud:
        os.write(2, b"x\\n")
"""
TTYS = "import os; print(*(int(os.isatty(fd)) for fd in (0, 1, 2)))"


def section(title: str) -> None:
    print(f"\n## {title}", flush=True)


def ms(seconds: list[float]) -> str:
    return (f"median {statistics.median(seconds) * 1e3:.0f} ms, "
            f"min {min(seconds) * 1e3:.0f}, max {max(seconds) * 1e3:.0f} (n={len(seconds)})")


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def allocation(lab: SlurmLab, nodes: int = 2, *options: str) -> tuple[int, dict[str, str]]:
    """A job of `nodes` nodes without a shell (salloc --no-shell) and the environment whose
    SLURM_JOB_ID makes srun a step of it."""
    done = lab.run("salloc", f"-N{nodes}", "--no-shell", *options)
    job = lab._note_job(done.stderr)
    assert job is not None, done.stderr
    return job, {**lab.env(), "SLURM_JOB_ID": str(job)}


class Channel:
    """A process's stdin and stdout as one byte channel."""

    def __init__(self, argv: list[str], env: dict[str, str], stderr) -> None:
        self.proc = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=stderr)

    def round_trip(self, data: bytes, timeout: float = 5.0) -> bytes:
        os.write(self.proc.stdin.fileno(), data)
        got = b""
        deadline = time.monotonic() + timeout
        while len(got) < len(data) and time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.05)
            if ready:
                chunk = os.read(self.proc.stdout.fileno(), 1 << 20)
                if not chunk:
                    break
                got += chunk
        return got

    def close(self) -> int:
        self.proc.stdin.close()
        try:
            return self.proc.wait(timeout=15)
        finally:
            procs.end(self.proc)


def start_up(base: Path, repeats: int) -> None:
    section("Start-up and stop of a two-node lab")
    ups, downs, tracks = [], [], set()
    for i in range(repeats):
        lab = SlurmLab(base / f"up{i}")
        ups.append(timed(lab.start))
        tracks.add(lab.proctrack)
        downs.append(timed(lab.stop))
    print(f"start (munged, slurmctld, 2 slurmd; nodes idle; srun -N2 true): {ms(ups)}")
    print(f"stop (scancel all, daemons TERM, leftovers, cgroups): {ms(downs)}")
    print(f"proctrack: {', '.join(sorted(tracks))}")


def latency(lab: SlurmLab, repeats: int) -> None:
    section("srun latency")
    outside = [timed(lambda: lab.run("srun", "-w", "n1", "true")) for _ in range(repeats)]
    print(f"srun -w n1 true (a job of its own each time): {ms(outside)}")
    job, env = allocation(lab)
    inside = [timed(lambda: subprocess.run(["srun", "--overlap", "-N1", "-n1", "-w", "n1",
                                            "true"], env=env, check=True))
              for _ in range(repeats)]
    print(f"srun --overlap -N1 -n1 -w n1 true (a step of a salloc -N2 job): {ms(inside)}")
    lab.scancel(job)


def channel(lab: SlurmLab, repeats: int) -> None:
    section("An agent's channel through srun --overlap -u -N1 -n1 -w n1 python3 -c ECHO")
    job, env = allocation(lab)
    srun = ["srun", "--overlap", "-N1", "-n1", "-w", "n1"]
    ttys = subprocess.run([*srun, "-u", "python3", "-c", TTYS], env=env, capture_output=True,
                          text=True, timeout=30).stdout.split()
    print(f"with -u, isatty of the task's stdin, stdout, stderr: {' '.join(ttys)}")
    ttys = subprocess.run([*srun, "python3", "-c", TTYS], env=env, capture_output=True,
                          text=True, timeout=30).stdout.split()
    print(f"without -u:                                          {' '.join(ttys)}")
    blob = os.urandom(1 << 20)
    every_byte = bytes(range(256)) * 4
    for unbuffered in (True, False):
        ch = Channel([*srun, *(["-u"] if unbuffered else []), "python3", "-I", "-S", "-c",
                      ECHO], env, subprocess.DEVNULL)
        flag = "-u" if unbuffered else "no -u"
        partial = ch.round_trip(b"no newline", timeout=3)
        line = ch.round_trip(b"a line\n", timeout=3)
        print(f"{flag}: a partial line back: {partial!r}; then a line: {line!r}")
        if unbuffered:
            got = ch.round_trip(every_byte)
            print(f"{flag}: every byte value 0-255 (x4) back unchanged: {got == every_byte}")
            start = time.perf_counter()
            got = ch.round_trip(blob, timeout=30)
            took = time.perf_counter() - start
            print(f"{flag}: 1 MiB of random bytes back unchanged: {got == blob} "
                  f"({len(got)} bytes, {took * 1e3:.0f} ms)")
        print(f"{flag}: exit after stdin closed: {ch.close()}")

    section("stderr of the channel's task, round trips of 64 bytes")
    own = lab.dir / "own.err"
    to_own_file = ECHO.replace("import os, sys\n", "import os, sys\nfd = os.open(%r, os.O_WRONLY "
                               "| os.O_CREAT | os.O_TRUNC, 0o600)\nos.dup2(fd, 2)\n" % str(own))
    cases = [
        ("task silent on stderr (srun's stderr)", [], ECHO, False),
        ("task silent on stderr, --error=<file>", [f"--error={lab.dir}/silent.err"], ECHO,
         False),
        ("a stderr line per message, to srun's stderr", [], ECHO, True),
        ("a stderr line per message, --error=<file>", [f"--error={lab.dir}/loud.err"], ECHO,
         True),
        ("a stderr line per message, --error=/dev/null", ["--error=/dev/null"], ECHO, True),
        ("a stderr line per message, the task's fd 2 its own file", [], to_own_file, True),
    ]
    for title, extra, code, loud in cases:
        ch = Channel([*srun, "-u", *extra, "python3", "-I", "-S", "-c", code,
                      *(["--loud"] if loud else [])], env, subprocess.DEVNULL)
        ch.round_trip(b"warm up\n")
        message = b"m" * 63 + b"\n"
        trips = [timed(lambda: ch.round_trip(message)) for _ in range(repeats * 3)]
        ch.close()
        print(f"{title}: {ms(trips)}")
    lines = {name: len(_read(lab.dir / name).splitlines()) for name in ("loud.err", "own.err")}
    print(f"stderr lines in the files: {lines}")
    lab.scancel(job)

    section("A second step on a node of the allocation")
    job, env = allocation(lab, 1)
    first = subprocess.Popen(["srun", "-N1", "-n1", "sleep", "30"], env=env,
                             stderr=subprocess.DEVNULL)
    time.sleep(1)
    for overlap in ([], ["--overlap"]):
        try:
            done = subprocess.run(["srun", *overlap, "-N1", "-n1", "true"], env=env,
                                  capture_output=True, text=True, timeout=5)
            print(f"{' '.join(['srun', *overlap])} -N1 -n1 true beside a running step: exit "
                  f"{done.returncode} {done.stderr.strip()!r}")
        except subprocess.TimeoutExpired as exc:
            print(f"{' '.join(['srun', *overlap])} -N1 -n1 true beside a running step: still "
                  f"waiting after 5 s ({(exc.stderr or b'').decode().strip()!r})")
    lab.scancel(job)
    procs.end(first)


def escapes(lab: SlurmLab) -> None:
    section(f"scancel with proctrack/{lab.proctrack}, KillWait={lab._kill_wait}")
    cases = (("every process takes SIGTERM", ""),
             ("the double-forked grandchild ignores SIGTERM", ""),
             ("the job's own process ignores SIGTERM as well", "import signal\n"
              "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"))
    for i, (what, prelude) in enumerate(cases):
        code = prelude + payload(ignore_term=i > 0)
        job = lab.sbatch(f"#!/bin/sh\nexec python3 - --wait <<'EOF'\n{code}EOF\n", "-w", "n1")
        out = lab.dir / f"job-{job}.out"
        deadline = time.monotonic() + 20
        while "escaped " not in _read(out) and time.monotonic() < deadline:
            time.sleep(0.1)
        line = next(t for t in _read(out).splitlines() if t.startswith("escaped "))
        names = dict(zip(map(int, line.split()[1:]), ("setsid child", "double-forked grandchild")))
        pids = sorted(names)
        start = time.monotonic()
        lab.scancel(job)
        left = pids
        while left and time.monotonic() - start < 15:
            time.sleep(0.05)
            left = [p for p in pids if _alive(p)]
        took = time.monotonic() - start
        if left:
            print(f"{what}: {', '.join(names[p] for p in left)} still alive {took:.0f} s "
                  "after scancel (killed now)")
            for pid in left:
                os.kill(pid, 9)
        else:
            print(f"{what}: the setsid child and the double-forked grandchild gone "
                  f"{took:.2f} s after scancel")
        info = lab.wait_job(job, {"CANCELLED"})
        print(f"  scontrol: JobState={info['JobState']} ExitCode={info['ExitCode']}")


def payload(ignore_term: bool) -> str:
    """procs.py's ESCAPING_PAYLOAD, its grandchild ignoring SIGTERM or not."""
    text = procs.ESCAPING_PAYLOAD
    return text if ignore_term else text.replace(
        "        signal.signal(signal.SIGTERM, signal.SIG_IGN)\n", "")


def allocation_env(lab: SlurmLab) -> None:
    section("salloc -N2: SLURM_* in the shell's environment (salloc -N2 env)")
    show = subprocess.run(["salloc", "-N2", "env"], env=lab.env(), capture_output=True,
                          text=True, timeout=60)
    for line in sorted(show.stdout.splitlines()):
        if line.startswith(("SLURM_", "SLURMD_")):
            print(line)
    for options in (["--ntasks-per-node=2"], ["--ntasks=5"]):
        section(f"salloc -N2 {' '.join(options)}: SLURM_TASKS_PER_NODE, SLURM_NTASKS")
        show = subprocess.run(["salloc", "-N2", *options, "env"], env=lab.env(),
                              capture_output=True, text=True, timeout=60)
        for line in sorted(show.stdout.splitlines()):
            if line.startswith(("SLURM_TASKS_PER_NODE", "SLURM_NTASKS", "SLURM_JOB_CPUS")):
                print(line)
    section("A step's own variables (srun -N2 inside salloc -N2), per task")
    show = subprocess.run(["salloc", "-N2", "srun", "sh", "-c",
                           'echo "$SLURMD_NODENAME $SLURM_NODEID $SLURM_PROCID $SLURM_LOCALID '
                           '$SLURM_STEP_NODELIST $SLURM_STEP_ID $SLURM_TOPOLOGY_ADDR '
                           '$(hostname)"'],
                          env=lab.env(), capture_output=True, text=True, timeout=60)
    print("SLURMD_NODENAME SLURM_NODEID SLURM_PROCID SLURM_LOCALID SLURM_STEP_NODELIST "
          "SLURM_STEP_ID SLURM_TOPOLOGY_ADDR hostname")
    print("\n".join(sorted(show.stdout.splitlines())))

    section("scontrol")
    for argv in (["scontrol", "show", "hostnames", "n[1-2]"],
                 ["scontrol", "show", "hostnames", "n1,n2"],
                 ["scontrol", "show", "node", "n1"],
                 ["scontrol", "--oneliner", "show", "node", "n1"]):
        print(f"$ {' '.join(argv)}")
        print(lab.run(*argv).stdout.rstrip())


def job_reports(lab: SlurmLab) -> None:
    section("scontrol show job of ended jobs")
    first = None
    for title, script in (("exit 0", "#!/bin/sh\ntrue\n"), ("exit 3", "#!/bin/sh\nexit 3\n"),
                          ("killed by SIGKILL", "#!/bin/sh\nkill -9 $$\n")):
        job = lab.sbatch(script)
        first = first or job
        info = lab.wait_job(job, {"COMPLETED", "FAILED", "CANCELLED"})
        print(f"{title}: JobState={info['JobState']} Reason={info['Reason']} "
              f"ExitCode={info['ExitCode']} DerivedExitCode={info.get('DerivedExitCode')}")
    job = lab.sbatch("#!/bin/sh\nsleep 60\n")
    lab.wait_job(job, {"RUNNING"})
    lab.scancel(job)
    info = lab.wait_job(job, {"CANCELLED"})
    print(f"scancel of a running job: JobState={info['JobState']} Reason={info['Reason']} "
          f"ExitCode={info['ExitCode']}")
    for ended in (first, job):
        print(f"$ scontrol show job {ended}  (lines with JobState, ExitCode, times)")
        for line in lab.run("scontrol", "show", "job", str(ended)).stdout.splitlines():
            if any(k in line for k in ("JobState", "ExitCode", "RunTime", "StartTime")):
                print(line)
    job = lab.sbatch("#!/bin/sh\nsleep 60\n", "--begin=now+1hour")
    lab.scancel(job)
    info = lab.wait_job(job, {"CANCELLED"})
    print(f"scancel of a pending job: JobState={info['JobState']} Reason={info['Reason']} "
          f"ExitCode={info['ExitCode']}")

    section("SIGKILL of salloc")
    proc = subprocess.Popen(["salloc", "-N1", "sleep", "60"], env=lab.env(),
                            stderr=subprocess.PIPE, text=True)
    line = proc.stderr.readline()
    while "Granted" not in line:
        line = proc.stderr.readline()
    job = lab._note_job(line)
    proc.kill()
    proc.wait()
    time.sleep(2)
    print(f"job {job} 2 s after SIGKILL of its salloc: {lab.job_state(job)}")
    lab.scancel(job)


def purge(base: Path) -> None:
    for age in (5, 30):
        section(f"MinJobAge={age}: how long an ended job stays visible")
        with SlurmLab(base / f"purge{age}", min_job_age=age) as lab:
            job = lab.sbatch("#!/bin/sh\ntrue\n")
            lab.wait_job(job, {"COMPLETED"})
            ended = time.monotonic()
            while lab.job(job) is not None and time.monotonic() - ended < 400:
                time.sleep(0.5)
            print(f"completed job forgotten by scontrol {time.monotonic() - ended:.0f} s "
                  "after it was first seen COMPLETED")


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    try:
        return procs._state(str(pid)) != "Z"
    except OSError:
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--purge", action="store_true", help="also wait out MinJobAge")
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="slurmfacts-") as tmp:
        base = Path(tmp)
        start_up(base, opts.repeats)
        with SlurmLab(base / "main") as lab:
            latency(lab, opts.repeats)
            channel(lab, opts.repeats)
            escapes(lab)
            allocation_env(lab)
            job_reports(lab)
        if lab.proctrack == "cgroup":
            with SlurmLab(base / "linuxproc", proctrack="linuxproc") as other:
                escapes(other)
        if opts.purge:
            purge(base)


if __name__ == "__main__":
    main()
