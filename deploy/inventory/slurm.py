"""`--hosts slurm`: the inventory of the Slurm allocation the controller runs in (salloc,
sbatch), and how each of its nodes is reached (an `srun` step per node, deploy/transport/
slurm.py): no ssh, no keys.

The nodes come from SLURM_JOB_NODELIST (a hostlist, `gpu[01-03,07],cpu1`, expanded here as
Slurm does), their tasks from SLURM_TASKS_PER_NODE (`2(x3),1`), their GPUs from
SLURM_GPUS_PER_NODE, their addresses from `scontrol show node` (NodeAddr: the address the
other nodes reach it at). docs/slurm.md has how a run on Slurm goes.
"""
from __future__ import annotations

import re
import subprocess
import sys
from typing import Callable, Mapping

from deploy.errors import BadInput
from deploy.inventory.address import Address
from deploy.inventory.load import MAX_HOSTS, MAX_WORKERS_PER_HOST
from deploy.inventory.model import Host, Inventory
from deploy.inventory.names import name_problem

NAME = "slurm"                      # --hosts slurm
TRANSPORT = "slurm"
SCONTROL_TIMEOUT = 30.0
JOB_ID = re.compile(r"^[0-9]+(_[0-9]+)?$")
OUTSIDE = ("--hosts slurm takes the hosts of the Slurm allocation it runs in, and there is none "
           "here (no SLURM_JOB_ID): run it inside one (salloc -N2 {train} --hosts slurm …, or "
           "in an sbatch script), or let {submit} queue the run")


class SlurmError(BadInput):
    """The allocation's variables or scontrol's answer cannot make an inventory."""


class NoScontrol(SlurmError):
    """scontrol could not be asked (not installed, no answer, refused)."""


def expand_hostlist(text: str) -> list[str]:
    """A Slurm hostlist as Slurm expands it: `n[1-3,07],gpu1` → n1 n2 n3 n07 gpu1 (a range
    keeps the width of its first bound: [01-10] → 01 … 10); brackets may repeat in a name."""
    names: list[str] = []
    for item in _split_top(text.strip()):
        if not item:
            raise SlurmError(f"hostlist {text!r}: an empty name")
        names.extend(_expand_item(item, text))
    return names


def _split_top(text: str) -> list[str]:
    """Split at the commas outside brackets."""
    items, depth, start = [], 0, 0
    for i, c in enumerate(text):
        depth += (c == "[") - (c == "]")
        if c == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    return items


def _expand_item(item: str, whole: str) -> list[str]:
    match = re.match(r"^([^\[\]]*)\[([^\[\]]*)\](.*)$", item)
    if not match:
        if "[" in item or "]" in item:
            raise SlurmError(f"hostlist {whole!r}: unbalanced brackets in {item!r}")
        return [item]
    prefix, ranges, rest = match.groups()
    numbers = []
    for part in ranges.split(","):
        bounds = part.split("-")
        if len(bounds) > 2 or not all(b.isdigit() for b in bounds):
            raise SlurmError(f"hostlist {whole!r}: {part!r} is not a number or a range")
        low, high = int(bounds[0]), int(bounds[-1])
        if high < low or high - low > MAX_HOSTS:
            raise SlurmError(f"hostlist {whole!r}: range {part!r} is out of bounds")
        numbers += [str(n).zfill(len(bounds[0])) for n in range(low, high + 1)]
    return [prefix + n + tail for n in numbers for tail in _expand_item(rest, whole)]


def tasks_per_node(text: str, nodes: int) -> list[int]:
    """SLURM_TASKS_PER_NODE (`2(x3),1`: two tasks on each of three nodes, then one) as a count
    per node, checked against the number of nodes."""
    counts: list[int] = []
    for part in text.strip().split(","):
        match = re.fullmatch(r"([0-9]+)(?:\(x([0-9]+)\))?", part)
        if not match:
            raise SlurmError(f"SLURM_TASKS_PER_NODE={text!r}: {part!r} is not N or N(xM)")
        count, times = int(match.group(1)), int(match.group(2) or 1)
        if not 1 <= count <= MAX_WORKERS_PER_HOST or times > MAX_HOSTS:
            raise SlurmError(f"SLURM_TASKS_PER_NODE={text!r}: {part!r} is out of bounds")
        counts += [count] * times
    if len(counts) != nodes:
        raise SlurmError(f"SLURM_TASKS_PER_NODE={text!r} gives {len(counts)} node(s), the "
                         f"allocation has {nodes}")
    return counts


def gpus_per_node(environ: Mapping[str, str]) -> int | None:
    """The GPUs Slurm gives each node (sbatch/salloc --gpus-per-node=[type:]G), or None."""
    given = environ.get("SLURM_GPUS_PER_NODE", "")
    if not given:
        return None
    count = given.rpartition(":")[2]
    if not count.isdigit() or not 1 <= int(count) <= MAX_WORKERS_PER_HOST:
        raise SlurmError(f"SLURM_GPUS_PER_NODE={given!r} is not a GPU count")
    return int(count)


def node_addresses(fields: str) -> dict[str, str]:
    """NodeName → NodeAddr from `scontrol --oneliner show node` (a line per node)."""
    found = {}
    for line in fields.splitlines():
        name = re.search(r"(?:^|\s)NodeName=(\S+)", line)
        address = re.search(r"(?:^|\s)NodeAddr=(\S+)", line)
        if name and address:
            found[name.group(1)] = address.group(1)
    return found


def ask_scontrol(nodelist: str, environ: Mapping[str, str]) -> str:
    """`scontrol --oneliner show node <nodelist>`'s output, or SlurmError saying why not."""
    try:
        done = subprocess.run(["scontrol", "--oneliner", "show", "node", nodelist],
                              capture_output=True, text=True, timeout=SCONTROL_TIMEOUT,
                              env=dict(environ))
    except FileNotFoundError:
        raise NoScontrol("--hosts slurm: scontrol is not on PATH (Slurm's client commands are "
                         "needed where the controller runs)") from None
    except subprocess.TimeoutExpired:
        raise NoScontrol(f"scontrol show node {nodelist}: no answer in "
                         f"{SCONTROL_TIMEOUT:g} s") from None
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        raise NoScontrol(f"scontrol show node {nodelist}: "
                         f"{said[-1] if said else f'exit code {done.returncode}'}")
    return done.stdout


def allocation_inventory(environ: Mapping[str, str], outside: str,
                         scontrol: Callable[[str, Mapping[str, str]], str] | None = ask_scontrol,
                         ) -> Inventory:
    """The allocation's nodes as an inventory: a host per node (its name, NodeAddr, tasks and
    GPUs), reached by srun in the allocation's job. `outside` is the error for a shell that
    is in no allocation. Without `scontrol` (a dry run where no Slurm answers), the node names
    stand for their addresses."""
    job, nodelist = environ.get("SLURM_JOB_ID", ""), environ.get("SLURM_JOB_NODELIST", "")
    if not job:
        raise SlurmError(outside)
    if not JOB_ID.match(job):
        raise SlurmError(f"SLURM_JOB_ID={job!r} is not a Slurm job id")
    if not nodelist:
        raise SlurmError(f"SLURM_JOB_ID={job} but no SLURM_JOB_NODELIST: not an allocation's "
                         "environment")
    names = expand_hostlist(nodelist)
    if len(names) > MAX_HOSTS:
        raise SlurmError(f"SLURM_JOB_NODELIST={nodelist!r}: more than {MAX_HOSTS} nodes")
    for name in names:
        problem = name_problem(name)
        if problem:
            raise SlurmError(f"SLURM_JOB_NODELIST: node {name!r}: {problem}")
    gpus = gpus_per_node(environ)
    counts = ([gpus] * len(names) if gpus else
              tasks_per_node(environ.get("SLURM_TASKS_PER_NODE") or f"1(x{len(names)})",
                             len(names)))
    addresses = node_addresses(scontrol(nodelist, environ)) if scontrol else {}
    hosts = []
    for name, count in zip(names, counts):
        if scontrol and name not in addresses:
            raise SlurmError(f"scontrol show node {nodelist}: no NodeAddr for node {name!r}")
        address = addresses.get(name, name)
        try:
            address = Address.parse(address).text
        except ValueError as exc:
            raise SlurmError(f"node {name}: NodeAddr {address!r}: {exc}") from None
        # The nodes share the controller's home and Python (Slurm runs the allocation's
        # steps with the submitter's environment): its interpreter is theirs.
        hosts.append(Host(name=name, address=address, transport=TRANSPORT, workers=count,
                          gpus=count if gpus else None, python=sys.executable,
                          slurm_job=job))
    return Inventory(path=NAME, hosts=tuple(hosts))


def srun_argv(host: Host) -> list[str]:
    """How a command reaches a node: a job step of one task on it, beside the run's other
    steps (--overlap), its stdout unbuffered (-u: partial lines and every byte pass at once)."""
    return ["srun", f"--jobid={host.slurm_job}", "--overlap", "-N1", "-n1", "-w", host.name,
            "-u", "--quiet"]
