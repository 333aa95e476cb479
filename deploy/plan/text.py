"""The plan as text (for --dry-run) and as a document (for runs/<id>/plan.json).

Secret values appear as *** in both; only the wire carries them.
"""
from __future__ import annotations

import json

from deploy.commandline import command
from deploy.inventory.model import Host
from deploy.inventory.slurm import srun_argv
from deploy.plan.planner import HOST_KEY_SHOWN, HostPlan, RunPlan, agent_command


def plan_document(plan: RunPlan) -> dict:
    return {
        "run_id": plan.run_id,
        "entry": plan.options.entry,
        "args": list(plan.options.args),
        "hosts": [{
            "name": hp.host.name,
            "transport": hp.host.transport,
            "address": hp.host.address,
            **({"ssh": ssh_route(hp.host)} if hp.host.transport == "ssh" else {}),
            "run_dir": hp.run_dir,
            **({"env_python": hp.env_python} if hp.env_python else {}),
            **({"data": {"source": hp.host.data.shown, "dir": hp.data_dir}}
               if hp.data_dir else {}),
            **({"data_push": hp.data_push.shown()} if hp.data_push else {}),
            "agent": agent_command(hp.host).shown(),
            "push": hp.push.shown(),
            "ports": hp.ports.shown(),
            "tasks": [{
                "task": t.name,
                **({"role": t.role} if plan.has_roles else {}),
                "endpoint": t.endpoint,
                **({"gpus": t.gpus} if t.gpus else {}),
                "tf_config": t.tf_config,
                "env": t.launch.shown_env(),
                "launch": t.launch.shown(),
            } for t in hp.tasks],
        } for hp in plan.hosts],
    }


def data_lines(hp: HostPlan) -> list[str]:
    """Where the host's tasks find their data: the source, TFDEPLOY_DATA_DIR, the push."""
    data = hp.host.data
    if data is None:
        return []
    if data.kind == "remote":
        return [f"  data:   remote {data.given or data.path} (already on the host; checked, "
                "not pushed)"]
    named = ("" if data.tree else
             " (<tree-sha256>: the content hash of its files, computed at push)")
    return [f"  data:   local {data.given} -> {hp.data_dir}{named}; kept "
            "between runs", f"  data push: {hp.data_push.shown()}"]


def ssh_route(host: Host) -> str:
    """`root@10.0.0.5:22 (alias lab-a) via gw (admin@10.0.0.1:22)`: the login as it is made,
    gateways first to last."""
    ssh = host.ssh
    text = ssh.shown() + (f" (alias {host.address})" if ssh.hostname != host.address else "")
    hops = [hop.described() for hop in host.via]
    return text + (" via " + ", then ".join(hops) if hops else "")


def plan_text(plan: RunPlan) -> str:
    tasks = plan.tasks
    lines = [f"run {plan.run_id}: {len(tasks)} task(s) on {len(plan.hosts)} host(s); "
             f"chief is {plan.chief.name} on {plan.chief.host.name}"]
    if plan.has_roles:
        counts = {}
        for t in tasks:
            counts[t.role] = counts.get(t.role, 0) + 1
        lines.append("roles: " + ", ".join(f"{role} {n}" for role, n in counts.items())
                     + "; the run ends when the chief ends")
    if any(t.port is None and t.in_cluster for t in tasks):
        lines.append("ports: <port> is chosen on each host at launch (a free port per task)")
    lines.append("cluster: " + json.dumps(tasks[0].tf_config["cluster"], separators=(",", ":")))
    for hp in plan.hosts:
        host = hp.host
        where = ("local subprocesses" if host.transport == "local" else
                 " ".join(srun_argv(host)) if host.transport == "slurm" else
                 f"ssh {ssh_route(host)}")
        lines += ["", f"host {host.name} ({where}), run dir {hp.run_dir}",
                  f"  agent:  {agent_command(host).shown()}",
                  f"  push:   {hp.push.shown()}", f"  ports:  {hp.ports.shown()}"]
        if hp.env_python:
            lines.append(f"  python: {hp.env_python} if `{command('setup')}` built it, "
                         f"else {host.python} "
                         f"({HOST_KEY_SHOWN}: of the host's Python build, machine and libc, "
                         "resolved on the host)")
        lines += data_lines(hp)
        if host.gpus == "free" or isinstance(host.gpus, int):
            lines.append(f"  gpus:   {host.gpus}: " + (
                "a task per free GPU" if host.gpus == "free" else
                f"{host.gpus} free GPU(s), a task each") + ", chosen and leased by the host when "
                "the run starts (--allow-busy-gpus: busy ones too)")
        elif isinstance(host.gpus, tuple):
            lines.append(f"  gpus:   {', '.join(map(str, host.gpus))}, each leased by the host "
                         f"when the run starts; a busy one refuses the run (unless "
                         f"--allow-busy-gpus)")
        if not hp.tasks:
            lines.append("  spare:  no task until a host is lost (--restarts); then that host's "
                         "tasks")
        for t in hp.tasks:
            gpus = {None: "", "all": ", all GPUs"}.get(t.gpus, f", GPU {t.gpus}")
            where = (f"at {t.endpoint}" if t.in_cluster
                     else f"on {t.endpoint} (not in the cluster: no port)")
            role = f" ({t.role})" if plan.has_roles else ""
            lines.append(f"  {t.name}{role} {where}{gpus}")
            lines.append(f"    launch: {t.launch.shown()}")
            lines += [f"    env {key}={value}" for key, value in t.launch.shown_env().items()]
        lines.append(f"  end:    stop tasks (TERM, KILL after {plan.options.grace:g} s), "
                     f"fetch logs{' and output' if plan.chief in hp.tasks else ''}, "
                     f"delete {hp.run_dir}")
    return "\n".join(lines) + "\n"
