"""A host with its own network stack: a network namespace joined to this machine by two veth
links, one for control (SSH) and one for the cluster mesh, so the mesh can be cut while the
controller still reaches the host.

    root namespace                     namespace <name>
    <ctl0> 10.213.N.1/30  ─── veth ─── <ctl1> 10.213.N.2/30   (sshd listens here)
    <mesh0> 10.213.M.1/30 ─── veth ─── <mesh1> 10.213.M.2/30  (cluster addresses)

Only addresses that nothing on this machine uses yet are taken (checked first), every address
is checked to exist before a test uses it, and close() deletes the links and the namespace.
Cutting the mesh downs the namespace's end only: the root end keeps its route (marked
linkdown), so packets for the namespace die on the dead link and never take the default route.
"""
from __future__ import annotations

import ipaddress
import os
import subprocess


class NetnsUnavailable(RuntimeError):
    pass


def ip(*args: str, netns: str | None = None) -> str:
    cmd = (["ip", "netns", "exec", netns, "ip"] if netns else ["ip"]) + list(args)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {done.stderr.strip()}")
    return done.stdout


def _unused_subnets(count: int, prefix: int = 30) -> list[int]:
    """Third octets N for 10.213.N.0/<prefix> networks (prefix 24 to 30) that no address or
    route here touches."""
    used = ip("-o", "addr", "show") + ip("route", "show", "table", "all")
    nets = [ipaddress.ip_network(w, strict=False) for w in used.split()
            if "/" in w and w[0].isdigit() and ":" not in w]
    free = []
    for n in range(1, 255):
        candidate = ipaddress.ip_network(f"10.213.{n}.0/{prefix}")
        if f"10.213.{n}." not in used and not any(candidate.overlaps(x) for x in nets):
            free.append(n)
        if len(free) == count:
            return free
    raise NetnsUnavailable(f"no unused 10.213.N.0/{prefix} networks")


class Namespaces:
    """Network namespaces and root-namespace links made for one test. Entering builds them
    (`_build`) and checks them (`check_exists`); close() deletes them, also after a build
    that failed halfway. Deleting the root end of a veth deletes its peer and the routes
    through it; deleting a namespace deletes the links inside it."""

    def __init__(self) -> None:
        self.namespaces: list[str] = []
        self.links: list[str] = []

    def add_netns(self, name: str) -> None:
        try:
            ip("netns", "add", name)
        except RuntimeError as exc:
            raise NetnsUnavailable(f"ip netns is not permitted here: {exc}") from None
        self.namespaces.append(name)

    def __enter__(self):
        try:
            self._build()
            self.check_exists()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _build(self) -> None:
        raise NotImplementedError

    def check_exists(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        for link in reversed(self.links):
            subprocess.run(["ip", "link", "del", link], capture_output=True, timeout=20)
        for ns in reversed(self.namespaces):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=20)
        self.links, self.namespaces = [], []


class NetnsHost(Namespaces):
    def __init__(self) -> None:
        super().__init__()
        tag = f"{os.getpid() % 100000}"
        self.name = f"tfd{tag}"
        self.ctl = (f"tfdc{tag}a", f"tfdc{tag}b")
        self.mesh = (f"tfdm{tag}a", f"tfdm{tag}b")

    def _build(self) -> None:
        self.add_netns(self.name)
        ctl, mesh = _unused_subnets(2)
        self.ctl_root, self.ctl_ns = f"10.213.{ctl}.1", f"10.213.{ctl}.2"
        self.mesh_root, self.mesh_ns = f"10.213.{mesh}.1", f"10.213.{mesh}.2"
        for (root, inner), (a_root, a_ns) in (
                (self.ctl, (self.ctl_root, self.ctl_ns)),
                (self.mesh, (self.mesh_root, self.mesh_ns))):
            ip("link", "add", root, "type", "veth", "peer", "name", inner, "netns", self.name)
            self.links.append(root)
            ip("addr", "add", f"{a_root}/30", "dev", root)
            ip("link", "set", root, "up")
            ip("addr", "add", f"{a_ns}/30", "dev", inner, netns=self.name)
            ip("link", "set", inner, "up", netns=self.name)
        ip("link", "set", "lo", "up", netns=self.name)

    def check_exists(self) -> None:
        """Every address this host uses is ours, on our links, before anything is sent."""
        assert self.ctl_root in ip("-o", "addr", "show", "dev", self.ctl[0])
        assert self.mesh_root in ip("-o", "addr", "show", "dev", self.mesh[0])
        assert self.ctl_ns in ip("-o", "addr", "show", "dev", self.ctl[1], netns=self.name)
        assert self.mesh_ns in ip("-o", "addr", "show", "dev", self.mesh[1], netns=self.name)
        self.check_routes()

    def check_routes(self) -> None:
        """Traffic to the namespace's addresses leaves by our links and nowhere else."""
        assert f"dev {self.ctl[0]}" in ip("route", "get", self.ctl_ns)
        assert f"dev {self.mesh[0]}" in ip("route", "get", self.mesh_ns)

    def cut_mesh(self) -> None:
        ip("link", "set", self.mesh[1], "down", netns=self.name)
        self.check_routes()

    def set_links(self, state: str) -> None:
        """Both links' namespace ends `down` (the host loses its network, SSH and cluster
        traffic alike, as a VM whose link goes down) or `up` again."""
        for link in (self.ctl[1], self.mesh[1]):
            ip("link", "set", link, state, netns=self.name)
        self.check_routes()

    def add_root_address(self) -> str:
        """One more address of this machine, unused until now, on the root end of the mesh
        link, for another lab host here: hosts reached at different SSH addresses need cluster
        addresses of their own. The namespace has no route to it; it stays reachable here
        while the link is down (a local address), and goes with the link."""
        n, = _unused_subnets(1)
        address = f"10.213.{n}.1"
        ip("addr", "add", f"{address}/32", "dev", self.mesh[0])
        assert address in ip("-o", "addr", "show", "dev", self.mesh[0])
        assert ip("route", "get", address).split()[0] == "local"
        return address
