"""OpenSSH user certificates (PROTOCOL.certkeys), as ssh offers them: a `CertificateFile` goes
with the key file it certifies, wherever the two lie (a `<key>-cert.pub` beside its key
paramiko finds by itself). And when a server refuses one, why: expired, not yet valid, or not
for this user, read from the certificate itself."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass

import paramiko

from deploy.transport.keyfiles import CERT_SUFFIX, any_private_key

# How many length-prefixed fields of the certified public key follow the nonce, by type.
KEY_FIELDS = {
    "ssh-rsa-cert-v01@openssh.com": 2, "ssh-dss-cert-v01@openssh.com": 4,
    "ecdsa-sha2-nistp256-cert-v01@openssh.com": 2, "ecdsa-sha2-nistp384-cert-v01@openssh.com": 2,
    "ecdsa-sha2-nistp521-cert-v01@openssh.com": 2, "ssh-ed25519-cert-v01@openssh.com": 1,
    "sk-ecdsa-sha2-nistp256-cert-v01@openssh.com": 3,
    "sk-ssh-ed25519-cert-v01@openssh.com": 2,
}
USER_CERT = 1                   # the certificate's type: a user's (2: a host's)
FOREVER = 2 ** 64 - 1


@dataclass(frozen=True)
class Certificate:
    path: str
    blob: paramiko.PublicBlob
    key: bytes                  # the certified public key's fields, as a key file has them
    principals: tuple[str, ...]
    valid_after: int
    valid_before: int
    user_certificate: bool

    def problem(self, user: str, now: float | None = None) -> str | None:
        """Why a server would refuse it for `user` now, or None."""
        now = time.time() if now is None else now
        if not self.user_certificate:
            return f"certificate {self.path} is a host certificate, not a user's"
        if now >= self.valid_before:
            return f"certificate {self.path} expired at {_utc(self.valid_before)}"
        if now < self.valid_after:
            return f"certificate {self.path} is not valid before {_utc(self.valid_after)}"
        if self.principals and user not in self.principals:
            return (f"certificate {self.path} is for {', '.join(map(repr, self.principals))}, "
                    f"not {user!r}")
        return None


def _utc(seconds: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(min(seconds, 2 ** 40)))


def read_certificate(path: str) -> Certificate:
    """The certificate in the file `path`; ValueError says why it is not one."""
    try:
        blob = paramiko.PublicBlob.from_file(path)
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read certificate {path}: {exc}") from None
    fields = KEY_FIELDS.get(blob.key_type)
    if fields is None:
        raise ValueError(f"{path} is not an OpenSSH certificate ({blob.key_type})")
    message = paramiko.Message(blob.key_blob)
    try:
        message.get_text()                    # its type
        message.get_string()                  # nonce
        start = message.packet.tell()
        for _ in range(fields):
            message.get_string()
        key = blob.key_blob[start:message.packet.tell()]
        message.get_int64()                   # serial
        kind = message.get_int()
        message.get_string()                  # key id
        principals = paramiko.Message(message.get_string())
        names = []
        while principals.packet.tell() < len(principals.asbytes()):
            names.append(principals.get_text())
        valid_after, valid_before = message.get_int64(), message.get_int64()
    except Exception as exc:  # a short or garbled blob: paramiko reads past its end
        raise ValueError(f"{path} is not a readable OpenSSH certificate: {exc}") from None
    return Certificate(path, blob, key, tuple(names), valid_after, valid_before,
                       kind == USER_CERT)


def key_fields(key: paramiko.PKey) -> bytes:
    """A key's public fields after its type, to compare with a certificate's."""
    message = paramiko.Message(key.asbytes())
    message.get_text()
    return key.asbytes()[message.packet.tell():]


def certified_key(certificate_files: tuple[str, ...],
                  key_files: list[str]) -> tuple[paramiko.PKey | None, list[Certificate]]:
    """The first of `key_files` that one of `certificate_files` certifies, with that
    certificate loaded (ssh offers such a pair as one identity), or None; and every
    certificate read, the `<key>-cert.pub` beside each key file included, for the reasons a
    refusal may have. A key file that needs a passphrase is not opened here: ssh-agent, which
    holds it unlocked, is offered after the files."""
    certificates = []
    configured = [os.path.expanduser(path) for path in certificate_files]
    for path in dict.fromkeys([*configured, *(k + CERT_SUFFIX for k in key_files)]):
        if os.path.isfile(path):
            try:
                certificates.append(read_certificate(path))
            except ValueError:
                continue
    paired = None
    for key_file in key_files if configured else ():     # no CertificateFile: nothing to pair
        if paired is not None:
            break
        try:
            key = any_private_key(key_file)
        except (paramiko.SSHException, OSError, ValueError, TypeError):
            continue
        for certificate in (c for c in certificates if c.path in configured):
            if certificate.key == key_fields(key):
                key.load_certificate(certificate.path)
                paired = key
                break
    return paired, certificates


def refusal(certificates: list[Certificate], user: str) -> str:
    """Why the server may have refused the certificates offered: each one's problem."""
    said = [c.problem(user) for c in certificates]
    return "; ".join(p for p in said if p)
