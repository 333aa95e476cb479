"""Runs on a real two-node Slurm (tests/slurmlab.py: n1 at 127.0.5.1, n2 at 127.0.5.2):
`--hosts slurm` inside `salloc`, `inv submit`, and a submitted run cancelled mid-training.
The nodes are on this machine and share its home, as a lab's nodes share theirs over NFS:
the workdir is shared, the payload travels once. Skipped, saying why, where Slurm's packages
are missing or the tests do not run as root."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

import procs
from slurmlab import SlurmLab, missing

pytestmark = pytest.mark.skipif(missing() is not None, reason=missing() or "")

REPO = Path(__file__).resolve().parents[2]
PAYLOAD = REPO / "payload"
INV = [sys.executable, "-m", "invoke", "--search-root", str(REPO)]


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory):
    with SlurmLab(tmp_path_factory.mktemp("slurm")) as lab:
        yield lab


def inv(lab: SlurmLab, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*INV, *args], env=lab.env(), capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, stdin=subprocess.DEVNULL,
                          preexec_fn=procs.default_signals)


def the_run(runs: Path) -> Path:
    (run_dir,) = [p for p in runs.iterdir() if p.is_dir()]
    return run_dir


def no_step_left(lab: SlurmLab, job: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while lab.run("squeue", "--noheader", "--steps", f"--jobs={job}",
                  check=False).stdout.strip():
        assert time.monotonic() < deadline, "a job step of the run is left"
        time.sleep(0.2)


def test_outside_an_allocation_it_says_one_is_needed(lab, tmp_path):
    done = inv(lab, "train", "--hosts", "slurm", "--runs-dir", str(tmp_path / "runs"))
    assert done.returncode == 2, done.stdout + done.stderr
    said = " ".join((done.stdout + done.stderr).split())
    assert "the Slurm allocation it runs in, and there is none here" in said, said
    assert "salloc -N2 inv train --hosts slurm" in said and "inv submit" in said, said
    assert not (tmp_path / "runs").exists()


def test_a_dry_run_takes_an_allocation_given_by_hand(lab):
    env = {**lab.env(), "SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "gpu[07-08],cpu1",
           "SLURM_TASKS_PER_NODE": "2(x2),1"}
    env.pop("SLURM_CONF")
    done = subprocess.run([*INV, "train", "--hosts", "slurm", "--dry-run"], env=env,
                          capture_output=True, text=True, cwd=REPO, timeout=60)
    assert done.returncode == 0, done.stderr
    cluster = json.loads(re.search(r"^cluster: (.*)$", done.stdout, re.M).group(1))
    assert cluster["worker"] == ["gpu07:<port>"] * 2 + ["gpu08:<port>"] * 2 + ["cpu1:<port>"]
    assert "srun --jobid=4242 --overlap -N1 -n1 -w gpu08" in done.stdout


def test_salloc_train_runs_a_worker_on_each_node(lab, tmp_path):
    runs = tmp_path / "runs"
    done = lab.salloc([*INV, "train", "--hosts", "slurm", "--payload", str(PAYLOAD),
                       "--entry", "train.py", "--args", "--epochs 2", "--runs-dir", str(runs)],
                      cwd=REPO)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run_dir = the_run(runs)
    record = json.loads((run_dir / "record.json").read_text())
    endpoints = [task["endpoint"] for task in record["tasks"]]
    assert [e.rsplit(":", 1)[0] for e in endpoints] == ["127.0.5.1", "127.0.5.2"]
    assert re.search(r"cluster 127\.0\.5\.1:\d+, 127\.0\.5\.2:\d+", done.stdout)
    summary = json.loads((run_dir / "summary.json").read_text())
    losses = {t["task"]: t["final_loss"] for t in summary["tasks"]}
    assert len(losses) == 2 and len(set(losses.values())) == 1, losses
    assert [t["exit_code"] for t in summary["tasks"]] == [0, 0]
    no_step_left(lab, done.job_id)
    assert procs.processes_of_run(run_dir.name) == []
    assert not (Path.home() / ".tfdeploy" / "runs" / run_dir.name).exists()


def submitted(lab, runs: Path, epochs: int) -> tuple[Path, int]:
    """`inv submit --nodes 2` of the example payload: the run's directory and the job's id."""
    done = inv(lab, "submit", "--nodes", "2", "--payload", str(PAYLOAD), "--entry", "train.py",
               "--args", f"--epochs {epochs}", "--runs-dir", str(runs))
    assert done.returncode == 0, done.stdout + done.stderr
    run_dir = the_run(runs)
    job = int(json.loads((run_dir / "slurm-job.json").read_text())["job_id"])
    assert f"Slurm job {job}" in done.stdout and run_dir.name in done.stdout
    lab.jobs.add(job)
    return run_dir, job


def test_submit_queues_a_run_that_completes(lab, tmp_path):
    runs = tmp_path / "runs"
    run_dir, job = submitted(lab, runs, epochs=2)
    info = lab.wait_job(job, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=180)
    assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), \
        (run_dir / f"slurm-{job}.out").read_text()[-3000:]
    assert sorted(p.name for p in run_dir.glob("worker-*.log")) == ["worker-0.log",
                                                                     "worker-1.log"]
    assert '"event": "epoch", "task": 1, "epoch": 2,' in (run_dir / "worker-1.log").read_text()
    listed = inv(lab, "runs", "--runs-dir", str(runs))
    assert "finished (exit 0)" in listed.stdout, listed.stdout
    logs = inv(lab, "logs", "--run", run_dir.name, "--runs-dir", str(runs))
    assert logs.returncode == 0 and "[worker-1 n2] epoch 2/2" in logs.stdout, logs.stdout


@pytest.mark.parametrize("stop", ["scancel", "down"])
def test_a_cancelled_submitted_run_leaves_nothing(lab, tmp_path, stop):
    runs = tmp_path / "runs"
    run_dir, job = submitted(lab, runs, epochs=500)
    log, deadline = run_dir / "worker-1.log", time.monotonic() + 120
    while not (log.exists() and '"epoch": 3,' in log.read_text(errors="replace")):
        assert time.monotonic() < deadline, lab.job(job)
        time.sleep(0.5)
    listed = inv(lab, "runs", "--runs-dir", str(runs))
    assert f"running, Slurm job {job}" in listed.stdout, listed.stdout
    assert len(procs.processes_of_run(run_dir.name)) >= 2
    cancelled = time.monotonic()
    if stop == "scancel":
        lab.scancel(job)
    else:
        down = inv(lab, "down", "--run", run_dir.name, "--runs-dir", str(runs))
        assert down.returncode == 0 and "CANCELLED" in down.stdout, down.stdout + down.stderr
    assert procs.wait_until_gone(run_dir.name, 30) == []
    while job in lab.queue():
        assert time.monotonic() - cancelled < 30, "the job is still queued"
        time.sleep(0.2)
    assert lab.job_state(job) in ("CANCELLED", None)
    status = inv(lab, "status", "--run", run_dir.name, "--runs-dir", str(runs))
    assert status.returncode == 0 and "CANCELLED" in status.stdout, status.stdout
