"""Host keys as OpenSSH checks them: the key is looked up under the HostKeyAlias if there is
one, else as `[host]:port` (or `host` on port 22), in every user known_hosts file and then
every global one; hashed names, `!` negations and wildcards match as in ssh; `@revoked` keys
are refused, and a host vouched for only by a `@cert-authority` line is refused saying why
(paramiko cannot check host certificates). A changed key is always refused, naming the file
and line, the name looked up and both fingerprints; a key never seen is refused unless
accepting new keys was asked for, and only then is the first user file written.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
import shlex
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import paramiko

from deploy.errors import Failure
from deploy.inventory.sshconfig import Hop
from deploy.transport.filecache import ParsedFiles

REVOKED, CERT_AUTHORITY = "@revoked", "@cert-authority"
# The key types a known_hosts type line stands for when paramiko chooses an algorithm.
ALGORITHMS = {"ssh-rsa": ("rsa-sha2-512", "rsa-sha2-256", "ssh-rsa")}


def fingerprint(key: paramiko.PKey) -> str:
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def blob_fingerprint(blob: bytes) -> str:
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


class HostKeyRefused(Failure):
    pass


@dataclass(frozen=True)
class Entry:
    """One known_hosts line that names a host."""
    file: str
    line: int
    marker: str          # "", REVOKED or CERT_AUTHORITY
    names: str           # the host patterns, or a hashed |1|salt|hash name
    keytype: str         # as the key itself says (the line's type field may lie)
    blob: bytes
    # Whether a name is one of its names, made ready when the line is read: every host of a
    # run looks itself up in every line, and a user's known_hosts may have thousands.
    names_host: Callable[[str], bool] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "names_host", _matcher(self.names))

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"


def _matcher(names: str) -> Callable[[str], bool]:
    """The test of a name against `names`: a hashed name's salt and digest decoded, or each
    pattern compiled (and whether it is negated), once."""
    if names.startswith("|1|"):
        try:
            salt, digest = (base64.b64decode(p) for p in names[3:].split("|"))
        except ValueError:
            return lambda name: False
        return lambda name: hmac.compare_digest(hmac.digest(salt, name.encode(), "sha1"),
                                                digest)
    patterns = [(p.startswith("!"), _glob(p[p.startswith("!"):]))
                for p in names.lower().split(",")]

    def matches(name: str) -> bool:
        name, matched = name.lower(), False
        for negated, pattern in patterns:
            if pattern.fullmatch(name):
                if negated:
                    return False
                matched = True
        return matched
    return matches


def _glob(pattern: str) -> re.Pattern:
    return re.compile(re.escape(pattern).replace(r"\*", ".*").replace(r"\?", "."))


def _keytype(blob: bytes) -> str:
    """The type a public key blob names (its first SSH string)."""
    if len(blob) < 4:
        return ""
    size = struct.unpack(">I", blob[:4])[0]
    return blob[4:4 + size].decode("ascii", "replace")


def entries(files: tuple[str, ...]) -> list[Entry]:
    """Every host line of the files that exist; a line ssh would skip is skipped."""
    found = []
    for file in files:
        try:
            found += _PARSED.get(file)
        except OSError:
            continue
    return found


def _parse(file: str, data: bytes) -> list[Entry]:
    found = []
    for number, line in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
        fields = line.split()
        if not fields or fields[0].startswith("#"):
            continue
        marker = fields.pop(0) if fields[0] in (REVOKED, CERT_AUTHORITY) else ""
        if len(fields) < 3:
            continue
        try:
            blob = base64.b64decode(fields[2], validate=True)
        except ValueError:
            continue
        found.append(Entry(file, number, marker, fields[0], _keytype(blob), blob))
    return found


# Every login of a run looks itself up in the same files.
_PARSED: ParsedFiles[list[Entry]] = ParsedFiles(_parse)


def lookup_name(hop: Hop) -> str:
    """The name ssh looks the key up under: the alias, else [host]:port, else host."""
    if hop.host_key_alias:
        return hop.host_key_alias
    return hop.hostname if hop.port == 22 else f"[{hop.hostname}]:{hop.port}"


def keyscan_hint(hop: Hop, file: str, scan_from: str = "") -> str:
    """The command that records the host's key in `file` (run on the gateway, if any)."""
    scan = f"{scan_from}ssh-keyscan -p {hop.port} {hop.hostname}"
    if hop.host_key_alias:
        scan += f" | sed {shlex.quote('s/^[^ ]*/' + hop.host_key_alias + '/')}"
    return f"{scan} >> {file}"


class OpenSshCheck(paramiko.MissingHostKeyPolicy):
    """The whole check, done when paramiko asks about the server's key: no key is loaded
    into paramiko, so it asks every time and this policy decides."""

    def __init__(self, where: str, hop: Hop, user_files: tuple[str, ...], accept_new: bool,
                 scan_from: str = ""):
        self.where, self.hop, self.accept_new, self.scan_from = where, hop, accept_new, scan_from
        self.user_files = user_files
        self.files = user_files + hop.global_known_hosts
        self.name = lookup_name(hop)
        self.known = [e for e in entries(self.files) if e.names_host(self.name)]

    def key_types(self) -> list[str]:
        """The algorithms of the keys known for the host, to be asked for first (as ssh
        does), so a host known by one type of key is not refused for offering another."""
        return [a for e in self.known if not e.marker for a in ALGORITHMS.get(e.keytype,
                                                                              (e.keytype,))]

    def missing_host_key(self, client, hostname, key):
        blob, offered = key.asbytes(), fingerprint(key)
        for entry in self.known:
            if entry.marker == REVOKED and entry.blob == blob:
                raise HostKeyRefused(f"{self.where}: the host key {offered} of {self.name} is "
                                     f"REVOKED ({entry.where}). Refusing to connect")
        plain = [e for e in self.known if not e.marker]
        if any(e.blob == blob for e in plain):
            return
        changed = [e for e in plain if e.keytype == _keytype(blob)]
        if changed:
            raise HostKeyRefused(
                f"{self.where}: HOST KEY CHANGED for {self.name}: {changed[0].where} has "
                f"{blob_fingerprint(changed[0].blob)}, the server offers {key.get_name()} "
                f"{offered}. Refusing to connect; if the host was really reinstalled, remove "
                f"its old line from {changed[0].file}")
        authorities = [e for e in self.known if e.marker == CERT_AUTHORITY]
        if authorities:
            raise HostKeyRefused(
                f"{self.where}: known_hosts trusts a certificate authority for {self.name} "
                f"({authorities[0].where}), and tfdeploy cannot check host certificates; "
                f"record the host's own key ({key.get_name()} {offered}) with: "
                + keyscan_hint(self.hop, self.user_files[0] if self.user_files else "<file>",
                               self.scan_from))
        if self.accept_new and self.user_files:
            _record(Path(self.user_files[0]), self.name, key)
            return
        if not self.user_files:
            raise HostKeyRefused(f"{self.where}: host key {key.get_name()} {offered} of "
                                 f"{self.name} cannot be checked: UserKnownHostsFile is none")
        shown = ", ".join(f for f in self.files if f in self.user_files or os.path.exists(f))
        raise HostKeyRefused(
            f"{self.where}: host key not in {shown} ({key.get_name()} {offered}"
            f"{', looked up as ' + self.name if self.hop.host_key_alias else ''}). If that "
            f"fingerprint is right, accept it once with --accept-new-host-keys (or "
            f"host_key_policy: accept-new in the inventory), or add it with: "
            f"{keyscan_hint(self.hop, self.user_files[0], self.scan_from)}")


def _record(path: Path, name: str, key: paramiko.PKey) -> None:
    """Append the key as OpenSSH's accept-new does (to the first user file)."""
    path = path.expanduser()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "a") as f:
        f.write(f"{name} {key.get_name()} {key.get_base64()}\n")
