"""Invoke tasks: parse flags, call deploy/, turn outcomes into exit codes. Nothing else."""
from __future__ import annotations

import sys
from pathlib import Path

from invoke import Exit, task
from rich.console import Console
from rich.text import Text

from deploy.bundle import BundleError
from deploy.envsetup import requirements_hash, setup as setup_envs
from deploy.inventory import InventoryError, load_inventory
from deploy.lints import LintFailed, lint
from deploy.parallel import HostsFailed
from deploy.planner import Options, plan_run
from deploy.plantext import plan_text
from deploy.runner import RunSettings, new_run_id, train as run_training
from deploy.session import StepFailed
from deploy.shell import split_args
from deploy.transport import TransportError

EXPECTED_ERRORS = (InventoryError, LintFailed, BundleError, HostsFailed, StepFailed,
                   TransportError, ValueError)

BAD_INPUT = (InventoryError, LintFailed, BundleError, ValueError)


def seconds(flag: str, value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        number = -1.0
    if not number >= 0:
        raise ValueError(f"{flag} takes a number of seconds, not {value!r}")
    return number


@task(help={
    "hosts": "inventory file (default: hosts.yaml, two workers on localhost)",
    "payload": "directory pushed to every host (default: payload/)",
    "entry": "script inside the payload that each task runs (default: train.py)",
    "args": "arguments for the script, split like a shell would, e.g. \"--epochs 5\"",
    "dry_run": "print the plan (per host: commands, environment, TF_CONFIG) and touch nothing",
    "runs_dir": "where local run records go: logs, summary.json, artifacts (default: runs/)",
    "connect_timeout": "seconds to wait for each SSH connection (default: 10)",
    "accept_new_host_keys": "record host keys missing from known_hosts (changed keys are "
                            "always refused)",
    "start_timeout": "seconds for every task to reach its first training step before the run "
                     "is torn down (default: 120; 0: no watchdog)",
    "grace": "seconds between SIGTERM and SIGKILL when stopping tasks (default: 3)",
})
def train(c, hosts="hosts.yaml", payload="payload", entry="train.py", args="", dry_run=False,
          runs_dir="runs", connect_timeout="10", accept_new_host_keys=False, grace="3",
          start_timeout="120"):
    """Train across the inventory's hosts: push, start, stream logs, tear down.

    Exit status is 0 only when every task exited 0; 130 after Ctrl-C.
    """
    console = Console(highlight=False)
    try:
        inventory = load_inventory(hosts)
        options = Options(payload=payload, entry=entry, args=tuple(split_args(args)),
                          grace=seconds("--grace", grace),
                          requirements_sha256=requirements_hash(Path(payload)))
        problems = lint(inventory, Path(payload))
        if problems:
            raise LintFailed("\n".join(problems))
        if dry_run:
            console.print(plan_text(plan_run(inventory, options, new_run_id())), markup=False,
                          end="")
            return
        settings = RunSettings(runs_dir=Path(runs_dir),
                               connect_timeout=seconds("--connect-timeout", connect_timeout),
                               accept_new_host_keys=accept_new_host_keys,
                               start_timeout=seconds("--start-timeout", start_timeout))
        code = run_training(inventory, options, settings, console)
    except EXPECTED_ERRORS as exc:
        console.print(Text.assemble(("error: ", "bold red"), str(exc)))
        raise Exit(code=2 if isinstance(exc, BAD_INPUT) else 1)
    except KeyboardInterrupt:  # before anything was started; later ones are handled by the run
        console.print("interrupted", style="yellow")
        raise Exit(code=130)
    if code:
        raise Exit(code=code)


@task(help={
    "hosts": "inventory file (default: hosts.yaml)",
    "payload": "directory whose requirements.txt is installed (default: payload/)",
    "wheelhouse": "local directory of wheels, pushed and installed with pip --no-index "
                  "(for hosts without internet)",
    "connect_timeout": "seconds to wait for each SSH connection (default: 10)",
    "accept_new_host_keys": "record host keys missing from known_hosts (changed keys are "
                            "always refused)",
})
def setup(c, hosts="hosts.yaml", payload="payload", wheelhouse="", connect_timeout="10",
          accept_new_host_keys=False):
    """Build the payload's virtual environment on every host (reused when unchanged).

    Environments live in <workdir>/envs/<key>, keyed by requirements.txt and the host's python;
    `inv train` runs tasks with it unless the inventory names the host's own `python`.
    """
    console = Console(highlight=False)
    try:
        code = setup_envs(load_inventory(hosts), Path(payload),
                          Path(wheelhouse) if wheelhouse else None,
                          seconds("--connect-timeout", connect_timeout), accept_new_host_keys,
                          console)
    except EXPECTED_ERRORS as exc:
        console.print(Text.assemble(("error: ", "bold red"), str(exc)))
        raise Exit(code=2 if isinstance(exc, BAD_INPUT) else 1)
    except KeyboardInterrupt:
        console.print("interrupted", style="yellow")
        raise Exit(code=130)
    if code:
        raise Exit(code=code)


if __name__ == "__main__":
    sys.exit("run tasks with: inv --list")
