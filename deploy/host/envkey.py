"""Which `inv setup` environment belongs to this host: its directory's name, computed here, on
the host, by the interpreter that builds and runs it.

    <workdir>/envs/<requirements>-<host key>/
        requirements  the first 16 hex digits of the sha256 of requirements.txt
        host key      the first 16 hex digits of the sha256 of host_facts(): the Python build,
                      the machine and the libc

Hosts that share one workdir (an NFS home) may run different Python builds, architectures or
libcs under one `python3`: each finds its own environment and wheels, never another's. Only
the host can tell these facts, so the controller names an environment by its requirements
alone and each host resolves the rest (launch, `inv setup`, the probe of `inv check`).

The host's agent (agent.py) resolves the environment from the requirements' sha256 for the
launch and for the probe of `inv check`; `inv setup`'s verbs (venv.py) for its build.
"""
import hashlib
import importlib.machinery
import json
import os
import re
import sys

from deploy.host.layout import ENVS

# An environment's directory name (env_name); group 1 is its requirements part.
ENV_NAME = re.compile(r"^([0-9a-f]{16})-[0-9a-f]{16}$")


def host_facts():
    """What a virtual environment and its wheels depend on: the interpreter's build (version,
    build date and compiler; implementation; the ABI its extension modules are built for, which
    names the architecture, the libc family and flags such as free-threading), where it lives
    (a venv links its base interpreter), the machine and the C library. Cheap to compute: a
    launch asks it for every task."""
    return {
        "python": sys.version,
        "cache_tag": sys.implementation.cache_tag,
        "abi": importlib.machinery.EXTENSION_SUFFIXES,
        "base": os.path.realpath(sys.executable),
        "system": os.uname().sysname,
        "machine": os.uname().machine,
        "libc": libc(),
    }


def libc():
    """`glibc 2.36`; on another C library (musl), what the interpreter's binary names."""
    try:
        return os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError):
        import platform
        return " ".join(platform.libc_ver())


def host_key(facts=None):
    """16 hex digits naming `facts` (this interpreter's host_facts() by default)."""
    facts = host_facts() if facts is None else facts
    blob = json.dumps(facts, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def env_name(requirements_sha256, key=None):
    """`<requirements>-<host key>`: the one place that names an environment. `key` is this
    interpreter's host_key() unless given (the plan shows a placeholder there)."""
    if not re.match(r"^[0-9a-f]{64}$", requirements_sha256):
        raise ValueError("not a requirements sha256: %r" % (requirements_sha256,))
    return "%s-%s" % (requirements_sha256[:16], host_key() if key is None else key)


def env_dir(workdir, requirements_sha256, key=None):
    return "%s/%s/%s" % (workdir, ENVS, env_name(requirements_sha256, key))


def env_python(workdir, requirements_sha256, key=None):
    """The interpreter of the environment: what tasks prefer where it exists."""
    return env_dir(workdir, requirements_sha256, key) + "/bin/python"


def built_from(name, requirements):
    """Whether the environment directory `name` was built from one of `requirements` (sha256
    of requirements.txt files), on whichever host."""
    match = ENV_NAME.match(name)
    return bool(match) and any(r[:16] == match.group(1) for r in requirements)
