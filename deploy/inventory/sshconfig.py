"""SSH as users have it: the login of every host resolved once, when the inventory is loaded,
into Hop values (the host itself, and each gateway on the way).

OpenSSH resolves it (openssh.py runs `ssh -G`); this module holds the Hop value, the gateway
spec syntax, and the parser used where `ssh` is not installed: paramiko's SSHConfig with
Include followed (HostName, User, Port, IdentityFile, ProxyJump, UserKnownHostsFile).

Everything downstream gets real values: the cluster address of an alias is its HostName (an
alias means nothing on the other hosts), host keys are looked up as OpenSSH does, and a
gateway chain is a list of resolved hops. The transport reads no ssh config of its own, so
what was checked is what is used, and a run record reconnects the same way even if the config
file changed since.
"""
from __future__ import annotations

import glob
import io
import os
import re
from dataclasses import dataclass
from typing import Callable

import paramiko

from deploy.errors import BadInput
from deploy.inventory.address import Address
from deploy.inventory.names import name_problem

DEFAULT_FILE = "~/.ssh/config"          # the inventory's default: USER_FILE, then SYSTEM_FILE
USER_FILE = "~/.ssh/config"
SYSTEM_FILE = "/etc/ssh/ssh_config"
NO_FILE = "none"                         # like `ssh -F none`: no config at all
DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts ~/.ssh/known_hosts2"   # OpenSSH's UserKnownHostsFile
# An ssh config is read up to this much: past it (or from /dev/zero) it is not one.
MAX_CONFIG_CHARS = 1 << 20
MAX_INCLUDE_DEPTH = 16
MAX_HOPS = 8
# [user@]host[:port]; host may be [IPv6]. An ssh:// prefix is allowed, as OpenSSH allows it.
# ssh's own reading of a gateway (hpdelim): brackets may hold any host, an IPv4 address or a
# name as well as an IPv6 one (`ops@[10.20.0.1]:2200`).
HOP = re.compile(r"^(?:ssh://)?(?:(?P<user>[^@\s:/]+)@)?(?P<host>\[[^\]\[@\s/]+\]|[^@\s:/\[\]]+)"
                 r"(?::(?P<port>\d+))?$")
INCLUDE = re.compile(r"^\s*include(?:\s*=\s*|\s+)(.*)$", re.IGNORECASE)


class SshConfigError(BadInput):
    """A problem in an ssh config file or a gateway spec; `field` is the inventory field."""

    def __init__(self, message: str, field: str):
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class Hop:
    """One SSH login as the controller makes it: the host itself, or a gateway on the way."""
    name: str                       # as written: an ssh-config alias or [user@]host[:port]
    hostname: str                   # what it resolves to
    port: int = 22
    user: str | None = None         # None: the local user
    identity_files: tuple[str, ...] = ()
    # Below: as `ssh -G` resolves them. A record written before they existed has the defaults.
    identities_only: bool = False
    identity_agent: str | None = None   # a socket, or "none"; None: $SSH_AUTH_SOCK
    certificate_files: tuple[str, ...] = ()
    known_hosts: tuple[str, ...] | None = None  # user files, in order; None: the host's file
    global_known_hosts: tuple[str, ...] = ()
    host_key_alias: str | None = None
    proxy_command: str | None = None    # tokens expanded; run with the user's shell
    connect_timeout: float | None = None

    @property
    def address(self) -> Address:
        return Address.parse(self.hostname)

    def shown(self) -> str:
        """`user@host:port`, as `ssh -J` and `ssh://` take it: `user@[::1]:2222` for IPv6."""
        return f"{self.user + '@' if self.user else ''}{self.address.with_port(self.port)}"

    def described(self) -> str:
        """The name as written, and the login it resolves to where that says more."""
        shown = self.shown()
        return self.name if shown in (self.name, f"{self.name}:22") else f"{self.name} ({shown})"


@dataclass(frozen=True)
class Route:
    """How a host is reached: its own login, and the gateways before it, first hop first."""
    target: Hop
    via: tuple[Hop, ...] = ()
    accept_new: bool = False     # the ssh config says StrictHostKeyChecking accept-new (or no)


def parse_hops(spec: str, field: str = "jump") -> list[tuple[str | None, str, int | None]]:
    """`gw`, `admin@gw:2222` or a chain `gw1,gw2` (ProxyJump syntax) as (user, host, port);
    names that ssh must not see (names.py) are refused here, before any lookup."""
    hops = []
    for part in spec.split(","):
        match = HOP.fullmatch(part.strip())
        port = match and match.group("port")
        given = match and match.group("host").removeprefix("[").removesuffix("]")
        try:
            address = match and Address.parse(given)
        except ValueError:
            address = None
        if not address or (port is not None and not 1 <= int(port) <= 65535):
            raise SshConfigError(f"{part.strip()!r} is not a gateway; use [user@]host[:port] "
                                 f"(an ssh-config alias will do; an IPv6 address in brackets), "
                                 f"several separated by commas", field)
        host = address.text
        for what, name in (("user", match.group("user")),
                           ("host", None if address.ip else given)):
            problem = name and name_problem(name)
            if problem:
                raise SshConfigError(f"gateway {what} {problem}", field)
        hops.append((match.group("user"), host, int(port) if port else None))
    return hops


class SshConfigs:
    """The ssh config files of one inventory load, each read once."""

    def __init__(self) -> None:
        self._read: dict[str, paramiko.SSHConfig] = {}

    def get(self, path: str) -> paramiko.SSHConfig:
        if path not in self._read:
            self._read[path] = _load(path)
        return self._read[path]


def _load(path: str) -> paramiko.SSHConfig:
    config = paramiko.SSHConfig()
    if path == NO_FILE:
        return config
    if path == DEFAULT_FILE:
        # A missing default file is no config; the system file follows the user's, as in `ssh`.
        files = [f for f in (os.path.expanduser(USER_FILE), SYSTEM_FILE) if os.path.isfile(f)]
    else:
        files = [os.path.expanduser(path)]
    for file in files:
        base = "/etc/ssh" if file == SYSTEM_FILE else os.path.expanduser("~/.ssh")
        text = _text(file, base, path, 0)
        try:
            config.parse(io.StringIO(text))
        except (paramiko.ssh_exception.ConfigParseError, ValueError) as exc:
            raise SshConfigError(f"{file}: {exc}", "ssh_config") from None
    return config


def _text(file: str, base: str, named: str, depth: int) -> str:
    """The file's lines with every `Include` replaced by the files it names, in place (paramiko
    does not follow Include; OpenSSH resolves relative names against ~/.ssh or /etc/ssh)."""
    if depth > MAX_INCLUDE_DEPTH:
        raise SshConfigError(f"{file}: Include nested more than {MAX_INCLUDE_DEPTH} deep "
                             f"(a loop?)", "ssh_config")
    try:
        with open(file, encoding="utf-8") as f:
            text = f.read(MAX_CONFIG_CHARS + 1)
        if len(text) > MAX_CONFIG_CHARS:
            raise ValueError(f"larger than {MAX_CONFIG_CHARS >> 20} MiB: not an ssh config")
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        what = getattr(exc, "strerror", None) or exc
        raise SshConfigError(f"cannot read ssh config {file}: {what}"
                             + (f" (from {named})" if named not in (file, DEFAULT_FILE) else ""),
                             "ssh_config") from None
    lines = []
    for line in text.splitlines():
        match = INCLUDE.match(line)
        if not match:
            lines.append(line)
            continue
        for pattern in match.group(1).split():
            pattern = os.path.expanduser(pattern)
            for found in sorted(glob.glob(os.path.join(base, pattern))):
                if os.path.isfile(found):
                    lines.append(_text(found, base, named, depth + 1))
    return "\n".join(lines) + "\n"


def resolve(config: paramiko.SSHConfig, name: str, host: str, port: int | None = None,
            user: str | None = None, keys_first: tuple[str, ...] = (),
            keys_then: tuple[str, ...] = (), field: str = "address") -> Hop:
    """`host` as `ssh` would reach it: given values win over the config's, then defaults."""
    found = config.lookup(host)
    if "proxycommand" in found:
        raise SshConfigError(f"ssh config gives {host!r} a ProxyCommand, which tfdeploy does not "
                             f"run; use ProxyJump (or the inventory's jump:) instead", field)
    if port is None and "port" in found:
        try:
            port = int(found["port"])
        except ValueError:
            port = 0
        if not 1 <= port <= 65535:
            raise SshConfigError(f"ssh config gives {host!r} Port {found['port']!r}, which is "
                                 f"not a port number", "ssh_config")
    try:
        hostname = Address.parse(found.get("hostname", host)).text
    except ValueError as exc:
        raise SshConfigError(f"ssh config gives {host!r} an unusable HostName: {exc}",
                             "ssh_config") from None
    return Hop(name=name, hostname=hostname, port=port or 22,
               user=user or found.get("user"),
               identity_files=tuple(dict.fromkeys(
                   (*keys_first, *found.get("identityfile", ()), *keys_then))),
               known_hosts=tuple(os.path.expanduser(f) for f in found.get(
                   "userknownhostsfile", DEFAULT_KNOWN_HOSTS).split() if f != NO_FILE))


def proxy_jump(config: paramiko.SSHConfig, host: str) -> str | None:
    value = config.lookup(host).get("proxyjump")
    return None if value is None or value.lower() == NO_FILE else value


# (name, host, port, user, keys tried after its own, field) -> the hop and its own ProxyJump
Lookup = Callable[[str, str, "int | None", "str | None", tuple, str], "tuple[Hop, str | None]"]


def gateways(lookup: Lookup, spec: str, keys: tuple[str, ...], field: str,
             depth: int = 0) -> tuple[Hop, ...]:
    """The hops of a ProxyJump-style `spec`, first hop first. As with `ssh -J`, the first hop
    is reached by its own ProxyJump from the config, if it has one. `keys` (the host's own
    identity file) are tried on each gateway after the gateway's own IdentityFile."""
    hops: list[Hop] = []
    for i, (user, host, port) in enumerate(parse_hops(spec, field)):
        where = Address.parse(host).with_port(port) if port else host
        name = f"{user + '@' if user else ''}{where}"
        hop, own = lookup(name, host, port, user, keys, field)
        own = own if i == 0 else None
        # `Host *` with a ProxyJump also matches the gateway itself; OpenSSH would loop there.
        if own and parse_hops(own, "ssh_config")[0][1] not in (host, hop.hostname):
            if depth >= MAX_HOPS:
                raise SshConfigError(f"ProxyJump chain of {host!r} is longer than {MAX_HOPS} "
                                     f"hops (a loop?)", "ssh_config")
            hops += gateways(lookup, own, keys, "ssh_config", depth + 1)
        hops.append(hop)
    return tuple(hops)


def host_route(configs: SshConfigs, ssh_config: str, address: str, port: int | None,
               user: str | None, identity_file: str | None, jump: str | None) -> Route:
    """The host's resolved login and its gateways (the inventory's `jump` wins over a
    ProxyJump in the config; `jump: none` turns that off)."""
    config = configs.get(ssh_config)
    keys = (identity_file,) if identity_file else ()
    target = resolve(config, address, address, port, user, keys_first=keys)
    if jump is not None:
        spec, field = (None if jump.lower() == NO_FILE else jump), "jump"
    else:
        spec, field = proxy_jump(config, address), "ssh_config"

    def lookup(name, host, port, user, keys_then, field):
        return (resolve(config, name, host, port, user, keys_then=keys_then, field=field),
                proxy_jump(config, host))
    return Route(target, gateways(lookup, spec, keys, field) if spec else ())
