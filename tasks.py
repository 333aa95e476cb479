"""Invoke tasks: parse flags, call deploy/, turn outcomes into exit codes. Nothing else.

`inv` runs them in this checkout; the installed `tfdeploy` command is the same collection
(main() below, an Invoke Program as Fabric's `fab` is), usable from any directory.
"""
from __future__ import annotations

import gc
import sys

# On an older Python the imports below would fail on a name or a syntax it lacks; say why.
if sys.version_info < (3, 10):
    sys.exit(f"tfdeploy needs Python 3.10 or newer; {sys.executable} is Python "
             f"{sys.version.split()[0]}")

# What the imports make lives as long as the program: the cyclic garbage collector stays off
# while they run, and they are then frozen out of its reach. Its passes over those tens of
# thousands of objects, during the imports and at exit, were a fifth of a short command's time
# (docs/benchmarks.md, "The collector").
gc.disable()

from contextlib import contextmanager
from importlib import metadata
from json import dumps
from pathlib import Path

import difflib
import re

from invoke import Collection, Exit, ParseError, Program
from invoke import task as invoke_task
from rich.console import Console
from rich.text import Text

from deploy.commandline import PROGRAM, command
from deploy.console.plain import plain
from deploy.console.reporter import ConsoleReporter, JsonReporter
from deploy.errors import BadInput, TfdeployError
from deploy.host.archive import MAX_BYTES, Limits
from deploy.inventory.builtin import chosen_inventory
from deploy.inventory.load import MAX_TASKS
from deploy.inventory.logins import login_documents, login_text
from deploy.inventory.model import Inventory
from deploy.plan.command import split_args
from deploy.plan.lints import public_warnings, refuse_problems
from deploy.plan.planner import Options, plan_run
from deploy.plan.pythons import payload_need
from deploy.plan.text import plan_text
from deploy.run.hostchecks import check_hosts
from deploy.run.preflight import refuse_bad_input, shown_paths
from deploy.run.launch import train as run_training
from deploy.run.pruning import prune as prune_hosts
from deploy.run.reattach import down as stop_run
from deploy.run.reattach import list_runs
from deploy.run.reattach import logs as show_logs
from deploy.run.reattach import plot as draw_plot
from deploy.run.reattach import status as show_status
from deploy.run.finish import runs_dir_flag
from deploy.run.resume import resume as resume_run
from deploy.run.run import RunSettings
from deploy.run.submitted import given_run_id
from deploy.run.submitted import submit as submit_run
from deploy.run.envsetup import requirements_hash
from deploy.run.envsetup import setup as setup_envs
from deploy.run.signals import (
    HungUp, Terminated, closed_output_ends_quietly, controller_signals, exit_code
)
from deploy.state.events import CheckReported, PayloadLeftOut
from deploy.state.localdir import private_umask
from deploy.state.record import new_run_id
from deploy.timeline import mark

gc.freeze()
gc.enable()
mark("imports")
closed_output_ends_quietly()


def task(**kwargs):
    """Invoke's @task without short flags made up from names: they meant different things in
    different tasks (-t: --accept-new-host-keys in train, --task in logs), and -h is help."""
    return invoke_task(auto_shortflags=False, **kwargs)


# Lines --tail shows at most per task.
MAX_TAIL = 1_000_000

HOSTS_HELP = ("inventory file (default: ./hosts.yaml; where there is none, the built-in "
              "inventory: two workers on localhost), or slurm: the nodes of the Slurm "
              "allocation it runs in")

SSH_HELP = {
    "connect_timeout": "seconds to wait for each SSH connection (default: 10; 0: no limit)",
    "accept_new_host_keys": "record host keys missing from known_hosts (changed keys are "
                            "always refused)",
}


LOST_AFTER_HELP = ("seconds without a heartbeat from a host (its agent beats every second) "
                   "after which it is lost: the run fails and the other hosts' tasks are "
                   "stopped (default: 10; 0: never)")

MAX_FETCH_HELP = ("the most an archive from a host may unpack to: the chief's output, fetched "
                  "into runs/<id>/artifacts, and the copy of its backup kept after each epoch; "
                  f"larger ones are refused (e.g. 500MiB, 32GiB; default: {MAX_BYTES >> 30}GiB)")

JSON_HELP = ("print what happens as JSON lines on stdout, one event per line, for scripts and "
             "CI (docs/events.md); nothing else goes to stdout, errors go to stderr")

DETACH_HELP = ("return once every task has started, leaving the run on its hosts; print its "
               f"id and the commands to follow ({command('logs')}), inspect "
               f"({command('status')}), stop ({command('down')}); with --restarts, a "
               "controller in the background on this machine relaunches it")

VERBOSE_HELP = ("show every log line as the tasks wrote it, TensorFlow's C++ log and the "
                "payload's {\"event\": ...} lines too (by default the console hides them; "
                "runs/<id>/worker-<i>.log always keeps every byte)")


@contextmanager
def reported(console: Console):
    """Expected errors as one red line; exit status 2 for bad input (nothing was touched),
    1 for a failure, 130 for Ctrl-C and 143 for SIGTERM before a run had started, 129 when
    the terminal closed, 141 when the output's pipe lost its reader (later ones the run
    handles: deploy/run/signals.py)."""
    private_umask()
    try:
        with controller_signals():
            yield
    except TfdeployError as exc:
        console.print(Text.assemble(("error: ", "bold red"), plain(str(exc))))
        raise Exit(code=exc.exit_code)
    except KeyboardInterrupt as interrupt:
        console.print("terminated" if isinstance(interrupt, Terminated) else "interrupted",
                      style="yellow")
        raise Exit(code=exit_code(interrupt))
    except HungUp as hangup:
        raise Exit(code=hangup.exit_code)


def console_and_reporter(json: bool) -> tuple[Console, ConsoleReporter | JsonReporter]:
    """Where a task's words go: the console and its reporter, or, with --json, events on
    stdout and the console (notes, errors) on stderr."""
    if json:
        return Console(stderr=True, highlight=False), JsonReporter()
    console = Console(highlight=False)
    return console, ConsoleReporter(console)


def exit_with(code: int | None) -> None:
    if code:
        raise Exit(code=code)


# Ceilings for flag values: far above any real use, low enough that a typo is caught at once
# (docs/bad-input.md).
MAX_SECONDS = 7 * 24 * 3600
MAX_RESTARTS = 100


def seconds(flag: str, value: str) -> float:
    """A flag's number of seconds, from 0 to MAX_SECONDS."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = -1.0
    if not 0 <= number <= MAX_SECONDS:
        raise BadInput(f"{flag} takes a number of seconds from 0 to {MAX_SECONDS} (a week), "
                       f"not {shown(value)}")
    return number


def count(flag: str, value: str, most: int | None = None) -> int:
    """A flag's whole number, from 0 to `most` (no bound: None)."""
    text = str(value)
    if not (text.isascii() and text.isdigit() and len(text) <= 18):
        raise BadInput(f"{flag} takes a whole number, not {shown(value)}")
    number = int(text)
    if most is not None and number > most:
        raise BadInput(f"{flag} takes a whole number from 0 to {most}, not {shown(value)}")
    return number


def shown(value) -> str:
    """A flag's value in a message, cut short: a pasted file is not worth repeating."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


SIZE_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20,
              "g": 1 << 30, "gib": 1 << 30, "t": 1 << 40, "tib": 1 << 40}
MIN_FETCH, MAX_FETCH = 1 << 20, 1 << 50


def fetch_limits(flag: str, value: str) -> Limits:
    """`--max-fetch 500MiB` (or 32GiB, 2T, a byte count) as the limits of an archive; the
    default ones when not given."""
    if value == "":
        return Limits()
    text = str(value).strip().lower()
    number = text.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = SIZE_UNITS.get(text[len(number):].strip())
    try:
        amount = int(float(number) * unit) if unit and number else -1
    except (ValueError, OverflowError):
        amount = -1
    if not MIN_FETCH <= amount <= MAX_FETCH:
        raise BadInput(f"{flag} takes a size from 1MiB to 1024TiB such as 500MiB or 32GiB, "
                       f"not {shown(value)}")
    return Limits(bytes=amount)


DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def duration(flag: str, value: str) -> float:
    """`90`, `90s`, `30m`, `12h`, `7d` as seconds."""
    text = str(value).strip().lower()
    unit = DURATION_UNITS.get(text[-1:], None) if text else None
    try:
        return seconds(flag, text[:-1] if unit else text) * (unit or 1)
    except BadInput:
        raise BadInput(f"{flag} takes a duration such as 90s, 30m, 12h or 7d, not {value!r}") \
            from None


def inventory(console: Console, hosts: str, dry_run: bool = False) -> Inventory:
    chosen, note = chosen_inventory(hosts, dry_run)
    if note:
        console.print(note, style="yellow")
    for warning in public_warnings(chosen):
        console.print(Text.assemble(("warning: ", "bold yellow"), warning))
    return chosen


def linted_inventory(console: Console, hosts: str, payload: str) -> Inventory:
    chosen = inventory(console, hosts)
    refuse_problems(chosen, Path(payload))
    return chosen


@task(help={
    "hosts": HOSTS_HELP,
    "payload": "directory pushed to every host (default: payload/)",
    "entry": "script inside the payload that each task runs (default: train.py)",
    "args": "arguments for the script, split like a shell would, e.g. \"--epochs 5\"",
    "dry_run": "print the plan (per host: commands, environment, TF_CONFIG) and touch nothing",
    "runs_dir": "where local run records go: logs, summary.json, artifacts (default: runs/)",
    **SSH_HELP,
    "start_timeout": "seconds for every task to reach its first training step before the run "
                     "is torn down (default: 120; 0: no watchdog)",
    "lost_after": LOST_AFTER_HELP,
    "grace": "seconds between SIGTERM and SIGKILL when stopping tasks (default: 3)",
    "no_check": f"skip the checks of `{command('check')}` (versions, disk, ports, TCP mesh) "
                "before "
                "starting",
    "detach": DETACH_HELP,
    "restarts": "when a task fails or a host is lost, stop the cluster and relaunch every "
                "task, resuming from the chief's BackupAndRestore state, up to N times "
                "(default: 0); a lost host's tasks go to a `role: spare` host",
    "shrink": "with --restarts, when a host is lost and no spare is left, relaunch on the "
              "hosts that remain (fewer workers)",
    "min_workers": "with --shrink, the fewest workers to go on with (default: 1)",
    "allow_busy_gpus": "run on GPUs another run or user holds (by default a busy GPU listed in "
                       "`gpus`, or too few free ones, refuses the run)",
    "verbose": VERBOSE_HELP,
    "max_fetch": MAX_FETCH_HELP,
    "json": JSON_HELP,
    "run_id": f"the run's id, as {command('submit')}'s batch job gives it (default: a new one)",
})
def train(c, hosts="", payload="payload", entry="train.py", args="", dry_run=False,
          runs_dir="runs", connect_timeout="10", accept_new_host_keys=False, grace="3",
          start_timeout="120", no_check=False, detach=False, restarts="0", verbose=False,
          lost_after="10", max_fetch="", json=False, allow_busy_gpus=False, run_id="",
          shrink=False, min_workers="1"):
    """Train across the inventory's hosts: push, start, stream logs, tear down.

    Exit status is 0 only when every task exited 0; 1 when a task or host failed; 2 for bad
    input (nothing started anywhere); 130 after Ctrl-C, 143 after SIGTERM (both stop every
    task first; a second Ctrl-C abandons the teardown and names the `inv down` that ends it);
    129 when the terminal closed (SIGHUP), which leaves the run going for `inv logs --follow`,
    as does a pipe whose reader went away (`| head`: 141); before the tasks started, either
    one tears down what was pushed, as Ctrl-C does.
    """
    console, reporter = console_and_reporter(json)
    with reported(console):
        # Every flag is read before anything else, the dry run's included: a dry run refuses
        # what the real run would.
        chosen = inventory(console, hosts, dry_run)
        settings = run_settings(runs_dir, connect_timeout, accept_new_host_keys, start_timeout,
                                lost_after, no_check, restarts, verbose, max_fetch,
                                allow_busy_gpus, shrink, min_workers, detach=detach,
                                run_id=given_run_id(Path(runs_dir), run_id) if run_id else None)
        options = Options(payload=payload, entry=entry, args=tuple(split_args(args)),
                          grace=seconds("--grace", grace),
                          requirements_sha256=requirements_hash(Path(payload)))
        if dry_run:
            walked = refuse_bad_input(chosen, options, settings.runs_dir)
            if walked.left_out:
                reporter.emit(PayloadLeftOut(shown_paths(walked.left_out, Path(payload))))
            # Not wrapped here: a wrapped command line could not be copied, and wrapping a
            # large cluster's plan costs far more than making it.
            console.print(plan_text(plan_run(chosen, options, new_run_id())), markup=False,
                          end="", soft_wrap=True)
            return
        code = run_training(chosen, options, settings, reporter)
    exit_with(code)


def run_settings(runs_dir: str, connect_timeout: str, accept_new_host_keys: bool,
                 start_timeout: str, lost_after: str, no_check: bool, restarts: str,
                 verbose: bool, max_fetch: str, allow_busy_gpus: bool, shrink: bool,
                 min_workers: str, **fields) -> RunSettings:
    """A run's settings from `train`'s (and `resume`'s) flags, each checked."""
    settings = RunSettings(runs_dir=Path(runs_dir),
                           connect_timeout=seconds("--connect-timeout", connect_timeout),
                           accept_new_host_keys=accept_new_host_keys,
                           start_timeout=seconds("--start-timeout", start_timeout),
                           lost_after=seconds("--lost-after", lost_after),
                           check=not no_check,
                           restarts=count("--restarts", restarts, MAX_RESTARTS),
                           verbose=verbose, fetch_limits=fetch_limits("--max-fetch", max_fetch),
                           allow_busy_gpus=allow_busy_gpus, shrink=shrink,
                           min_workers=count("--min-workers", min_workers, MAX_TASKS), **fields)
    if (shrink or min_workers != "1") and not settings.restarts:
        raise BadInput("--shrink and --min-workers act on a relaunch: they need --restarts N")
    return settings


# train's flags that a submitted run passes on to the train inside its batch job.
SUBMITTED_TRAIN_FLAGS = ("payload", "entry", "args", "grace", "start_timeout", "lost_after",
                         "restarts", "max_fetch")


@task(help={
    "nodes": "how many nodes the job asks Slurm for: one worker on each (required)",
    "gpus_per_node": "GPUs per node ([type:]G): a worker per GPU",
    "time": "the job's time limit, as sbatch takes it (90, 1:30:00, 2-12)",
    "partition": "the Slurm partition to queue in (default: the cluster's)",
    "account": "the Slurm account to charge (default: yours)",
    "payload": "directory each task runs in, on the filesystem the nodes share (default: "
               "payload/)",
    "entry": "script inside the payload that each task runs (default: train.py)",
    "args": "arguments for the script, split like a shell would, e.g. \"--epochs 5\"",
    "runs_dir": "where the run's records go, on the filesystem the nodes share: the batch "
                "script, the job's output, logs, summary.json, artifacts (default: runs/)",
    "grace": "seconds between SIGTERM and SIGKILL when stopping tasks (default: 3)",
    "start_timeout": "seconds for every task to reach its first training step (default: 120)",
    "lost_after": LOST_AFTER_HELP,
    "restarts": "when a task fails, relaunch every task from the chief's backup, up to N times",
    "no_check": "skip the checks before starting (versions, disk, ports, TCP mesh)",
    "verbose": VERBOSE_HELP,
    "max_fetch": MAX_FETCH_HELP,
})
def submit(c, nodes="", gpus_per_node="", time="", partition="", account="",
           payload="payload", entry="train.py", args="", runs_dir="runs", grace="3",
           start_timeout="120", lost_after="10", restarts="0", no_check=False, verbose=False,
           max_fetch=""):
    """Queue a run on Slurm: a batch job that runs `inv train --hosts slurm` in its allocation.

    Writes the batch script under runs/<id>/, submits it with sbatch, prints the job's id and
    the run's, and returns. `inv runs`, `status`, `logs --follow` and `down` (scancel) know
    the run from then on."""
    console, reporter = console_and_reporter(False)
    with reported(console):
        if not nodes:
            raise BadInput("--nodes is required: how many nodes the job asks Slurm for")
        given = {"payload": str(Path(payload).resolve()), "entry": entry, "args": args,
                 "grace": str(seconds("--grace", grace)),
                 "start_timeout": str(seconds("--start-timeout", start_timeout)),
                 "lost_after": str(seconds("--lost-after", lost_after)),
                 "restarts": str(count("--restarts", restarts, MAX_RESTARTS)),
                 "max_fetch": max_fetch and str(fetch_limits("--max-fetch", max_fetch).bytes)}
        train_args = [word for flag in SUBMITTED_TRAIN_FLAGS if given[flag]
                      for word in ("--" + flag.replace("_", "-"), given[flag])]
        train_args += ["--no-check"] * no_check + ["--verbose"] * verbose
        code = submit_run(Path(runs_dir), Path(payload), entry, count("--nodes", nodes),
                          tuple(train_args), reporter, runs_dir_flag(Path(runs_dir)),
                          gpus_per_node=gpus_per_node, time=time, partition=partition,
                          account=account)
    exit_with(code)


@task(help={
    "hosts": HOSTS_HELP,
    "payload": "payload directory to lint, e.g. for a Keras 3 import (default: payload/)",
    **SSH_HELP,
    "json": JSON_HELP,
})
def check(c, hosts="", payload="payload", connect_timeout="10",
          accept_new_host_keys=False, json=False):
    """Check that every host is ready to train; writes nothing on any host.

    SSH, the host's python, tensorflow/tf_keras/numpy versions, free disk under the workdir,
    free ports for its tasks, then the TCP mesh: every task's port reachable from every host.

    Exit status: 0 when all is well, 1 on any problem, 2 for bad input.
    """
    console, reporter = console_and_reporter(json)
    with reported(console):
        chosen = linted_inventory(console, hosts, payload)
        timeout = seconds("--connect-timeout", connect_timeout)
        with reporter.status(f"checking {len(chosen.hosts)} host(s)…"):
            report = check_hosts(chosen, timeout, accept_new_host_keys,
                                 requirements_hash(Path(payload)), payload_need(Path(payload)))
    reporter.emit(CheckReported(report))
    exit_with(0 if report.ok else 1)


@task(help={
    "hosts": HOSTS_HELP,
    "payload": "directory whose requirements.txt is installed (default: payload/)",
    "wheelhouse": "local directory of wheels, pushed and installed with pip --no-index "
                  "(for hosts without internet)",
    **SSH_HELP,
})
def setup(c, hosts="", payload="payload", wheelhouse="", connect_timeout="10",
          accept_new_host_keys=False):
    """Build the payload's virtual environment on every host (reused when unchanged).

    Environments live in <workdir>/envs/<key>, keyed by requirements.txt and the host's python;
    `inv train` runs tasks with it unless the inventory names the host's own `python`.
    """
    console = Console(highlight=False)
    with reported(console):
        code = setup_envs(inventory(console, hosts), Path(payload),
                          Path(wheelhouse) if wheelhouse else None,
                          seconds("--connect-timeout", connect_timeout), accept_new_host_keys,
                          ConsoleReporter(console))
    exit_with(code)


@task(help={"hosts": HOSTS_HELP,
            "json": "print a JSON list, one object per host (name, hostname, user, port, "
                    "identity_files, known_hosts, host_key_alias, jump, proxy_command, ...)"})
def hosts(c, hosts="", json=False):
    """Show how tfdeploy will log in to each host, as OpenSSH resolves it; connects nowhere.

    Per host: user, address and port, gateways or ProxyCommand, key files, and where its host
    key is looked up. Exit status: 0, or 2 for an inventory or ssh config that is refused.
    """
    console = Console(highlight=False)
    with reported(console):
        chosen = inventory(Console(stderr=True, highlight=False) if json else console, hosts)
        if json:
            print(dumps(login_documents(chosen), indent=2))
        else:
            console.print(login_text(chosen), markup=False, end="")


@task(help={
    "hosts": HOSTS_HELP,
    "payload": "keep the files and environment of this payload directory (default: keep none)",
    "dry_run": "say per host what would be freed; delete nothing",
    "runs_dir": "local run records: runs they call live are kept (default: runs/)",
    "older_than": "free ended run directories left on hosts once unchanged this long "
                  "(90s, 30m, 12h, 7d; default: 7d)",
    **SSH_HELP,
})
def prune(c, hosts="", payload="", dry_run=False, runs_dir="runs", older_than="7d",
          connect_timeout="10", accept_new_host_keys=False):
    """Free space in every host's workdir that no live run needs.

    Deletes cached payload and data files and `inv setup` environments that neither a live run
    nor --payload needs, and ended run directories older than --older-than; prints per host
    what it freed. Never touches a live run, nor anything outside the workdir's own layout.

    Exit status: 0 when every host was pruned, 1 when one failed, 2 for bad input.
    """
    console = Console(highlight=False)
    with reported(console):
        code = prune_hosts(inventory(console, hosts), Path(payload) if payload else None,
                           Path(runs_dir), duration("--older-than", older_than), dry_run,
                           seconds("--connect-timeout", connect_timeout), accept_new_host_keys,
                           ConsoleReporter(console))
    exit_with(code)


RUN_HELP = {
    # A flag, not a positional: Invoke has no optional positional arguments.
    "run": "run id, or a unique prefix of one (default: the newest run in the runs dir)",
    "runs_dir": "where the local run records are (default: runs/)",
    **SSH_HELP,
}


# RunSettings given as a flag's number of seconds: read inside reported(), so that a bad value
# is an error line (exit 2), not a traceback.
SECONDS_SETTINGS = ("connect_timeout", "start_timeout", "lost_after")


def run_task(action, connect_timeout="10", accept_new_host_keys=False, json=False,
             **settings) -> None:
    """Call a run-management action with its reporter and settings; errors and codes as
    `train` has them."""
    console, reporter = console_and_reporter(json)
    with reported(console):
        settings["connect_timeout"] = connect_timeout
        for key in SECONDS_SETTINGS:
            if key in settings:
                settings[key] = seconds("--" + key.replace("_", "-"), settings[key])
        if "max_fetch" in settings:
            settings["fetch_limits"] = fetch_limits("--max-fetch", settings.pop("max_fetch"))
        code = action(reporter, RunSettings(accept_new_host_keys=accept_new_host_keys,
                                            **settings))
    exit_with(code)


@task(help={"runs_dir": RUN_HELP["runs_dir"]})
def runs(c, runs_dir="runs"):
    """List the local run records (oldest first, newest last).

    One row per run: id, start time, hosts, tasks and state (starting, running, detached,
    finished with its exit code, interrupted, down)."""
    run_task(lambda reporter, _: list_runs(Path(runs_dir), reporter))


@task(help=RUN_HELP)
def status(c, run="", runs_dir="runs", connect_timeout="10", accept_new_host_keys=False):
    """Show every task of a run as its host sees it now.

    State, pid, exit code, last epoch, loss and metrics. An ended run is shown from its
    local records."""
    run_task(lambda reporter, s: show_status(Path(runs_dir), run or None, s, reporter),
             connect_timeout, accept_new_host_keys)


@task(help={**RUN_HELP,
            "follow": f"keep following, with the live view of {command('train')}, until the "
                      "run ends; "
                      "then fetch artifacts, write summary.json and tear the run down. "
                      "Ctrl-C, SIGTERM or closing the terminal stop following only: the "
                      "run goes on",
            "task": "print only this task's lines: its name as its log is named (worker-1, "
                    "chief-0, ps-0) or its index (every task's log is still kept locally)",
            "start_timeout": "with --follow: seconds for every task to reach its first "
                             "training step before the run is torn down (default: 0, off)",
            "lost_after": "with --follow: " + LOST_AFTER_HELP,
            "verbose": VERBOSE_HELP,
            "tail": "of the local copy, print only each task's last N lines (read from the end "
                    "of the log: at once, whatever its size)",
            "max_fetch": "with --follow: " + MAX_FETCH_HELP,
            "json": JSON_HELP})
def logs(c, run="", follow=False, task=None, runs_dir="runs", connect_timeout="10",
         accept_new_host_keys=False, start_timeout="0", verbose=False, lost_after="10",
         max_fetch="", json=False, tail=""):
    """Print a run's logs; with --follow, reattach until the run ends.

    First the local copy, then what the hosts wrote since (nothing twice); the local copy
    is completed on the way."""
    last = None if tail == "" else count("--tail", tail, MAX_TAIL)

    def action(reporter, settings):
        only = None if task is None else str(task)
        return show_logs(Path(runs_dir), run or None, follow, only, settings, reporter, last)
    run_task(action, connect_timeout, accept_new_host_keys, json,
             start_timeout=start_timeout, verbose=verbose, lost_after=lost_after,
             max_fetch=max_fetch)


@task(help={"run": RUN_HELP["run"], "runs_dir": RUN_HELP["runs_dir"]})
def plot(c, run="", runs_dir="runs"):
    """Draw runs/<id>/loss.png again from the run's local logs: every task's loss per epoch
    (and validation loss where reported). Works for runs that ended badly, and while a run
    is followed (from what has reached this machine).

    Exit status: 0 when drawn, 1 when no task reported a loss, 2 for bad input."""
    run_task(lambda reporter, _: draw_plot(Path(runs_dir), run or None, reporter))


@task(help={**RUN_HELP, "max_fetch": MAX_FETCH_HELP})
def down(c, run="", runs_dir="runs", connect_timeout="10", accept_new_host_keys=False,
         max_fetch=""):
    """Stop a run on every host and remove it there.

    Fetches the chief's artifacts, sends SIGTERM to every task's process group, SIGKILL after
    the run's grace, checks every host for survivors (reported loudly, exit 1) and removes
    the run directories. Only this run's processes and directories are touched."""
    run_task(lambda reporter, s: stop_run(Path(runs_dir), run or None, s, reporter),
             connect_timeout, accept_new_host_keys, max_fetch=max_fetch)


@task(help={
    "run": "the run to resume: its id, or a unique prefix of one (required)",
    "hosts": "inventory to resume on, e.g. with a new VM in place of a lost host (default: "
             "the hosts of the run's record)",
    "runs_dir": RUN_HELP["runs_dir"],
    **SSH_HELP,
    "start_timeout": "seconds for every task to reach its first training step (default: 120)",
    "lost_after": LOST_AFTER_HELP,
    "restarts": "when a task fails or a host is lost again, relaunch up to N times (default: "
                "0)",
    "shrink": "with --restarts, when a host is lost and no spare is left, relaunch on the "
              "hosts that remain",
    "min_workers": "with --shrink, the fewest workers to go on with (default: 1)",
    "no_check": "skip the checks before starting (versions, disk, ports, TCP mesh)",
    "allow_busy_gpus": "run on GPUs another run or user holds",
    "detach": DETACH_HELP,
    "verbose": VERBOSE_HELP,
    "max_fetch": MAX_FETCH_HELP,
    "json": JSON_HELP,
})
def resume(c, run="", hosts="", runs_dir="runs", connect_timeout="10",
           accept_new_host_keys=False, start_timeout="120", lost_after="10", restarts="0",
           shrink=False, min_workers="1", no_check=False, allow_busy_gpus=False, detach=False,
           verbose=False, max_fetch="", json=False):
    """Start a run that ended without finishing again, from its last backup.

    A run that failed, lost a host, was interrupted or stopped with `inv down` goes on from the
    copy of the chief's backup its controller kept after each epoch: the same payload, entry
    and arguments, on the hosts of --hosts or of its record, its logs going on in the same run
    directory after an attempt marker. Refused when the run finished, still runs, or kept no
    backup. With --detach it returns once the run has started again, as `inv train --detach`
    does (with --restarts, handed to a controller in the background).

    Exit status as `inv train`'s."""
    console, reporter = console_and_reporter(json)
    with reported(console):
        if not run:
            raise BadInput(f"--run is required: the run to resume ({command('runs')} lists "
                           "them)")
        chosen = inventory(console, hosts) if hosts else None
        settings = run_settings(runs_dir, connect_timeout, accept_new_host_keys, start_timeout,
                                lost_after, no_check, restarts, verbose, max_fetch,
                                allow_busy_gpus, shrink, min_workers, detach=detach)
        code = resume_run(Path(runs_dir), run, chosen, settings, reporter)
    exit_with(code)


# The tasks' docstrings are their --help: they name the command as the user runs it.
for _task in Collection.from_module(sys.modules[__name__]).tasks.values():
    _task.__doc__ = (_task.__doc__ or "").replace("`inv ", f"`{PROGRAM} ")

# Invoke's own flags that do nothing here (tfdeploy runs no shell commands through Invoke).
HIDDEN_FLAGS = ("--command-timeout", "--config", "--debug", "--dry", "--echo", "--hide",
                "--list-depth", "--list-format", "--prompt-for-sudo-password", "--pty",
                "--warn-only", "--write-pyc")
# What a flag's value is, in --help, where Invoke would say STRING.
VALUES = {"--connect-timeout": "SECONDS", "--grace": "SECONDS", "--start-timeout": "SECONDS",
          "--lost-after": "SECONDS", "--older-than": "DAYS", "--restarts": "N",
          "--max-fetch": "SIZE", "--task": "NAME|N", "--hosts": "FILE", "--payload": "DIR",
          "--entry": "SCRIPT", "--runs-dir": "DIR", "--run": "RUN_ID", "--wheelhouse": "DIR",
          "--args": "'ARGS'", "--tail": "N", "--run-id": "RUN_ID", "--nodes": "N",
          "--gpus-per-node": "[TYPE:]G", "--time": "LIMIT", "--partition": "NAME",
          "--account": "NAME", "--min-workers": "N"}


class TfdeployProgram(Program):
    """Invoke's Program as the installed `tfdeploy`: its help shows what applies here, and a
    mistyped task or flag exits 2 (bad input) naming the nearest one."""

    def print_columns(self, tuples) -> None:
        shown = []
        for names, text in tuples:
            if any(re.search(rf"{flag}(?![\w-])", names) for flag in HIDDEN_FLAGS):
                continue
            names = re.sub(r"(--[\w-]+)(\[?)=STRING",
                           lambda m: f"{m[1]}{m[2]}={VALUES.get(m[1], 'TEXT')}", names)
            shown.append((names.replace("STRING", "TEXT"), text))
        super().print_columns(shown)

    def parse_core(self, argv) -> None:
        try:
            super().parse_core(argv)
        except ParseError as error:
            raise Exit(self.explained(error), code=2) from None

    def parse_tasks(self) -> None:
        try:
            super().parse_tasks()
        except ParseError as error:
            raise Exit(self.explained(error), code=2) from None

    def explained(self, error: ParseError) -> str:
        """Invoke's "No idea what 'x' is!" as what it means and what was likely meant."""
        unknown = re.fullmatch(r"No idea what '(.*)' is!", str(error))
        if unknown is None:
            return f"error: {error}"
        word = unknown[1]
        context = getattr(error, "context", None)
        if word.startswith("-") and context is not None and context.name:
            near = difflib.get_close_matches(word, [f for f in context.flags
                                                    if f.startswith("--")], n=1, cutoff=0.8)
            hint = f"; did you mean {near[0]}?" if near else ""
            if context.name == "train" and not near:
                after = self.argv[self.argv.index(word) + 1:] if word in self.argv else []
                value = f" {after[0]}" if after and not after[0].startswith("-") else ""
                hint = f"; for the payload's own flags: --args \"{word}{value}\""
            return (f"error: {command(context.name)} has no flag {word}{hint} "
                    f"({command(context.name)} --help lists them)")
        near = difflib.get_close_matches(word, list(self.collection.task_names), n=1,
                                         cutoff=0.6)
        return (f"error: no task or flag {word!r}" + (f"; did you mean {near[0]}?" if near
                                                      else "") +
                f" ({command('--list')} lists the tasks)")


def main() -> None:
    """The installed `tfdeploy` command: these tasks, from any directory."""
    TfdeployProgram(name="tfdeploy", binary="tfdeploy", version=metadata.version("tfdeploy"),
                    namespace=Collection.from_module(sys.modules[__name__])).run()


if __name__ == "__main__":
    main()
