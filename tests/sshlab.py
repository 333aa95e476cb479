"""A multi-host SSH lab on one machine: real OpenSSH servers on loopback addresses.

Each lab host is its own ``sshd`` listening on 127.0.0.N (N = 2, 3, ...; past 254 on 127.0.1.N)
and a free port, with its own host key and its own workdir. ``start(n, ipv6=True)`` puts them on ``::1`` instead, told
apart by their ports alone (IPv6 has one loopback address). Clients log in as the current user with one lab key pair
and verify hosts strictly against the lab's ``known_hosts``. All hosts are really this machine,
so every host gets a distinct workdir; ``sharing_workdir`` gives hosts one workdir instead,
as a home directory shared over NFS does.

    with SshLab(tmp_path) as lab:
        h1, h2 = lab.start(2)
        lab.write_inventory(tmp_path / "hosts.yaml", [h1, h2])

Only 127.0.0.0/8 and ::1 are used, and each address is checked (by binding to it) before use;
``ipv6_loopback_missing()`` says why a machine has no ``::1``, if it has none. ``stop()``
(called on exit) ends every sshd the lab started, by the pid of its own Popen.
"""
from __future__ import annotations

import dataclasses
import getpass
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from ipaddress import ip_address, ip_network
from pathlib import Path
from typing import Any, Iterable, Mapping

import yaml

SSHD = Path("/usr/sbin/sshd")
SSH_KEYGEN = "ssh-keygen"
PRIVSEP_DIR = Path("/run/sshd")
LOOPBACK = ip_network("127.0.0.0/8")
IPV6_LOOPBACK = "::1"
FIRST_HOST_OCTET = 2          # h1 is 127.0.0.2: 127.0.0.1 stays the controller's "localhost"
READY_TIMEOUT = 10.0
STOP_GRACE = 5.0
PORT_ATTEMPTS = 3             # a free port can be taken between probing it and sshd binding it


class LabError(RuntimeError):
    """The lab could not be set up (missing tools, unusable address, sshd did not come up)."""


@dataclass(frozen=True)
class LabHost:
    """One lab SSH server, as a client sees it."""

    name: str                 # h1, h2, ...
    address: str              # 127.0.0.N, or ::1
    port: int
    workdir: Path             # distinct per host unless shared; not created (the tool owns it)
    identity_file: Path       # the lab's client private key
    known_hosts: Path         # the lab's known_hosts (holds this host unless record_host_keys=False)
    host_key: Path            # this server's public host key file (ssh-ed25519 ...)
    log: Path                 # this sshd's log (sshd -e)

    def known_hosts_line(self) -> str:
        """This server's known_hosts entry: ``[127.0.0.N]:PORT ssh-ed25519 AAAA...`` (or
        ``[::1]:PORT``)."""
        keytype, blob = self.host_key.read_text().split()[:2]
        return f"[{self.address}]:{self.port} {keytype} {blob}\n"


@dataclass
class _Server:
    host: LabHost
    config: Path
    proc: subprocess.Popen


class SshLab:
    """Starts and stops lab sshd servers under ``base_dir``. Use as a context manager."""

    def __init__(self, base_dir: Path, *, first_octet: int = FIRST_HOST_OCTET,
                 network: int = 0, sshd: Path = SSHD, key_type: str = "ed25519") -> None:
        self.base_dir = Path(base_dir).resolve()
        self.sshd = Path(sshd)
        self.user = getpass.getuser()
        # Hosts go on 127.0.<network>.<first_octet>, then upwards, past .254 into the next
        # network: more than 250 hosts (benchmarks/bench_timeline.py) fit.
        self._next_address = network * 256 + first_octet
        self._count = 0
        self._servers: list[_Server] = []
        # The client's key: "rsa" for the 3072-bit RSA key many users still log in with.
        self.key_type = key_type
        self.identity_file = self.base_dir / f"id_{key_type}"
        self.known_hosts = self.base_dir / "known_hosts"
        self.authorized_keys = self.base_dir / "authorized_keys"
        self._prepared = False

    # -- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> SshLab:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def hosts(self) -> list[LabHost]:
        """The hosts whose servers are running (started and not yet stopped), in start order."""
        return [s.host for s in self._servers]

    @property
    def pids(self) -> list[int]:
        """Pids of the sshd listeners this lab started and has not stopped yet."""
        return [s.proc.pid for s in self._servers]

    def start(self, n: int, *, record_host_keys: bool = True, ipv6: bool = False,
              setenv: Mapping[str, str] | None = None,
              sshd_options: Mapping[str, str] | None = None) -> list[LabHost]:
        """Start n more sshd servers and return their hosts once each shows an SSH banner.

        With record_host_keys=False the servers' keys are left out of known_hosts (an unknown
        host to a strict client); ``host.known_hosts_line()`` gives the entry to add later.
        With ipv6=True they all listen on ::1, each on its own port. ``setenv`` is set in every
        session of these servers (sshd's SetEnv, which overrides its default PATH): e.g. a PATH
        under which ``python3`` is another Python build than on the other hosts.
        ``sshd_options`` replace the lab's sshd_config keywords or add others, e.g. a host that
        trusts a user CA and no authorized key (TrustedUserCAKeys, AuthorizedKeysFile none).
        """
        if n < 1:
            raise ValueError(f"n must be at least 1, not {n}")
        self._prepare()
        # If one fails, those already up stay tracked in self._servers, so stop() ends them.
        return [self._start_one(record_host_keys, ipv6, setenv or {}, sshd_options or {})
                for _ in range(n)]

    def stop(self) -> None:
        """End every sshd this lab started: SIGTERM, then SIGKILL after STOP_GRACE seconds.

        Only the listeners are signalled (by their Popen pid). sshd's per-connection children
        run in sessions of their own and end when their clients disconnect.
        """
        servers, self._servers = self._servers, []
        for server in servers:
            _signal(server.proc, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE
        for server in servers:
            try:
                server.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal(server.proc, signal.SIGKILL)
                server.proc.wait()

    def start_in_netns(self, netns: str, address: str, port: int = 2222,
                       reachable: bool = True) -> LabHost:
        """One more sshd, run inside network namespace `netns` (`ip netns exec`) on `address`,
        an address the caller created in that namespace. Its key goes into known_hosts.
        With reachable=False (a host this machine cannot reach, e.g. behind a gateway) it is
        ready once its log says it listens, instead of once it shows a banner here."""
        self._prepare()
        host, host_key = self._new_host(address, port)
        # Tracked before it is up, so stop() ends it even if it never comes up.
        server = self._spawn(host, host_key, prefix=("ip", "netns", "exec", netns))
        (_wait_ready if reachable else _wait_listening)(server)
        with open(self.known_hosts, "a") as f:
            f.write(host.known_hosts_line())
        return host

    def wait_reachable(self, host: LabHost, timeout: float = READY_TIMEOUT) -> None:
        """Until `host`'s sshd shows its banner here again (its link set up again, a user
        waiting for the host to come back before `inv down`); a LabError saying why not, with
        its log's end, if its sshd exited or it stays out of reach."""
        _wait_ready(next(s for s in self._servers if s.host.name == host.name), timeout)

    def sharing_workdir(self, hosts: Iterable[LabHost], name: str = "shared") -> list[LabHost]:
        """The same hosts with one workdir between them, as an NFS home gives every machine:
        <base>/<name>/work (not created: the tool under test owns it)."""
        workdir = self.base_dir / name / "work"
        return [dataclasses.replace(host, workdir=workdir) for host in hosts]

    # -- inventories -------------------------------------------------------------------------

    def inventory_yaml(self, hosts: Iterable[LabHost], python: str = sys.executable,
                       **host_overrides: Any) -> str:
        """An inventory for ``hosts``: lab user, key, known_hosts and python as defaults.

        ``host_overrides`` are fields added to every host entry (e.g. ``workers=2``); a value of
        None drops that field. ``per_host={"h1": {...}}`` adds fields to one host's entry;
        ``extra=[{...}]`` appends entries as they are (e.g. ``unreachable_entry()``).
        """
        per_host: Mapping[str, Mapping[str, Any]] = host_overrides.pop("per_host", None) or {}
        extra: list[Mapping[str, Any]] = host_overrides.pop("extra", None) or []
        entries = []
        for host in hosts:
            entry: dict[str, Any] = {"name": host.name, "address": host.address,
                                     "port": host.port, "workdir": str(host.workdir)}
            for key, value in {**host_overrides, **per_host.get(host.name, {})}.items():
                if value is None:
                    entry.pop(key, None)
                else:
                    entry[key] = _plain(value)
            entries.append(entry)
        entries += [_plain(e) for e in extra]
        if not entries:
            raise ValueError("an inventory needs at least one host")
        unknown = set(per_host) - {e["name"] for e in entries}
        if unknown:
            raise ValueError(f"per_host names hosts not in the inventory: {sorted(unknown)}")
        data = {
            "defaults": {
                "user": self.user,
                "identity_file": str(self.identity_file),
                "known_hosts": str(self.known_hosts),
                "python": str(python),
            },
            "hosts": entries,
        }
        return yaml.safe_dump(data, sort_keys=False, default_flow_style=False)

    def write_inventory(self, path: Path, hosts: Iterable[LabHost], **kw: Any) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.inventory_yaml(hosts, **kw))
        return path

    # -- internals ---------------------------------------------------------------------------

    def _prepare(self) -> None:
        if self._prepared:
            return
        if not self.sshd.is_file() or not os.access(self.sshd, os.X_OK):
            raise LabError(f"{self.sshd} is missing: install openssh-server")
        self.base_dir.mkdir(parents=True, exist_ok=True)
        # sshd refuses to start without its privilege separation directory.
        PRIVSEP_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)
        if not self.identity_file.exists():
            _keygen(self.identity_file, comment="tfdeploy-lab-client", key_type=self.key_type)
        self.authorized_keys.write_text(Path(f"{self.identity_file}.pub").read_text())
        self.authorized_keys.chmod(0o600)
        self.known_hosts.touch(mode=0o600)
        self._prepared = True

    def _start_one(self, record_host_key: bool, ipv6: bool, setenv: Mapping[str, str],
                   sshd_options: Mapping[str, str] | None = None) -> LabHost:
        address = IPV6_LOOPBACK if ipv6 else self._next_v4()
        host, host_key = self._new_host(address, 0)
        for attempt in range(1, PORT_ATTEMPTS + 1):
            host = dataclasses.replace(host, port=free_port(address))
            server = self._spawn(host, host_key, setenv=setenv, sshd_options=sshd_options)
            try:
                _wait_ready(server)
            except LabError:
                self._servers.remove(server)
                _signal(server.proc, signal.SIGKILL)
                server.proc.wait()
                if attempt < PORT_ATTEMPTS and "Address already in use" in _tail(host.log):
                    continue
                raise
            if record_host_key:
                with open(self.known_hosts, "a") as f:
                    f.write(host.known_hosts_line())
            return host
        raise AssertionError("unreachable")

    def _next_v4(self) -> str:
        if self._next_address % 256 == 255:
            self._next_address += 2          # .255 and .0 of the next network are no hosts
        network, octet = divmod(self._next_address, 256)
        if not (1 <= octet <= 254 and network <= 255):
            raise LabError(f"out of lab addresses: 127.0.{network}.{octet} is not a usable "
                           "host address")
        self._next_address += 1
        return f"127.0.{network}.{octet}"

    def _new_host(self, address: str, port: int) -> tuple[LabHost, Path]:
        """The next host's name, directory and host key (made once)."""
        self._count += 1
        name = f"h{self._count}"
        host_dir = self.base_dir / "hosts" / name
        host_dir.mkdir(parents=True, exist_ok=True)
        host_key = host_dir / "ssh_host_ed25519_key"
        if not host_key.exists():
            _keygen(host_key, comment=f"tfdeploy-lab-{name}")
        host = LabHost(name=name, address=address, port=port, workdir=host_dir / "work",
                       identity_file=self.identity_file, known_hosts=self.known_hosts,
                       host_key=Path(f"{host_key}.pub"), log=host_dir / "sshd.log")
        return host, host_key

    def _spawn(self, host: LabHost, host_key: Path, prefix: tuple[str, ...] = (),
               setenv: Mapping[str, str] | None = None,
               sshd_options: Mapping[str, str] | None = None) -> _Server:
        """Start this host's sshd (behind `prefix`, e.g. `ip netns exec NS`) and track it."""
        config = host.log.with_name("sshd_config")
        config.write_text(self._config(host, host_key, host.log.with_name("sshd.pid"),
                                       setenv or {}, sshd_options or {}))
        with open(host.log, "ab") as log:
            proc = subprocess.Popen([*prefix, str(self.sshd), "-D", "-e", "-f", str(config)],
                                    stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        server = _Server(host, config, proc)
        self._servers.append(server)
        return server

    def _config(self, host: LabHost, host_key: Path, pid_file: Path,
                setenv: Mapping[str, str], sshd_options: Mapping[str, str] | None = None) -> str:
        for name, value in setenv.items():
            if not name.isidentifier() or any(c.isspace() or c == '"' for c in value):
                raise ValueError(f"SetEnv {name}={value!r}: a name, and a value without "
                                 "spaces or quotes")
        lines = self._config_lines(host, host_key, pid_file, setenv)
        # sshd takes a keyword's first line: a replaced keyword's own line goes.
        options = {k.lower(): f"{k} {v}" for k, v in (sshd_options or {}).items()}
        kept = [line for line in lines if line.split(" ")[0].lower() not in options]
        return "\n".join([*kept[:-1], *options.values(), ""])

    def _config_lines(self, host: LabHost, host_key: Path, pid_file: Path,
                      setenv: Mapping[str, str]) -> list[str]:
        return [
            f"# tfdeploy test lab: {host.name}",
            f"ListenAddress {host.address}",
            f"Port {host.port}",
            f"HostKey {host_key}",
            f"PidFile {pid_file}",
            f"AuthorizedKeysFile {self.authorized_keys}",
            "StrictModes no",
            "UsePAM no",
            "PermitRootLogin prohibit-password",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "Subsystem sftp internal-sftp",
            "LogLevel VERBOSE",
            # Tests may open many connections and sessions at once.
            "MaxStartups 100:30:200",
            "MaxSessions 100",
            # One line: sshd takes the first SetEnv and ignores the rest.
            *(["SetEnv " + " ".join(f"{n}={v}" for n, v in setenv.items())] if setenv else []),
            "",
        ]


def free_port(address: str) -> int:
    """A port that is free on ``address`` right now; fails clearly if the address is unusable."""
    if address != IPV6_LOOPBACK and ip_address(address) not in LOOPBACK:
        raise LabError(f"refusing to use {address}: the lab only uses 127.0.0.0/8 and ::1")
    family = socket.AF_INET6 if address == IPV6_LOOPBACK else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        try:
            s.bind((address, 0))
        except OSError as exc:
            raise LabError(f"cannot bind to {address}: {exc} (is it an address of lo?)")
        return s.getsockname()[1]


def ipv6_loopback_missing() -> str | None:
    """Why this machine cannot listen on ::1 (no IPv6, or none on lo), or None if it can."""
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind((IPV6_LOOPBACK, 0))
    except OSError as exc:
        return f"this machine has no IPv6 loopback address ::1 ({exc})"
    return None


def unreachable_entry(name: str = "gone", address: str = "127.0.0.9") -> dict[str, Any]:
    """An inventory entry for a loopback port where nothing listens."""
    return {"name": name, "address": address, "port": free_port(address)}


def _wait_ready(server: _Server, timeout: float = READY_TIMEOUT) -> None:
    host = server.host
    deadline = time.monotonic() + timeout
    last = "no attempt"
    while time.monotonic() < deadline:
        code = server.proc.poll()
        if code is not None:
            raise LabError(f"sshd for {host.name} ({host.address}:{host.port}) exited with "
                           f"status {code}; log {host.log}:\n{_tail(host.log)}")
        try:
            with socket.create_connection((host.address, host.port), timeout=1.0) as s:
                s.settimeout(2.0)
                banner = s.recv(256)
            if banner.startswith(b"SSH-"):
                return
            last = f"unexpected banner {banner!r}"
        except OSError as exc:
            last = str(exc)
        time.sleep(0.05)
    raise LabError(f"sshd for {host.name} did not show an SSH banner on {host.address}:"
                   f"{host.port} within {timeout:.0f}s (last: {last}); log {host.log}:\n"
                   f"{_tail(host.log)}")


def _wait_listening(server: _Server, timeout: float = READY_TIMEOUT) -> None:
    """Until sshd logs that it listens (it binds before it says so)."""
    host = server.host
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        code = server.proc.poll()
        if code is not None:
            raise LabError(f"sshd for {host.name} ({host.address}:{host.port}) exited with "
                           f"status {code}; log {host.log}:\n{_tail(host.log)}")
        if f"Server listening on {host.address} port {host.port}" in _tail(host.log, 200):
            return
        time.sleep(0.05)
    raise LabError(f"sshd for {host.name} did not listen on {host.address}:{host.port} within "
                   f"{timeout:.0f}s; log {host.log}:\n{_tail(host.log)}")


def _keygen(path: Path, comment: str, key_type: str = "ed25519") -> None:
    try:
        subprocess.run([SSH_KEYGEN, "-q", "-t", key_type, "-N", "", "-C", comment,
                        "-f", str(path)], check=True, capture_output=True, text=True,
                       stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise LabError(f"{SSH_KEYGEN} is missing: install openssh-client") from None
    except subprocess.CalledProcessError as exc:
        raise LabError(f"ssh-keygen failed for {path}: {exc.stderr.strip()}") from None


def _signal(proc: subprocess.Popen, sig: int) -> None:
    if proc.poll() is None:
        try:
            os.kill(proc.pid, sig)
        except ProcessLookupError:
            pass


def _tail(path: Path, lines: int = 20) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:]) or "(empty log)"


def _plain(value: Any) -> Any:
    """Make values YAML-safe: Paths become strings, containers recurse."""
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
