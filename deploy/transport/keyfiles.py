"""Private key files loaded once per controller process (filecache.py). paramiko loads a
host's key files at each login, and loading an RSA key checks it (cryptography tests its
primes): some 85 ms of CPU for a 3072-bit key against 0.05 ms for an Ed25519 one, paid once per
host, one login after another under the GIL (docs/benchmarks.md, "Key files loaded once").
"""
from __future__ import annotations

import copy
import io
import os
from typing import Callable

import paramiko

from deploy.transport.filecache import ParsedFiles

CERT_SUFFIX = "-cert.pub"
# The key types paramiko's client tries a key file as, in its order.
KINDS = (paramiko.RSAKey, paramiko.ECDSAKey, paramiko.Ed25519Key)


def _load(path: str, data: bytes, kind: type[paramiko.PKey]) -> paramiko.PKey:
    # Without a passphrase, as the logins load them: an encrypted key raises
    # PasswordRequiredException, and ssh-agent, which holds it unlocked, is offered after.
    return kind.from_private_key(io.StringIO(data.decode("utf-8", "replace")))


_KEYS: ParsedFiles[paramiko.PKey] = ParsedFiles(_load)


def private_key(path: str, kind: type[paramiko.PKey]) -> paramiko.PKey:
    """The key in file `path` read as `kind` (SSHException if it is not one, OSError if it
    cannot be read): a copy of its own, so that a certificate loaded into it stays its own."""
    return copy.copy(_KEYS.get(path, kind))


def any_private_key(path: str) -> paramiko.PKey:
    """The key in file `path`, of whichever type it is; the last type's SSHException where it
    is none of them."""
    for kind in KINDS[:-1]:
        try:
            return private_key(path, kind)
        except paramiko.SSHException:
            continue
    return private_key(path, KINDS[-1])


def key_from_file(paramikos: Callable[..., paramiko.PKey]) -> Callable[..., paramiko.PKey]:
    """What paramiko's SSHClient._key_from_filepath(filename, kind, password) does, with each
    key loaded once per process: `filename` names a key or its certificate, and the
    certificate beside the key, if there is one, is loaded into the key's copy. With a
    password (tfdeploy gives none), paramiko's own."""
    def load(filename: str, kind: type[paramiko.PKey], password) -> paramiko.PKey:
        if password is not None:
            return paramikos(filename, kind, password)
        if filename.endswith(CERT_SUFFIX):
            key_path, cert_path = filename[:-len(CERT_SUFFIX)], filename
        else:
            key_path, cert_path = filename, filename + CERT_SUFFIX
        key = private_key(key_path, kind)
        if os.path.isfile(cert_path):
            key.load_certificate(cert_path)
        return key
    return load
