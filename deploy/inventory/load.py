"""Load and validate a host inventory into frozen values.

Everything downstream trusts these values, so every check happens here, once, and every
error names the file, the host, the field and (where YAML gives it) the line.
"""
from __future__ import annotations

import dataclasses
import fnmatch
import os
import posixpath
import re
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Mapping

import yaml

from deploy.inventory import openssh, sshconfig
from deploy.inventory.address import Address
from deploy.inventory.datasource import parse_data
from deploy.inventory.model import (
    ROLES, SPARE, EnvValue, Host, Inventory, InventoryError
)
from deploy.inventory.names import name_problem
from deploy.inventory.sshconfig import Hop, Route, SshConfigError, SshConfigs

TRANSPORTS = ("ssh", "local")
HOST_KEY_POLICIES = ("strict", "accept-new")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# A forward_env entry: a name, or a glob of one (NCCL_*, AWS_?_KEY).
FORWARD_PATTERN = re.compile(r"^[A-Za-z_*?][A-Za-z0-9_*?]*$")
HOST_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
CONTROLLER_VAR = re.compile(r"^\$\{([A-Za-z_][A-Za-z0-9_]*)\}$")
# Variables the launcher owns; a host may not override them.
RESERVED_ENV_PREFIXES = ("TFDEPLOY_",)
# TF_USE_LEGACY_KERAS=0 would bring back Keras 3, which cannot train multi-worker; without
# PYTHONUNBUFFERED the live view lags behind the tasks.
RESERVED_ENV = ("TF_CONFIG", "TF_USE_LEGACY_KERAS", "PYTHONUNBUFFERED")


# Ceilings (docs/bad-input.md): far above any cluster this tool is for, low enough that a
# typo such as `workers: 1000000000` is refused at once instead of planned. Every task takes
# a port and a process on its host, and every task's TF_CONFIG lists every other task.
MAX_INVENTORY_BYTES = 1 << 20
MAX_HOSTS = 512
MAX_WORKERS_PER_HOST = 128
MAX_TASKS = 512

HOST_FIELDS = {
    "name": str, "address": str, "transport": str, "port": int, "user": str,
    "identity_file": str, "certificate_file": str, "known_hosts": str, "host_key_policy": str,
    "python": str, "workdir": str, "cluster_address": str, "workers": int, "env": dict,
    "gpus": list, "forward_env": list, "data": dict, "ssh_config": str, "jump": str, "role": str,
}
ADDRESS_FIELDS = ("address", "cluster_address")
DEFAULT_FIELDS = {k: v for k, v in HOST_FIELDS.items() if k not in ("name", "address")}
TOP_FIELDS = ("defaults", "hosts")


class _Located:
    """Line numbers of the YAML keys, so errors can point into the file."""

    def __init__(self, root: yaml.Node | None):
        self.lines: dict[tuple, int] = {}
        self.seen: set[int] = set()
        if root is not None:
            self._walk(root, ())

    def _walk(self, node: yaml.Node, path: tuple) -> None:
        self.lines.setdefault(path, node.start_mark.line + 1)
        if id(node) in self.seen:   # an alias seen before (possibly of itself): walk it once
            return
        self.seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                sub = path + (getattr(key, "value", None),)
                self.lines[sub] = key.start_mark.line + 1
                self._walk(value, sub)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                self._walk(item, path + (i,))

    def line(self, *path) -> int | None:
        while path and path not in self.lines:
            path = path[:-1]
        return self.lines.get(path)


def load_inventory(path: str | os.PathLike, environ: Mapping[str, str] | None = None) -> Inventory:
    """Read `path`; raise InventoryError for anything a launch could trip over later."""
    file = str(path)
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_INVENTORY_BYTES + 1)
    except OSError as exc:
        raise InventoryError(file, f"cannot read inventory: {exc.strerror or exc}") from None
    if len(raw) > MAX_INVENTORY_BYTES:
        raise InventoryError(file, f"larger than {MAX_INVENTORY_BYTES >> 20} MiB: not an "
                                   "inventory")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InventoryError(file, f"not UTF-8 text (byte {exc.start})",
                             line=raw.count(b"\n", 0, exc.start) + 1) from None
    return parse_inventory(text, file, os.environ if environ is None else environ)


def parse_inventory(text: str, file: str, environ: Mapping[str, str]) -> Inventory:
    try:
        # Parsed once: the nodes (for line numbers), then the values made from them.
        loader = yaml.SafeLoader(text)
        try:
            root = loader.get_single_node()
            data = None if root is None else loader.construct_document(root)
        finally:
            loader.dispose()
        where = _Located(root)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark else None
        problem = getattr(exc, "problem", None) or str(exc)
        raise InventoryError(file, f"not valid YAML: {problem}", line=line) from None
    except RecursionError:
        raise InventoryError(file, "not an inventory: nested too deeply") from None
    if not isinstance(data, dict):
        raise InventoryError(file, "expected a mapping with a 'hosts' list", line=where.line())
    for key in data:
        if key not in TOP_FIELDS:
            raise InventoryError(file, f"unknown top-level field (known: {', '.join(TOP_FIELDS)})",
                                 field=str(key), line=where.line(key))
    defaults = data.get("defaults")
    if defaults is None:
        defaults = {}
    if not isinstance(defaults, dict):
        raise InventoryError(file, "must be a mapping", field="defaults",
                             line=where.line("defaults"))
    for key, value in defaults.items():
        if key not in DEFAULT_FIELDS:
            raise InventoryError(file, _unknown(key, DEFAULT_FIELDS), field=f"defaults.{key}",
                                 line=where.line("defaults", key))
    raw_hosts = data.get("hosts")
    if not isinstance(raw_hosts, list) or not raw_hosts:
        raise InventoryError(file, "must be a non-empty list of hosts", field="hosts",
                             line=where.line("hosts"))
    if len(raw_hosts) > MAX_HOSTS:
        raise InventoryError(file, f"lists {len(raw_hosts)} hosts; at most {MAX_HOSTS} are "
                                   "supported", field="hosts", line=where.line("hosts"))
    for i, raw in enumerate(raw_hosts):
        if not isinstance(raw, dict):
            raise InventoryError(file, f"host #{i + 1} must be a mapping", field="hosts",
                                 line=where.line("hosts", i))
    resolvers = Resolvers()

    def host(i: int) -> Host:
        raw = raw_hosts[i]
        return _host(file, where, i, _merged(defaults, raw), set(raw), environ, resolvers)
    # Hosts are read side by side: most of a host's time is its `ssh -G`, a process of its
    # own (seconds, one after the other, for hundreds of hosts). The first bad host in the
    # file's order is the one reported, as when read in turn.
    with ThreadPoolExecutor(max_workers=min(8, len(raw_hosts))) as pool:
        hosts: list[Host] = list(pool.map(host, range(len(raw_hosts))))
    _check_unique(file, where, hosts)
    _check_total(file, where, hosts)
    return Inventory(path=file, hosts=tuple(hosts))


def _check_total(file: str, where: _Located, hosts: list[Host]) -> None:
    total = 0
    for i, host in enumerate(hosts):
        total += host.workers
        if total > MAX_TASKS:
            raise InventoryError(
                file, f"brings the run to {total} tasks ({sum(h.workers for h in hosts)} in "
                      f"all); at most {MAX_TASKS} are supported", host=host.name,
                field="workers", line=where.line("hosts", i, "workers"))


def _merged(defaults: dict, raw: dict) -> dict:
    """A host's fields over the defaults; `env` merges name by name (the host's value wins),
    so a default such as a dataset path is not lost when a host adds one variable."""
    merged = {**defaults, **raw}
    if isinstance(defaults.get("env"), dict) and isinstance(raw.get("env"), dict):
        merged["env"] = {**defaults["env"], **raw["env"]}
    return merged


def _unknown(key: Any, known: Mapping) -> str:
    return f"unknown field {key!r} (known: {', '.join(known)})"


def _host(file: str, where: _Located, i: int, raw: dict, own: set,
          environ: Mapping[str, str], resolvers: "Resolvers") -> Host:
    name = raw.get("name")
    label = name if isinstance(name, str) else f"#{i + 1}"

    def fail(field_name: str, message: str) -> InventoryError:
        if field_name in own or ("defaults", field_name) not in where.lines:
            line = where.line("hosts", i, field_name)   # the field, or else the host entry
        else:
            line = where.line("defaults", field_name)
        return InventoryError(file, message, host=label, field=field_name, line=line)

    for key in raw:
        if key not in HOST_FIELDS:
            raise fail(key, _unknown(key, HOST_FIELDS))
    for key, kind in HOST_FIELDS.items():
        value = raw.get(key)
        if value is None:
            if key in raw:
                raise fail(key, "has no value (remove the line to use the default)")
            continue
        if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
            raise fail(key, f"must be a whole number, not {value!r}")
        if kind is str and not isinstance(value, str):
            raise fail(key, f"must be a string, not {value!r}" + (
                "; unquoted, YAML reads [2001:db8::1] as a list: quote it (\"[2001:db8::1]\") "
                "or leave out the brackets" if key in ADDRESS_FIELDS and isinstance(value, list)
                else ""))
        if kind is dict and not isinstance(value, dict) and key == "env":
            raise fail(key, "must be a mapping of NAME: value")
    if name is None:
        raise fail("name", "missing (every host needs a unique name)")
    if not HOST_NAME.fullmatch(name):
        raise fail("name", "use letters, digits, '.', '_' or '-', starting with a letter or digit")
    transport = raw.get("transport", "ssh")
    if transport not in TRANSPORTS:
        raise fail("transport", f"must be one of {', '.join(TRANSPORTS)}, not {transport!r}")
    address = raw.get("address")
    if address is None:
        if transport != "local":
            raise fail("address", "missing (how the controller reaches this host over SSH)")
        address = "127.0.0.1"
    for key in ("address", "cluster_address", "user", "python", "ssh_config", "jump"):
        value = raw.get(key)
        if value is not None and (not value or any(c.isspace() for c in value) or "\0" in value):
            raise fail(key, f"must be non-empty with no spaces, not {value!r}")
    address = _address(address, "address", fail)
    cluster_address = _address(raw.get("cluster_address") or "", "cluster_address", fail)
    port = raw.get("port")
    if port is not None and not 1 <= port <= 65535:
        raise fail("port", f"must be between 1 and 65535, not {port}")
    workers = raw.get("workers", 1)
    if workers < 1:
        raise fail("workers", f"must be at least 1, not {workers}")
    if workers > MAX_WORKERS_PER_HOST:
        raise fail("workers", f"must be at most {MAX_WORKERS_PER_HOST} tasks on one host, "
                              f"not {workers}")
    role = raw.get("role", "worker")
    if role not in ROLES:
        raise fail("role", f"must be one of {', '.join(ROLES)}, not {role!r}")
    gpus = _gpus(raw, fail)
    if role == SPARE and gpus is not None:
        # A spare takes a lost host's tasks as they were planned, GPUs placed at the start.
        raise fail("gpus", "a spare takes the tasks of a lost host: spares with GPUs are not "
                           "supported; remove `gpus` or the spare role")
    if isinstance(gpus, tuple):
        workers = len(gpus)
    elif isinstance(gpus, int):
        workers = gpus
    policy = raw.get("host_key_policy", "strict")
    if policy not in HOST_KEY_POLICIES:
        raise fail("host_key_policy",
                   f"must be one of {', '.join(HOST_KEY_POLICIES)}, not {policy!r}")
    workdir = raw.get("workdir", "~/.tfdeploy")
    problem = workdir_problem(workdir)
    if problem:
        raise fail("workdir", problem)
    env = _forwarded(raw.get("forward_env"), environ, lambda msg: fail("forward_env", msg))
    for key, value in (raw.get("env") or {}).items():
        env[key] = _env_value(key, value, environ, lambda msg, k=key: fail("env", f"{k}: {msg}"))
    if gpus is not None and "CUDA_VISIBLE_DEVICES" in env:
        raise fail("env", "CUDA_VISIBLE_DEVICES: is set from `gpus` on this host; remove it")
    data = raw.get("data")
    if data is not None:
        data = parse_data(data, Path(file).parent, lambda msg: fail("data", msg))
    route = _ssh_route(raw, address, transport, resolvers, fail)
    target = route.target if route else None
    if "host_key_policy" not in raw and route and route.accept_new:
        policy = "accept-new"       # StrictHostKeyChecking accept-new in the ssh config
    return Host(
        name=name, address=address, transport=transport, port=port, user=raw.get("user"),
        identity_file=raw.get("identity_file"),
        known_hosts=raw.get("known_hosts") or "~/.ssh/known_hosts",
        host_key_policy=policy,
        python=raw.get("python") or (sys.executable if transport == "local" else "python3"),
        workdir=posixpath.normpath(workdir),
        cluster_address=cluster_address, workers=workers, role=role, env=env,
        own_python="python" in raw, gpus=gpus, data=data,
        ssh_config=raw.get("ssh_config", sshconfig.DEFAULT_FILE), jump=raw.get("jump"),
        target=target, via=route.via if route else (),
    )


def _address(given: str, key: str, fail) -> str:
    """The address without the brackets an IPv6 address may be given in: `[2001:db8::1]`
    and `2001:db8::1` are one address (brackets are how it is printed with a port)."""
    if not given:
        return given
    try:
        return Address.parse(given).text
    except ValueError as exc:
        raise fail(key, str(exc)) from None


def _ssh_route(raw: dict, address: str, transport: str, resolvers: Resolvers,
               fail) -> Route | None:
    """The host's login and gateways through its ssh config (nothing for a local host)."""
    if transport == "local":
        if raw.get("jump") is not None:
            raise fail("jump", "a local host is not reached over SSH; remove jump")
        return None
    # Before `ssh -G` or a `Match exec` can see them. An IP address is checked as one
    # (Address.parse; a zone's `%` is the lints' to refuse), a name as a name.
    for key, value in (("address", address), ("user", raw.get("user"))):
        is_ip = key == "address" and Address.parse(value).ip is not None
        problem = value is not None and not is_ip and name_problem(value)
        if problem:
            raise fail(key, problem)
    try:
        route = resolvers.route(raw.get("ssh_config", sshconfig.DEFAULT_FILE), address,
                                raw.get("port"), raw.get("user"), raw.get("identity_file"),
                                raw.get("known_hosts"), raw.get("jump"))
    except SshConfigError as exc:
        raise fail(exc.field, str(exc)) from None
    certificate = raw.get("certificate_file")
    if not certificate:
        return route

    def certified(hop: Hop) -> Hop:         # as `ssh -o CertificateFile=…`: first, every hop
        return dataclasses.replace(hop, certificate_files=(certificate, *hop.certificate_files))
    return Route(certified(route.target), tuple(map(certified, route.via)), route.accept_new)


class Resolvers:
    """Who resolves the logins of one inventory load: OpenSSH (`ssh -G`), or where `ssh` is
    not installed, tfdeploy's own parser of the ssh config (saying so once)."""
    said = False
    saying = threading.Lock()      # hosts are read side by side

    def __init__(self) -> None:
        self.openssh = openssh.OpenSsh() if openssh.available() else None
        self.configs = SshConfigs()

    def route(self, ssh_config: str, address: str, port: int | None, user: str | None,
              identity_file: str | None, known_hosts: str | None, jump: str | None) -> Route:
        if self.openssh is not None:
            return self.openssh.route(ssh_config, address, port, user, identity_file,
                                      known_hosts, jump)
        with Resolvers.saying:
            say, Resolvers.said = not Resolvers.said, True
        if say:
            print(f"note: `{openssh.SSH}` is not installed: the ssh config is read by tfdeploy's "
                  f"own parser, which knows less of it than OpenSSH (no Match, no tokens, no "
                  f"ProxyCommand)", file=sys.stderr)
        route = sshconfig.host_route(self.configs, ssh_config, address, port, user,
                                     identity_file, jump)
        if not known_hosts:
            return route
        files = (os.path.expanduser(known_hosts),)
        return Route(dataclasses.replace(route.target, known_hosts=files),
                     tuple(dataclasses.replace(hop, known_hosts=files) for hop in route.via))


def _gpus(raw: dict, fail) -> tuple[int, ...] | str | int | None:
    """`gpus: [0, 1]` (one task per listed GPU), `gpus: 2` (two free GPUs, one task each),
    `gpus: free` (one task per free GPU) or `gpus: all` (one task that sees every GPU). Which
    GPUs are free is the host's to say when the run starts (gpuplace.py)."""
    gpus = raw.get("gpus")
    if gpus is None:
        return None
    if gpus in ("all", "free") or (isinstance(gpus, int) and not isinstance(gpus, bool)):
        if "workers" in raw:
            raise fail("workers", {
                "all": "gpus: all gives one task that sees every GPU; remove workers, or list "
                       "the GPUs (gpus: [0, 1]) for a task per GPU",
                "free": "gpus: free gives one task per free GPU; remove workers",
            }.get(gpus, f"gpus: {gpus} gives one task per free GPU, {gpus} of them; remove "
                        f"workers"))
        if isinstance(gpus, int) and not 1 <= gpus <= MAX_WORKERS_PER_HOST:
            raise fail("gpus", f"a number of free GPUs must be 1 to {MAX_WORKERS_PER_HOST}, "
                               f"not {gpus}")
        return gpus
    if not isinstance(gpus, list) or not gpus or not all(
            isinstance(g, int) and not isinstance(g, bool) and g >= 0 for g in gpus):
        raise fail("gpus", f"must be a list of GPU indices such as [0, 1], a number of free "
                           f"GPUs, free, or all, not {gpus!r}")
    if len(gpus) > MAX_WORKERS_PER_HOST:
        raise fail("gpus", f"lists {len(gpus)} GPUs: one task each, and at most "
                           f"{MAX_WORKERS_PER_HOST} tasks on one host are supported")
    twice = sorted({g for g in gpus if gpus.count(g) > 1})
    if twice:
        raise fail("gpus", f"lists GPU {twice[0]} more than once")
    if "workers" in raw:
        raise fail("workers", f"cannot be combined with a gpus list: each listed GPU gets one "
                              f"task ({len(gpus)} here); remove workers")
    return tuple(gpus)


def workdir_problem(workdir: str) -> str | None:
    """Why a workdir is unsafe to own, or None. Teardown deletes below it, so `/` and `~` are
    out."""
    if not workdir or "\0" in workdir or "\n" in workdir:
        return "must be a non-empty path"
    if not (workdir.startswith("/") or workdir == "~" or workdir.startswith("~/")):
        return f"must be absolute or start with ~/, not {workdir!r}"
    parts = [p for p in workdir.split("/") if p not in ("", ".")]
    if ".." in parts:
        return f"must not contain '..', not {workdir!r}"
    if not parts or parts == ["~"]:
        return f"must be a directory of its own, not {workdir!r} itself"
    return None


def _forwarded(patterns: Any, environ: Mapping[str, str], fail) -> dict[str, EnvValue]:
    """`forward_env: [NCCL_*, WANDB_API_KEY]`: the controller's variables of those names or
    globs, for the host's tasks; secrets as `${VAR}` values are (masked wherever shown). A
    name that matches nothing is no error: a glob often does not."""
    if patterns is None:
        return {}
    if not isinstance(patterns, list) or not all(
            isinstance(p, str) and FORWARD_PATTERN.fullmatch(p) for p in patterns):
        raise fail(f"must be a list of variable names or globs such as [NCCL_*, WANDB_API_KEY], "
                   f"not {patterns!r}")
    for name in patterns:
        if name in RESERVED_ENV or (name.startswith(RESERVED_ENV_PREFIXES)
                                    and "*" not in name and "?" not in name):
            raise fail(f"{name} is set by tfdeploy itself and cannot be forwarded")
    return {name: EnvValue(environ[name], secret=True) for name in sorted(environ)
            if ENV_NAME.fullmatch(name) and any(fnmatch.fnmatchcase(name, p) for p in patterns)
            # a glob does not reach tfdeploy's own
            and name not in RESERVED_ENV and not name.startswith(RESERVED_ENV_PREFIXES)}


def _env_value(key: Any, value: Any, environ: Mapping[str, str], fail) -> EnvValue:
    if not isinstance(key, str) or not ENV_NAME.fullmatch(key):
        raise fail("not a valid environment variable name")
    if key in RESERVED_ENV or key.startswith(RESERVED_ENV_PREFIXES):
        raise fail("is set by tfdeploy itself and cannot be overridden")
    secret = False
    if isinstance(value, dict):
        extra = set(value) - {"value", "secret"}
        if extra or "value" not in value:
            raise fail("use {value: ..., secret: true}")
        secret = value.get("secret", False)
        if not isinstance(secret, bool):
            # A string such as "false" would otherwise count as true.
            raise fail(f"secret must be true or false, not {secret!r}")
        value = value["value"]
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise fail(f"must be a string or number, not {value!r}")
    value = str(value)
    match = CONTROLLER_VAR.match(value)
    if match:
        # Taken from the controller's environment: treated as a secret, since that is the
        # usual reason to keep a value out of the inventory file.
        var = match.group(1)
        if var not in environ:
            raise fail(f"${{{var}}} is not set in this shell's environment")
        return EnvValue(environ[var], secret=True)
    if "\0" in value:
        raise fail("must not contain a NUL byte")
    return EnvValue(value, secret=secret)


def _check_unique(file: str, where: _Located, hosts: list[Host]) -> None:
    seen: dict[str, int] = {}
    for i, host in enumerate(hosts):
        if host.name in seen:
            raise InventoryError(file, f"duplicate name (also host #{seen[host.name] + 1})",
                                 host=host.name, field="name", line=where.line("hosts", i, "name"))
        seen[host.name] = i
    targets: dict[tuple, str] = {}
    for i, host in enumerate(hosts):
        # Resolved values: two aliases of one machine are one machine; the same private
        # address behind two different gateways is two.
        ssh = host.ssh
        target = ("local",) if host.transport == "local" else (
            ssh.address.key, ssh.port, ssh.user, tuple(h.shown() for h in host.via))
        key = target + (host.workdir,)
        if key in targets:
            raise InventoryError(
                file, f"same machine and workdir as host {targets[key]!r}: their run directories "
                "would collide; give one its own workdir, or use one host with workers: 2",
                host=host.name, field="workdir", line=where.line("hosts", i))
        targets[key] = host.name
