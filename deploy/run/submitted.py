"""Runs queued with `inv submit`: a Slurm batch job whose script (plan/batch.py) runs `train
--hosts slurm --run-id ID` inside its allocation. The run's local directory holds the script,
the job's id and its output (the controller's own, written by Slurm) from the start, and the
run's record, logs and summary once the controller inside the job writes them.

`inv runs`, `status`, `logs` and `down` (reattach.py) ask Slurm for such a run's job while it is
queued or running: its state from `scontrol show job`, `down` as `scancel`, `logs` as the job's
output. Slurm forgets an ended job after MinJobAge; the run's record keeps how it ended.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from deploy.commandline import program_argv
from deploy.errors import BadInput, Failure
from deploy.plan.batch import BatchRequest, batch_script
from deploy.state import localdir
from deploy.state.events import JobOutput, Reporter, RunListed, RunNote, Submitted
from deploy.host.layout import RUN_ID
from deploy.push.bundle import checked_payload
from deploy.state.record import RunRecord, new_run_id, write_json

CLIENT_TIMEOUT = 30.0
# Slurm's states of a job that has not ended (squeue's long names).
ACTIVE_STATES = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED",
                           "REQUEUED", "REQUEUE_HOLD", "RESIZING", "SIGNALING", "STAGE_OUT",
                           "STOPPED", "RESV_DEL_HOLD", "REQUEUE_FED"})
CANCEL_WAIT = 60.0                  # for a cancelled job to leave the running states
POLL = 0.5
JOB_ID = re.compile(r"^[0-9]+(;[A-Za-z0-9_.-]+)?$")     # sbatch --parsable: id[;cluster]


@dataclass(frozen=True)
class Job:
    id: str
    state: str                      # "" once Slurm has forgotten the job
    exit_code: str = ""             # "<status>:<signal>" of the batch script
    reason: str = ""

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_STATES

    def shown(self) -> str:
        if not self.state:
            return f"Slurm job {self.id} (no longer known to Slurm)"
        reason = f", {self.reason}" if self.reason not in ("", "None") else ""
        code = f", exit {self.exit_code}" if self.exit_code and not self.active else ""
        return f"Slurm job {self.id} {self.state}{code}{reason}"


def _client(*argv: str, timeout: float = CLIENT_TIMEOUT) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise BadInput(f"{argv[0]} is not on PATH: Slurm's client commands are needed for a "
                       "submitted run") from None
    except subprocess.TimeoutExpired:
        raise Failure(f"{' '.join(argv)}: no answer in {timeout:g} s") from None


def _said(done: subprocess.CompletedProcess) -> str:
    lines = (done.stderr or done.stdout).strip().splitlines()
    return lines[-1] if lines else f"exit code {done.returncode}"


def submit(runs_dir: Path, payload: Path, entry: str, nodes: int, train_args: tuple[str, ...],
           reporter: Reporter, runs_dir_flag: str, **options: str) -> int:
    """Write runs/<id>/batch.sh, submit it with sbatch, record the job id and say how to find
    the run again. `train_args`: train's flags for the run, the payload's included;
    `options`: gpus_per_node, time, partition, account (as given)."""
    checked_payload(payload, entry, runs_dir)
    localdir.check_runs_dir(runs_dir)
    run_id = new_run_id()
    local_dir = runs_dir.resolve() / run_id
    script = batch_script(BatchRequest(
        run_id=run_id, nodes=nodes, program=program_argv(),
        train_args=(*train_args, "--runs-dir", str(runs_dir.resolve())),
        workdir=os.getcwd(), output=str(localdir.job_output(local_dir, "%j")), **options))
    local_dir.mkdir(parents=True)
    path = local_dir / localdir.BATCH_SCRIPT
    path.write_text(script)
    path.chmod(0o700)
    done = _client("sbatch", "--parsable", str(path))
    job_id = done.stdout.strip().split(";")[0]
    if done.returncode != 0 or not JOB_ID.match(done.stdout.strip()):
        path.unlink()
        local_dir.rmdir()
        raise Failure(f"sbatch {path}: {_said(done)}")
    write_json(local_dir / localdir.SLURM_JOB, {"job_id": job_id, "run_id": run_id,
                                                 "submitted": time.time(), "nodes": nodes})
    reporter.emit(Submitted(run_id, job_id, str(path), runs_dir_flag))
    return 0


def given_run_id(runs_dir: Path, run_id: str) -> str:
    """`train --run-id`, as a submitted run's batch script gives it: a run id whose directory
    holds the submission and no record yet (a job requeued by Slurm would start it again)."""
    if not RUN_ID.match(run_id):
        raise BadInput(f"--run-id {run_id!r} is not a run id (such as {new_run_id()})")
    if (runs_dir / run_id / localdir.RECORD).exists():
        raise BadInput(f"--run-id {run_id}: {runs_dir / run_id} holds a run already")
    return run_id


def submitted_job(local_dir: Path) -> tuple[str, float] | None:
    """The job id and submission time of a submitted run, or None for any other run."""
    path = local_dir / localdir.SLURM_JOB
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text())
        job_id, submitted = str(doc["job_id"]), float(doc["submitted"])
    except (OSError, ValueError, KeyError, TypeError):
        raise BadInput(f"{path}: not a readable submission (job_id, submitted)") from None
    if not JOB_ID.match(job_id):
        raise BadInput(f"{path}: job_id {job_id!r} is not a Slurm job id")
    return job_id, submitted


def job(job_id: str) -> Job:
    """What Slurm says of the job now."""
    done = _client("scontrol", "--oneliner", "show", "job", job_id)
    if done.returncode != 0:
        if "Invalid job id" in (done.stderr + done.stdout):
            return Job(job_id, "")
        raise Failure(f"scontrol show job {job_id}: {_said(done)}")
    fields = dict(re.findall(r"(?:^|\s)(JobState|ExitCode|Reason)=(\S*)", done.stdout))
    return Job(job_id, fields.get("JobState", ""), fields.get("ExitCode", ""),
               fields.get("Reason", ""))


def queued_row(local_dir: Path, job_id: str, submitted: float) -> RunListed:
    """`inv runs`' row for a submitted run whose controller has not written its record yet."""
    now = job(job_id)
    state = "queued" if now.active else "ended"
    return RunListed(local_dir.name, time.strftime("%Y-%m-%d %H:%M:%S",
                                                   time.localtime(submitted)),
                     (), 0, now.shown(), state, None, 1)


def shown_with_job(record: RunRecord, job_id: str) -> str:
    """A submitted run's state: its record's, and its job's while the record says it runs
    (the controller that wrote it runs on a node of the job, not here)."""
    if not record.state.active:
        return record.shown_state()
    now = job(job_id)
    return f"{record.state.value}, Slurm job {job_id}" + (
        "" if now.active else f" {now.state or 'forgotten'}")


def show_output(local_dir: Path, job_id: str, follow: bool, reporter: Reporter) -> int:
    """The job's output (what the run's controller printed), from its start; with `follow`,
    on as it grows until the job has ended."""
    path = localdir.job_output(local_dir, job_id)
    offset, partial, told = 0, b"", False
    while True:
        now = job(job_id)                   # one scontrol per round: its state and words
        active = follow and now.active
        if path.is_file():
            with path.open("rb") as out:
                out.seek(offset)
                chunk = out.read()
            offset += len(chunk)
            *lines, partial = (partial + chunk).split(b"\n")
            for line in lines:
                reporter.emit(JobOutput(line.decode("utf-8", "replace")))
        elif active and not told:
            reporter.emit(RunNote(local_dir.name, f"{now.shown()}: waiting for it to start…"))
            told = True
        if not active:
            break
        time.sleep(POLL)
    if partial:
        reporter.emit(JobOutput(partial.decode("utf-8", "replace")))
    reporter.emit(RunNote(local_dir.name, now.shown()))
    return 0


def cancel(local_dir: Path, job_id: str, reporter: Reporter) -> int:
    """`scancel`, then wait until the job has ended: its controller stops every task on
    SIGTERM, and Slurm ends whatever is left in the job when it ends."""
    before = job(job_id)
    if not before.active:
        reporter.emit(RunNote(local_dir.name, f"{before.shown()}: nothing to stop"))
        return 0
    reporter.emit(RunNote(local_dir.name, f"cancelling {before.shown()}…"))
    done = _client("scancel", job_id)
    if done.returncode != 0:
        raise Failure(f"scancel {job_id}: {_said(done)}")
    deadline = time.monotonic() + CANCEL_WAIT
    while (now := job(job_id)).active:
        if time.monotonic() > deadline:
            reporter.emit(RunNote(local_dir.name, f"{now.shown()} {CANCEL_WAIT:g} s after "
                                                  "scancel"))
            return 1
        time.sleep(POLL)
    reporter.emit(RunNote(local_dir.name, f"{now.shown()}"))
    return 0
