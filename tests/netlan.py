"""Hosts on a LAN that only a gateway reaches, built from network namespaces:

    root namespace                  namespace <gw>                      namespaces <lan i>
    <up0> 10.213.U.1/30 ── veth ── <up1> 10.213.U.2/30  (sshd)
                                    bridge <br> 10.213.L.1/24 ── veth ── <lan_i> 10.213.L.(i+2)/24 (sshd)

The gateway does not forward (net.ipv4.ip_forward=0 in its namespace), and this machine's
route to the LAN points at the gateway, so a packet for a LAN host goes to the gateway and
dies there: it never takes this machine's default route. The LAN hosts have no route out at
all. They reach each other across the bridge directly, as hosts on one switch do.

Only 10.213.N.0 networks that nothing here uses are taken (netns._unused_subnets), every
address and route is checked before use, and close() deletes the links and namespaces.
"""
from __future__ import annotations

import os
import subprocess

from netns import Namespaces, _unused_subnets, ip


class GatewayLan(Namespaces):
    def __init__(self, hosts: int = 2) -> None:
        super().__init__()
        tag = f"{os.getpid() % 100000}"
        self.gw = f"tfg{tag}"
        self.lan_ns = [f"tfl{tag}{i}" for i in range(hosts)]
        self.up = (f"tfgu{tag}a", f"tfgu{tag}b")
        self.bridge = f"tfgb{tag}"
        self.lan_links = [(f"tfgl{tag}{i}a", f"tfgl{tag}{i}b") for i in range(hosts)]

    def _build(self) -> None:
        (up,) = _unused_subnets(1, 30)
        (lan,) = [n for n in _unused_subnets(2, 24) if n != up][:1]
        self.up_root, self.gw_address = f"10.213.{up}.1", f"10.213.{up}.2"
        self.lan_net = f"10.213.{lan}.0/24"
        self.gw_lan = f"10.213.{lan}.1"
        self.host_addresses = [f"10.213.{lan}.{i + 2}" for i in range(len(self.lan_ns))]
        gw = self.gw
        self.add_netns(gw)
        ip("link", "set", "lo", "up", netns=gw)
        subprocess.run(["ip", "netns", "exec", gw, "sysctl", "-qw", "net.ipv4.ip_forward=0"],
                       check=True, capture_output=True, timeout=20)
        ip("link", "add", self.up[0], "type", "veth", "peer", "name", self.up[1], "netns", gw)
        self.links.append(self.up[0])
        ip("addr", "add", f"{self.up_root}/30", "dev", self.up[0])
        ip("link", "set", self.up[0], "up")
        ip("addr", "add", f"{self.gw_address}/30", "dev", self.up[1], netns=gw)
        ip("link", "set", self.up[1], "up", netns=gw)
        ip("link", "add", self.bridge, "type", "bridge", netns=gw)
        ip("addr", "add", f"{self.gw_lan}/24", "dev", self.bridge, netns=gw)
        ip("link", "set", self.bridge, "up", netns=gw)
        for ns, (outer, inner), address in zip(self.lan_ns, self.lan_links, self.host_addresses):
            self.add_netns(ns)
            ip("link", "set", "lo", "up", netns=ns)
            ip("link", "add", outer, "type", "veth", "peer", "name", inner, "netns", ns, netns=gw)
            ip("link", "set", outer, "master", self.bridge, netns=gw)
            ip("link", "set", outer, "up", netns=gw)
            ip("addr", "add", f"{address}/24", "dev", inner, netns=ns)
            ip("link", "set", inner, "up", netns=ns)
        # Toward the gateway, where forwarding is off: never out by the default route.
        ip("route", "add", self.lan_net, "via", self.gw_address, "dev", self.up[0])

    def check_exists(self) -> None:
        """Every address is ours, on our links, and the LAN's route leads to the gateway."""
        assert self.up_root in ip("-o", "addr", "show", "dev", self.up[0])
        assert self.gw_address in ip("-o", "addr", "show", "dev", self.up[1], netns=self.gw)
        assert self.gw_lan in ip("-o", "addr", "show", "dev", self.bridge, netns=self.gw)
        for ns, (_, inner), address in zip(self.lan_ns, self.lan_links, self.host_addresses):
            assert address in ip("-o", "addr", "show", "dev", inner, netns=ns)
        assert f"dev {self.up[0]}" in ip("route", "get", self.gw_address)
        for address in self.host_addresses:
            route = ip("route", "get", address)
            assert f"via {self.gw_address} dev {self.up[0]}" in route, route
        forward = subprocess.run(["ip", "netns", "exec", self.gw, "sysctl", "-n",
                                  "net.ipv4.ip_forward"], capture_output=True, text=True,
                                 timeout=20)
        assert forward.stdout.strip() == "0", forward
