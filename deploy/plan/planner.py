"""Turn an inventory and options into a plan: per host and task, the exact commands and
environment it will get. Pure: no clock, no randomness, no network; `--dry-run` prints it and
the tests compare it with golden files.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Collection, Mapping

from deploy.host import layout
from deploy.host.archive import Limits
from deploy.host.envkey import env_python
from deploy.host.layout import in_run
from deploy.host.protocol import (
    BackupOutRequest, CleanupRequest, CreditRequest, DataPushRequest, DataReceiveRequest,
    FollowRequest, GpuPlaceRequest, GpuReleaseRequest, LaunchRequest, PollRequest, PortsRequest,
    PushRequest, ReceiveRequest, ReplaceBackupRequest, StopRequest, TailRequest, TarOutRequest
)
from deploy.host.records import fields as record_fields
from deploy.inventory.datasource import host_data_dir
from deploy.inventory.model import CLUSTER_ROLES, EnvValue, Host, Inventory
from deploy.plan.command import Command, HostPath, Request
from deploy.plan.ports import ports_to_probe

# The agent's python runs what comes first on its stdin (deploy/host/boot.py, headed by its
# length), which loads the host package from memory and serves requests (deploy/host/agent.py).
# `python -` would read stdin to its end before running anything. `-S`: the agent needs the
# standard library only, and a Python's site start-up is most of its start (probe.py finds
# the tasks' packages without it).
AGENT_BOOT = "import sys;i=sys.stdin.buffer;exec(i.read(int(i.readline())))"


def agent_command(host: Host) -> Command:
    """The host's agent for the whole run: started once, asked every step as a Request."""
    return Command((HostPath(host.python), "-I", "-S", "-c", AGENT_BOOT),
                   stdin="deploy/host/boot.py, the host package and the folder of its compiled "
                         "code, each headed by its length; then requests")

# Where a plan shows an environment's host key, which only the host computes.
HOST_KEY_SHOWN = "<host key>"


@dataclass(frozen=True)
class Options:
    payload: str = "payload"
    entry: str = "train.py"
    args: tuple[str, ...] = ()
    grace: float = 3.0
    # sha256 of the payload's requirements.txt: tasks prefer the env `inv setup` built from it.
    requirements_sha256: str | None = None


@dataclass(frozen=True)
class TaskPlan:
    index: int                       # across the run, in inventory order: the internal key
    host: Host
    port: int | None
    tf_config: Mapping
    launch: Request                  # its env is the task's environment
    gpus: str | None = None          # "1": CUDA_VISIBLE_DEVICES=1; "all": every GPU; None
    role: str = "worker"             # TF_CONFIG's task type
    type_index: int = 0              # TF_CONFIG's task index: among the tasks of its type

    @property
    def env(self) -> Mapping[str, EnvValue]:
        return self.launch.env

    @property
    def key(self) -> str:
        """How the host verbs name the task (layout.task_key)."""
        return layout.task_key(self.role, self.type_index)

    @property
    def name(self) -> str:
        return layout.task_name(self.key)

    @property
    def in_cluster(self) -> bool:
        """In the cluster dict, with a port: every task but the evaluator."""
        return self.role in CLUSTER_ROLES

    @property
    def endpoint(self) -> str:
        if not self.in_cluster:
            return str(self.host.tf_address)
        return endpoint(self.host, self.port)


@dataclass(frozen=True)
class HostPlan:
    host: Host
    run_dir: str
    push: Request
    ports: Request
    tasks: tuple[TaskPlan, ...]
    # sha256 of the requirements.txt whose `inv setup` environment the tasks prefer (None: the
    # host's python); the host resolves which environment is its own (deploy/host/envkey.py).
    env_requirements: str | None = None
    data_dir: str | None = None       # TFDEPLOY_DATA_DIR of its tasks
    data_push: Request | None = None  # local data: the push of its files

    @property
    def env_python(self) -> str | None:
        """The interpreter the tasks prefer, as the plan shows it: its host key is computed
        on the host."""
        if self.env_requirements is None:
            return None
        return env_python(self.host.workdir, self.env_requirements, key=HOST_KEY_SHOWN)


@dataclass(frozen=True)
class RunPlan:
    run_id: str
    options: Options
    hosts: tuple[HostPlan, ...]

    @property
    def tasks(self) -> tuple[TaskPlan, ...]:
        return tuple(t for h in self.hosts for t in h.tasks)

    @property
    def chief(self) -> TaskPlan:
        """The chief task, or worker 0 in a cluster of workers only."""
        return next((t for t in self.tasks if t.role == "chief"), self.tasks[0])

    @property
    def has_roles(self) -> bool:
        """A parameter-server cluster: some task is not a worker."""
        return any(t.role != "worker" for t in self.tasks)

    def by_key(self, host: str) -> dict[str, TaskPlan]:
        """The tasks of host `host` by their key: how the host's answers name them."""
        return {t.key: t for hp in self.hosts if hp.host.name == host for t in hp.tasks}

    @property
    def chief_host(self) -> HostPlan:
        return next(h for h in self.hosts if self.chief in h.tasks)

    @property
    def inventory(self) -> Inventory:
        return Inventory("", tuple(hp.host for hp in self.hosts))

    def with_ports(self, ports: Mapping[int, int]) -> "RunPlan":
        """The same run with its tasks on `ports` (task index -> port): their TF_CONFIG, and
        the launch requests that carry it, name them. The one way a plan changes once made:
        at the launch, and at each relaunch on fresh ports (or on other hosts, recovery.py)."""
        return plan_run(self.inventory, self.options, self.run_id, ports)

    def without(self, names: Collection[str]) -> "RunPlan":
        """The plan's hosts but `names` (hosts given up on): what may still be asked."""
        return dataclasses.replace(self, hosts=tuple(hp for hp in self.hosts
                                                     if hp.host.name not in names))


def endpoint(host: Host, port: int | None) -> str:
    """`address:port` in TF_CONFIG, `[v6]:port` for IPv6 (TensorFlow cannot split `::1:2222`)."""
    return host.tf_address.with_port(port if port is not None else "<port>")


def run_dir(host: Host, run_id: str) -> str:
    return layout.run_dir(host.workdir, run_id)


def cache_dir(host: Host) -> str:
    """Content-addressed payload files; outside every run dir, kept between runs."""
    return layout.cache_dir(host.workdir)


def env_requirements(host: Host, requirements_sha256: str | None) -> str | None:
    """Whether tasks prefer an `inv setup` environment, named by its requirements.txt: not
    when the inventory names the host's own `python`, nor without a requirements.txt."""
    if host.own_python or not requirements_sha256:
        return None
    return requirements_sha256


def host_offsets(hp: "HostPlan", offsets: Mapping[int, int]) -> dict[str, int]:
    """The offsets (by task index) of the host's tasks, by the keys the host knows them by."""
    return {t.key: offsets[t.index] for t in hp.tasks}


def poll_request(rundir: str, offsets: Mapping[str, int]) -> Request:
    """Each task's state, and its log from `offsets` (task key -> byte) on."""
    return Request(PollRequest(HostPath(rundir), dict(offsets)))


def follow_request(rundir: str, offsets: Mapping[str, int]) -> Request:
    return Request(FollowRequest(HostPath(rundir), dict(offsets)))


def credit_request(follow: int) -> Request:
    """Lets the follow of request id `follow` send one more frame."""
    return Request(CreditRequest(follow))


def stop_request(rundir: str, grace: float) -> Request:
    return Request(StopRequest(HostPath(rundir), grace))


def cleanup_request(host: Host, rundir: str, grace: float,
                    run_id: str | None = None) -> Request:
    """Stop, and delete the run directory of run `run_id` once no other host sharing it (one
    workdir on an NFS home) still uses it; a host that never got the run (its push failed) has
    nothing to clean and answers so, instead of failing."""
    return Request(CleanupRequest(HostPath(rundir), grace, host.name, run_id))


def fetch_output_request(rundir: str, limits: Limits) -> Request:
    """The chief's output folder as tar.gz; nothing when it has none; an error when it holds
    more than `limits` (an archive past them would be refused here)."""
    return Request(TarOutRequest(HostPath(in_run(rundir, layout.OUTPUT)), limits.bytes,
                                 limits.members))


def tensorboard_tail_request(rundir: str, sizes: Mapping[str, int], limits: Limits) -> Request:
    """What the chief's TensorBoard logs have beyond `sizes` (the local copy's): event files
    only grow, so only their new bytes travel."""
    return Request(TailRequest(HostPath(in_run(rundir, layout.TENSORBOARD)), dict(sizes),
                               limits.bytes, limits.members))


def gpu_place_request(host: Host, run_id: str, allow_busy: bool) -> Request:
    """The host's GPUs for its tasks, leased for the run: the listed ones, N free ones, or
    every free one (`gpus: [0, 1]`, `gpus: 2`, `gpus: free`)."""
    gpus = host.gpus
    return Request(GpuPlaceRequest(run_id, gpus if isinstance(gpus, tuple) else None,
                                   gpus if isinstance(gpus, int) else None, allow_busy))


def gpu_release_request(run_id: str) -> Request:
    return Request(GpuReleaseRequest(run_id))


# The most files of the controller's copy listed in a fetch of the backup (each about 60
# bytes of a request's header, itself at most 1 MiB): past it, every file travels.
MAX_KNOWN = 4096


def fetch_backup_request(rundir: str, limits: Limits,
                         known: Mapping[str, tuple[int, int]]) -> Request:
    """The chief's backup: its files, and as tar.gz those not as `known` (the controller's
    copy) lists them; nothing when it has none yet."""
    return Request(BackupOutRequest(HostPath(in_run(rundir, layout.BACKUP)),
                                    dict(known) if len(known) <= MAX_KNOWN else {},
                                    limits.bytes, limits.members))


def replace_backup_request(rundir: str, limits: Limits) -> Request:
    """Replace the host's backup with the tar.gz that comes with it (an empty archive: no
    backup), unpacked within `limits` (deploy/host/archive.py). Only <rundir>/backup is
    deleted, inside the run's own directory."""
    return Request(ReplaceBackupRequest(HostPath(rundir), limits.bytes, limits.members),
                   body="tar.gz of the chief's backup")


def push_request(host: Host, rundir: str, tasks: tuple[str, ...]) -> Request:
    """The stage unpacked into `rundir` (after the workdir is found safe), then what the cache
    lacks; after that answer, a `receive` request brings exactly those files. The host's name
    and its tasks are recorded in the run directory (which hosts sharing a workdir also
    share)."""
    return Request(PushRequest(HostPath(rundir), HostPath(cache_dir(host)), host.name,
                               ",".join(tasks)),
                   body="tar.gz of run.json, the host package and the payload manifest; after "
                        "the host's answer, the files it lacks, each headed by its sha256")


def receive_request(push: Request) -> Request:
    """The second half of a push (payload or data): its files, on the same channel."""
    receive = ReceiveRequest if isinstance(push.message, PushRequest) else DataReceiveRequest
    fields = {f.name: getattr(push.message, f.name) for f in record_fields(push.message)}
    return Request(receive(**fields), body="the files the host lacks, each headed by its sha256")


def data_commands(host: Host, rundir: str) -> dict:
    """The HostPlan fields for the host's data: its TFDEPLOY_DATA_DIR and, for local data, its
    push (as the payload's: answer what the cache lacks, then receive that)."""
    data_dir = host_data_dir(host.workdir, host.data)
    if data_dir is None or host.data.kind != "local":
        return {"data_dir": data_dir}
    return {
        "data_dir": data_dir,
        "data_push": Request(
            DataPushRequest(HostPath(rundir), HostPath(data_dir), HostPath(cache_dir(host))),
            body="tar.gz of the data manifest; after the host's answer, "
                 "the data files it lacks, each headed by its sha256"),
    }


def tf_config(cluster: Mapping[str, list[str]], index: int, task_type: str) -> dict:
    """TF_CONFIG: the cluster dict and this task's type and index. The evaluator gets the
    cluster but is not in it."""
    return {"cluster": dict(cluster), "task": {"type": task_type, "index": index}}


def cluster_dict(slots: list[tuple[Host, str, int]], ports: Mapping[int, int]) -> dict:
    """type -> endpoints, for the types present among `slots` (host, role, global index), in
    TF_CONFIG's order (chief, worker, ps); the evaluator is never in it."""
    spec: dict[str, list[str]] = {}
    for role in CLUSTER_ROLES:
        for host, slot_role, index in slots:
            if slot_role == role:
                spec.setdefault(role, []).append(endpoint(host, ports.get(index)))
    return spec


# What a plan shows for a GPU the host chooses when the run starts (gpus: N, gpus: free).
FREE_GPU_SHOWN = "<a free GPU>"


def task_gpus(host: Host, slot: int) -> str | None:
    """The GPUs of the host's `slot`-th task: one listed GPU each, all of them, or one the
    host will choose among its free ones."""
    if isinstance(host.gpus, tuple):
        return str(host.gpus[slot])
    if host.gpus == "all" or host.gpus is None:
        return host.gpus
    return FREE_GPU_SHOWN


def task_env(host: Host, run_id: str, rundir: str, config: dict, index: int,
             count: int, gpus: str | None = None,
             task_type: str = "worker") -> dict[str, EnvValue]:
    """`index` is the task's index among its type (TF_CONFIG's), `count` the number of worker
    tasks, `task_type` its TF_CONFIG type (chief, worker, ps, evaluator)."""
    env = {
        "TF_CONFIG": EnvValue(json.dumps(config, separators=(",", ":"))),
        # Keras 3 cannot run multi-worker fit; tf_keras can, selected by this switch.
        "TF_USE_LEGACY_KERAS": EnvValue("1"),
        # Without it, epoch lines sit in a buffer and the live view lags or loses them.
        "PYTHONUNBUFFERED": EnvValue("1"),
        "TFDEPLOY_RUN_ID": EnvValue(run_id),
        "TFDEPLOY_TASK_TYPE": EnvValue(task_type),
        "TFDEPLOY_TASK_INDEX": EnvValue(str(index)),
        "TFDEPLOY_NUM_WORKERS": EnvValue(str(count)),
        "TFDEPLOY_OUTPUT_DIR": EnvValue(in_run(rundir, layout.OUTPUT)),
        # Where the payload keeps its BackupAndRestore state, in every run: the controller
        # keeps a copy of the chief's after each epoch, which a relaunch (--restarts) or a
        # later `inv resume` carries to every host (there is no shared disk).
        "TFDEPLOY_BACKUP_DIR": EnvValue(in_run(rundir, layout.BACKUP)),
    }
    if gpus is not None and gpus != "all":
        env["CUDA_VISIBLE_DEVICES"] = EnvValue(gpus)
    if gpus is not None:
        # TensorFlow maps nearly all of a GPU's memory otherwise, used or not: on a GPU
        # shared by a group, memory nobody uses but nobody else can have.
        env["TF_FORCE_GPU_ALLOW_GROWTH"] = EnvValue("true")
    data = host_data_dir(host.workdir, host.data)
    if data is not None:
        env["TFDEPLOY_DATA_DIR"] = EnvValue(data)
    env.update(host.env)
    return env


def plan_run(inventory: Inventory, options: Options, run_id: str,
             ports: Mapping[int, int] | None = None) -> RunPlan:
    """The whole run. `ports` (task index -> port) is chosen on the hosts at launch; without
    it the plan shows `<port>` where those numbers will go."""
    ports = ports or {}
    slots = [(host, host.role, i) for i, host in
             enumerate(h for h in inventory.hosts for _ in range(h.tasks))]
    spec = cluster_dict(slots, ports)
    workers = sum(1 for _, role, _ in slots if role == "worker")
    seen: dict[str, int] = {}          # tasks of each type so far: the next one's index
    host_plans = []
    for host in inventory.hosts:
        rundir = run_dir(host, run_id)
        requirements = env_requirements(host, options.requirements_sha256)
        tasks = []
        for slot in range(host.tasks):
            index = sum(len(h.tasks) for h in host_plans) + len(tasks)
            type_index = seen[host.role] = seen.get(host.role, -1) + 1
            key = layout.task_key(host.role, type_index)
            gpus = task_gpus(host, slot)
            config = tf_config(spec, type_index, host.role)
            env = task_env(host, run_id, rundir, config, type_index, workers, gpus,
                           host.role)
            launch = Request(LaunchRequest(
                HostPath(rundir), key, HostPath(in_run(rundir, layout.PAYLOAD)),
                (HostPath(host.python), options.entry, *options.args), requirements,
                # NCCL carries GPU tasks' collectives: it must take the cluster's network.
                host.tf_address.text if gpus is not None else None), env)
            tasks.append(TaskPlan(
                index=index, host=host, port=ports.get(index) if host.cluster_tasks else None,
                tf_config=config, launch=launch,
                gpus=gpus, role=host.role, type_index=type_index))
        host_plans.append(HostPlan(
            host=host, run_dir=rundir,
            push=push_request(host, rundir, tuple(t.key for t in tasks)),
            ports=Request(PortsRequest(ports_to_probe(host))),
            tasks=tuple(tasks), env_requirements=requirements, **data_commands(host, rundir)))
    return RunPlan(run_id=run_id, options=options, hosts=tuple(host_plans))
