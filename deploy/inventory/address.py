"""A host's network address as a value: an IPv4 or IPv6 address, or a host name kept as it
is written (resolved where it is used: by ssh, by the hosts' TensorFlow; never here).

The text is kept without brackets, as ssh, paramiko and getaddrinfo take it; with a port it
prints as `[2001:db8::1]:2222` for IPv6, the form TensorFlow's TF_CONFIG, known_hosts and
`ssh://` need, since `2001:db8::1:2222` could be read either way.
"""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass

LOOPBACK_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback")


@dataclass(frozen=True)
class Address:
    text: str                                               # without brackets
    ip: ipaddress.IPv4Address | ipaddress.IPv6Address | None = None   # None: a host name

    @classmethod
    def parse(cls, given: str) -> Address:
        """`10.0.0.5`, `2001:db8::1`, `[2001:db8::1]` or a host name; ValueError says why
        anything else is none of these."""
        bracketed = given.startswith("[") and given.endswith("]")
        text = given[1:-1] if bracketed else given
        try:
            ip = ipaddress.ip_address(text)
        except ValueError:
            ip = None
        if ip is not None and (ip.version == 6 or not bracketed):
            return cls(text, ip)
        if bracketed:
            raise ValueError(f"{given!r}: only an IPv6 address goes in brackets")
        if "[" in text or "]" in text:
            raise ValueError(f"{given!r} is not an address: brackets go around a whole IPv6 "
                             f"address, and the port in its own field")
        if ":" in text:
            raise ValueError(f"{given!r} is neither an IPv6 address nor a host name (a port "
                             f"goes in its own field, not after a colon)")
        return cls(text)

    def __str__(self) -> str:
        return self.text

    def with_port(self, port: int | str) -> str:
        """`host:port`, bracketed for IPv6: `[::1]:2222`."""
        return f"[{self.text}]:{port}" if self.is_v6 else f"{self.text}:{port}"

    @property
    def is_v6(self) -> bool:
        return self.ip is not None and self.ip.version == 6

    @property
    def is_loopback(self) -> bool:
        if self.ip is None:
            return self.text.lower() in LOOPBACK_NAMES
        return self.ip.is_loopback

    @property
    def needs_zone(self) -> bool:
        """IPv6 link-local (fe80::/10): it means something only together with the interface
        it is reached on (`fe80::1%eth0`), and that interface differs from host to host."""
        return self.is_v6 and self.ip.is_link_local

    @property
    def is_global(self) -> bool:
        """Routed on the public internet (documentation and private ranges are not)."""
        return self.ip is not None and self.ip.is_global

    @property
    def key(self) -> str:
        """For comparing: `2001:DB8::0:1` and `2001:db8::1` are one address, names ignore
        case."""
        return str(self.ip) if self.ip is not None else self.text.lower()
