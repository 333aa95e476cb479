"""SSH logins as the controller makes them: a host's own login, through its gateways if it
has any (`jump:` or a ProxyJump in the ssh config) or through its ProxyCommand, every hop's
host key checked as OpenSSH checks it (hostkeys.py) with the host's policy.

Hosts behind the same gateways share one login to them: the next hop is a direct-tcpip
channel (like `ssh -J`), and many channels go over one login. A login per host would be a
burst of parallel logins from one address, which sshd's MaxStartups (by default: past 10
unauthenticated connections, refuse new ones at random) turns into random failures on a
cluster of more than a few hosts. Only the SSH sessions go through a gateway; training
traffic goes between the hosts directly.
"""
from __future__ import annotations

import getpass
import os
import socket
import threading
from dataclasses import dataclass, field

import paramiko
from fabric import Config as FabricConfig
from fabric import Connection

from deploy.inventory.model import Host
from deploy.inventory.sshconfig import Hop
from deploy.transport import hostkeys, proxy
from deploy.transport.base import LoginFailed
from deploy.transport.certificates import Certificate, certified_key, refusal
from deploy.transport.keyfiles import key_from_file

# The key files ssh and paramiko try where none is configured.
DEFAULT_KEYS = ("~/.ssh/id_rsa", "~/.ssh/id_ecdsa", "~/.ssh/id_ed25519")


class LoginTransport(paramiko.Transport):
    """paramiko's transport, with two choices of its own for every hop:

    - AES-GCM offered before paramiko's usual first choice, AES-CTR with HMAC-SHA2: one AEAD
      call per packet instead of a cipher pass plus an HMAC built in Python (measured here:
      about 25 % less controller CPU per byte sent). Servers without GCM (it came with OpenSSH
      6.2) still get the other ciphers, in paramiko's order.
    - TCP_NODELAY on its socket: a request is several small SSH packets, and without it each
      one after the first waited for the host's acknowledgement of the one before, which the
      host's kernel delays by up to 40 ms (docs/benchmarks.md, "Small packets held back")."""
    _preferred_ciphers = (
        *(c for c in paramiko.Transport._preferred_ciphers if "-gcm@" in c),
        *(c for c in paramiko.Transport._preferred_ciphers if "-gcm@" not in c))

    def __init__(self, sock, *args, **kwargs):
        super().__init__(sock, *args, **kwargs)
        # A ProxyCommand's pipe or a gateway's channel is no TCP socket: its own hop is.
        if isinstance(self.sock, socket.socket) and self.sock.family in (
                socket.AF_INET, socket.AF_INET6):
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class HostLogin:
    """The host's own login; close() ends it and lets go of the gateways' logins."""

    def __init__(self, host: Host, connect_timeout: float, accept_new: bool):
        self.host, self.timeout = host, connect_timeout
        self.accept_new = accept_new
        self.connection: Connection | None = None
        self._gateways: tuple | None = None
        try:
            self._open()
        except BaseException:
            self.close()
            raise

    def _open(self) -> None:
        host, via, sock = self.host, self.host.via, None
        if via:
            key = (via, host.known_hosts, self.accept_new)
            try:
                gateway = GATEWAYS.acquire(key, lambda: self._gateway_logins(via))
            except LoginFailed as exc:
                raise LoginFailed(f"{host.label}: {exc}") from None
            self._gateways = key
            sock = tunnel(gateway, host.ssh, f"{host.label}: gateway {via[-1].described()}",
                          self.timeout)
        self.connection = self._login(host.ssh, sock, host.label, list(via))

    def _gateway_logins(self, via: tuple[Hop, ...]) -> list[Connection]:
        logins: list[Connection] = []
        try:
            sock = None
            for i, hop in enumerate(via):
                where = f"gateway {hop.described()}"
                logins.append(self._login(hop, sock, where, list(via[:i])))
                if i + 1 < len(via):
                    sock = tunnel(logins[-1], via[i + 1], where, self.timeout)
        except BaseException:
            close_all(logins)
            raise
        return logins

    def _login(self, hop: Hop, sock, where: str, before: list[Hop]) -> Connection:
        check = hostkeys.OpenSshCheck(where, hop, user_known_hosts(self.host, hop),
                                      self.accept_new, _scan_from(before))
        if sock is None and hop.proxy_command:
            sock = proxy.open_proxy(hop.proxy_command, where)
        # Key files that do not exist are skipped, as `ssh` skips them. As in ssh, ~/.ssh/id_*
        # are tried only where no key file is configured, and IdentitiesOnly leaves out the
        # agent (whose keys would be the configured files' anyway).
        key_files = [k for k in map(os.path.expanduser, hop.identity_files) if os.path.exists(k)]
        look_for_keys = not (hop.identity_files or hop.identities_only)
        # A CertificateFile is offered with the key it certifies, first, as ssh offers it.
        certified, certificates = certified_key(
            hop.certificate_files, key_files or [
                k for k in map(os.path.expanduser, DEFAULT_KEYS) if os.path.exists(k)])
        kwargs: dict = {"key_filename": key_files,
                        "look_for_keys": look_for_keys,
                        "allow_agent": not hop.identities_only and (
                            hop.identity_agent or "").lower() != "none",
                        "transport_factory": _preferring(check.key_types()),
                        # paramiko's own timeout: Fabric's connect_timeout is rounded down
                        # to whole seconds (0.5 would become no limit at all). 0: no limit.
                        "timeout": hop.connect_timeout or self.timeout or None}
        if sock is not None:
            kwargs["sock"] = sock
        if certified is not None:
            kwargs["pkey"] = certified
        # The ssh config was read when the inventory was loaded; Fabric reads none (an empty
        # SSHConfig) and makes no gateway of its own, whose host key it would add unasked.
        login = Connection(host=hop.hostname, user=hop.user, port=hop.port, gateway=False,
                           config=FabricConfig(ssh_config=paramiko.SSHConfig()),
                           connect_kwargs=kwargs)
        login.client.set_missing_host_key_policy(check)
        # paramiko would load the key files again at every login (keyfiles.py). Its loader is
        # private: a paramiko without it loads them itself, as before.
        paramikos = getattr(login.client, "_key_from_filepath", None)
        if paramikos is not None:
            login.client._key_from_filepath = key_from_file(paramikos)
        if kwargs["allow_agent"] and hop.identity_agent not in (None, "SSH_AUTH_SOCK"):
            # paramiko asks only $SSH_AUTH_SOCK's agent; an IdentityAgent socket is given
            # to the client as the agent it would otherwise make itself.
            login.client._agent = _agent_at(hop.identity_agent, where)
        try:
            _connect(login, hop, where, certificates)
        except LoginFailed as exc:
            login.close()
            said = sock.said() if isinstance(sock, proxy.DrainedProxyCommand) else ""
            raise LoginFailed(f"{exc} (the ProxyCommand said: {said})" if said else str(exc)
                              ) from None
        except BaseException:
            login.close()
            raise
        return login

    def close(self) -> None:
        if self.connection is not None:
            self.connection.close()
        if self._gateways is not None:
            GATEWAYS.release(self._gateways)
            self._gateways = None


@dataclass
class _Shared:
    lock: threading.Lock = field(default_factory=threading.Lock)
    users: int = 0
    logins: list[Connection] | None = None
    error: LoginFailed | None = None


class GatewayPool:
    """Gateway logins by (gateways, known_hosts, policy), shared while any host uses them.
    The first host opens them (the others wait), a failure is given to every host that was
    waiting for it instead of being tried again by each, and the last host closes them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._shared: dict[tuple, _Shared] = {}

    def acquire(self, key: tuple, open_logins) -> Connection:
        with self._lock:
            shared = self._shared.setdefault(key, _Shared())
            shared.users += 1
        try:
            with shared.lock:
                if shared.error is None and not (shared.logins and shared.logins[-1].is_connected):
                    close_all(shared.logins or [])     # dropped since: open them again
                    shared.logins = None
                    try:
                        shared.logins = open_logins()
                    except LoginFailed as exc:
                        shared.error = exc
                if shared.error is not None:
                    raise LoginFailed(str(shared.error))
                return shared.logins[-1]
        except BaseException:
            self.release(key)
            raise

    def release(self, key: tuple) -> None:
        with self._lock:
            shared = self._shared[key]
            shared.users -= 1
            if shared.users:
                return
            del self._shared[key]
        close_all(shared.logins or [])

    def open_count(self) -> int:
        return len(self._shared)


GATEWAYS = GatewayPool()


def close_all(logins: list[Connection]) -> None:
    for login in reversed(logins):
        login.close()


def tunnel(gateway: Connection, hop: Hop, where: str, timeout: float) -> paramiko.Channel:
    """A direct-tcpip channel from the gateway to the next hop's SSH port."""
    try:
        return gateway.transport.open_channel("direct-tcpip", (hop.hostname, hop.port), ("", 0),
                                              timeout=timeout)
    except (paramiko.SSHException, EOFError, OSError) as exc:
        # A refusal by the gateway is a ChannelException whose text says why.
        raise LoginFailed(f"{where}: cannot reach {hop.address.with_port(hop.port)} from "
                          f"there: {getattr(exc, 'text', None) or exc or 'no answer'}") from None


def user_known_hosts(host: Host, hop: Hop) -> tuple[str, ...]:
    """The hop's user known_hosts files; a record from before they were resolved has the
    host's one file."""
    files = hop.known_hosts if hop.known_hosts is not None else (host.known_hosts,)
    return tuple(os.path.expanduser(f) for f in files)


def _preferring(key_types: list[str]):
    """A transport that asks first for the host key types known_hosts has for the host."""
    def transport(*args, **kwargs) -> paramiko.Transport:
        made = LoginTransport(*args, **kwargs)
        options = made.get_security_options()
        first = [t for t in dict.fromkeys(key_types) if t in options.key_types]
        options.key_types = first + [t for t in options.key_types if t not in first]
        return made
    return transport


def _agent_at(path: str, where: str) -> paramiko.Agent:
    agent = paramiko.Agent.__new__(paramiko.Agent)
    paramiko.agent.AgentSSH.__init__(agent)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(os.path.expanduser(path))
    except OSError as exc:
        sock.close()
        raise LoginFailed(f"{where}: cannot reach the IdentityAgent {path}: "
                          f"{exc.strerror or exc}") from None
    agent._connect(sock)
    return agent


def _connect(login: Connection, hop: Hop, where: str,
             certificates: list[Certificate]) -> None:
    try:
        login.open()
    except hostkeys.HostKeyRefused as exc:
        raise LoginFailed(str(exc)) from None
    except paramiko.ProxyCommandFailure as exc:
        raise LoginFailed(f"{where}: the ProxyCommand failed: {exc}") from None
    except paramiko.AuthenticationException as exc:
        why = refusal(certificates, login.user)
        raise LoginFailed(f"{where}: SSH authentication failed as {login.user!r}"
                          f"{_keys_tried(hop)}: {why or exc}") from None
    except (socket.timeout, TimeoutError):
        raise LoginFailed(f"{where}: no answer on port {hop.port} "
                          f"(timed out) — host down or firewalled?") from None
    except paramiko.SSHException as exc:
        if "protocol banner" in str(exc) and "sock" not in login.connect_kwargs:
            raise LoginFailed(f"{where}: port {hop.port} {not_ssh(hop)}") from None
        if "No authentication methods" not in str(exc):
            through = f" through the ProxyCommand {hop.proxy_command!r}" if (
                hop.proxy_command) else ""
            raise LoginFailed(f"{where}: cannot connect to port {hop.port}{through}: "
                              f"{exc}") from None
        # No key file, no agent key, no ~/.ssh/id_*: nothing was even offered.
        raise LoginFailed(f"{where}: SSH authentication failed as {login.user!r}: no key "
                          f"to offer{_keys_tried(hop)}") from None
    except OSError as exc:
        raise LoginFailed(f"{where}: cannot connect to port {hop.port}: "
                          f"{getattr(exc, 'strerror', None) or exc}") from None


def not_ssh(hop: Hop, timeout: float = 3.0) -> str:
    """What a port that answered but spoke no SSH says, asked once more: its first line (an
    SSH server sends its banner first; a web server answers the banner it is sent)."""
    try:
        with socket.create_connection((hop.hostname, hop.port), timeout=timeout) as sock:
            sock.sendall(b"SSH-2.0-tfdeploy\r\n")
            said = b""
            while b"\n" not in said and len(said) < 256:
                piece = sock.recv(256)
                if not piece:
                    break
                said += piece
    except OSError as exc:
        return f"speaks no SSH (asked again: {exc.strerror or exc})"
    first = said.split(b"\n", 1)[0].strip().decode("ascii", "replace")[:80]
    return f"speaks no SSH: got {first!r}" if first else "speaks no SSH: it closed the " \
        "connection without a word"


def _scan_from(hops: list[Hop]) -> str:
    """How to run ssh-keyscan where a hop is reachable: on the gateway before it, if any."""
    if not hops:
        return ""
    jump = f"-J {','.join(h.shown() for h in hops[:-1])} " if len(hops) > 1 else ""
    last = hops[-1]     # the user said, as this is a command to run by hand
    return f"ssh {jump}ssh://{last.user or getpass.getuser()}@{last.hostname}:{last.port} "


def _keys_tried(hop: Hop) -> str:
    """Which identity files and certificates were offered, and which were missing (then the
    agent's keys)."""
    certificates = ""
    if hop.certificate_files:
        missing = [c for c in hop.certificate_files if not os.path.exists(os.path.expanduser(c))]
        certificates = (f"; certificates {', '.join(hop.certificate_files)}"
                        + (f" (missing: {', '.join(missing)})" if missing else ""))
    if not hop.identity_files:
        return f" (no identity_file; tried ssh-agent and ~/.ssh/id_*{certificates})"
    missing = [k for k in hop.identity_files if not os.path.exists(os.path.expanduser(k))]
    return (f" (key files {', '.join(hop.identity_files)}"
            + (f"; missing: {', '.join(missing)}" if missing else "") + certificates
            + "; then ssh-agent)")
