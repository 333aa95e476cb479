"""The host side of `inv check` and of `inv train`'s port choice, asked through the host's
agent (agent.py), which runs from memory: asking writes nothing on the host. Standard library
only, like the rest of deploy/host.

    probe(WORKDIR, COUNT, DATA)  python, package versions (read from installed metadata:
                          importing TensorFlow would take seconds), free disk under WORKDIR,
                          COUNT free TCP ports, whether the host has IPv6, and whether the
                          directory DATA (an inventory `data: {remote: ...}`) can be read; also
                          run by another interpreter as `python -I - probe ...` (main())
    mesh(SPEC)            listen on this host's task ports, connect to the other tasks' ports,
                          report what answered (see mesh()), in phases the controller drives
    free_ports(COUNT)     COUNT free TCP ports, distinct from each other
    ports_free(PORTS)     which of PORTS are free now
"""
import json
import os
import pwd
import queue
import re
import socket
import stat
import sys
import threading
import time

# The packages whose versions matter (the check compares them across hosts, inv setup shows
# them), each with the distribution names it may be installed under: the first one found
# counts, and the first one is what to install. The one table of them, read one way
# (versions), here and by inv setup (venv.py, which runs this file in an environment).
PACKAGES = {
    "tensorflow": ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tensorflow-macos",
                   "tf-nightly", "tf-nightly-cpu"),
    "tf_keras": ("tf-keras", "tf_keras", "tf-keras-nightly"),
    "numpy": ("numpy",),
}
HELLO = "tfdeploy-check"


def package_path():
    """Where this python, run as the tasks run it (with its site), finds packages. The agent
    runs with -I -S (site's start-up is most of a Python's): the site directories, a virtual
    environment's (which only site would make sys.prefix) and the user's, are added here."""
    import site
    prefixes = [sys.prefix]
    config = venv_config()
    if config is not None:
        folder = os.path.dirname(config)
        with open(config, encoding="utf-8", errors="replace") as f:
            system = re.search(r"(?m)^include-system-site-packages\s*=\s*true\s*$",
                               f.read(), re.I)
        prefixes = [folder] + ([sys.base_prefix] if system else [])
    path = list(sys.path)
    for directory in site.getsitepackages(prefixes) + [site.getusersitepackages()]:
        if os.path.isdir(directory) and directory not in path:
            path.append(directory)
    return path


def venv_config():
    """The pyvenv.cfg of the virtual environment this python belongs to, or None (read from
    the files: with -S, sys.prefix does not say)."""
    for folder in (os.path.dirname(sys.executable), os.path.dirname(os.path.dirname(
            sys.executable))):
        config = os.path.join(folder, "pyvenv.cfg")
        if os.path.isfile(config):
            return config
    return None


def externally_managed():
    """Whether pip refuses to install into this python (PEP 668): a distribution's own Python
    marks its standard library's directory EXTERNALLY-MANAGED; a virtual environment made from
    it is not managed."""
    return venv_config() is None and os.path.isfile(
        os.path.join(os.path.dirname(os.__file__), "EXTERNALLY-MANAGED"))


def normalized(name):
    """A distribution's name as installers write it in metadata directories (PEP 503)."""
    return re.sub(r"[-_.]+", "_", name).lower()


def versions(path=None):
    """The installed version of each of PACKAGES (None: not installed) along `path` (default:
    package_path()). Each directory is listed once, and each name in it normalized once: not
    importlib.metadata, which costs a twentieth of a second to import, on each of many hosts."""
    listed = distributions_along(package_path() if path is None else path)
    return {key: version_of(names, listed) for key, names in PACKAGES.items()}


def distributions_along(path):
    """For each directory of `path`, in order: {normalized name: (version, metadata
    directory)} of what is installed there, from the metadata directories' names
    (`tensorflow-2.21.0.dist-info`); the first in sorted order counts."""
    listed = []
    for directory in path:
        found = {}
        try:
            entries = sorted(os.listdir(directory or "."))
        except OSError:
            entries = []
        for entry in entries:
            stem, _, kind = entry.rpartition(".")
            if kind in ("dist-info", "egg-info"):
                dist, _, version = stem.partition("-")
                found.setdefault(normalized(dist), (version, os.path.join(directory, entry)))
        listed.append(found)
    return listed


def version_of(names, listed):
    """The version of the first of `names` found in `listed` (distributions_along), in the
    order of the path: from its metadata directory's name, else the Version line inside one
    named without it."""
    for name in names:
        wanted = normalized(name)
        for found in listed:
            if wanted in found:
                version, folder = found[wanted]
                return version or metadata_version(folder)
    return None


def metadata_version(folder):
    for name in ("METADATA", "PKG-INFO"):
        try:
            with open(os.path.join(folder, name), encoding="utf-8", errors="replace") as f:
                for line in f:
                    if line.startswith("Version:"):
                        return line.split(":", 1)[1].strip()
                    if not line.strip():
                        break
        except OSError:
            continue
    return None


def existing_ancestor(path):
    path = os.path.abspath(os.path.expanduser(path))
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def has_ipv6():
    """Whether this host can open IPv6 sockets at all (a kernel booted with ipv6.disable=1,
    or a container without it, cannot)."""
    try:
        socket.socket(socket.AF_INET6, socket.SOCK_STREAM).close()
        return True
    except OSError:
        return False


def any_address_socket():
    """A TCP socket to bind on every interface as TensorFlow's gRPC binds (`[::]:port`):
    IPv6 with IPv4 too (dual-stack) where the host has IPv6, else IPv4. A port it binds is free
    for both families, and it answers callers of either."""
    if has_ipv6():
        s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        return s, "::"
    return socket.socket(socket.AF_INET, socket.SOCK_STREAM), ""


# Why writing under `workdir` is unsafe, or None. Every component of its path is looked at
# with lstat, and again along where its links lead: the workdir must be the user's; every
# directory above it the user's or root's and not writable by group or others (unless sticky:
# /tmp); a symbolic link on the way the user's or root's (another user's link, or a directory
# another user can write, lets that user point the tool's writes anywhere). The nearest
# existing directory is where a missing workdir would be made. `inv setup` runs this
# function's source before it writes anything (deploy/plan/envbuild.py), so it stays
# self-contained: os, pwd and stat only.
def unsafe_workdir(workdir):
    me = os.getuid()
    wanted = os.path.abspath(os.path.expanduser(workdir))

    def name(uid):
        try:
            return pwd.getpwuid(uid).pw_name
        except KeyError:
            return "uid %d" % uid

    def first_problem(path):
        current = "/"
        for part in [""] + [p for p in path.split("/") if p]:
            current = os.path.join(current, part)
            try:
                st = os.lstat(current)
            except (FileNotFoundError, NotADirectoryError):
                return None            # made by the tool, below what was checked
            if stat.S_ISLNK(st.st_mode):
                if st.st_uid not in (me, 0):
                    return "%s is a symbolic link owned by %s" % (current, name(st.st_uid))
                continue               # where it leads is checked too (realpath)
            last = current == path
            open_to_others = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and \
                not st.st_mode & stat.S_ISVTX
            if open_to_others or st.st_uid != me and (last or st.st_uid != 0):
                return "%sowned by %s, mode %04o" % ("" if last else "in %s, " % current,
                                                    name(st.st_uid), stat.S_IMODE(st.st_mode))
        return None

    problem = first_problem(wanted) or first_problem(os.path.realpath(wanted))
    if problem is None:
        return None
    owners = name(me) + ("" if me == 0 else " or root")
    return ("unsafe workdir %s: %s; it must be owned by %s, every directory and link on its "
            "way by %s, none writable by group or others unless sticky" % (
                wanted, problem, name(me), owners))


def free_ports(count):
    """Ports the kernel calls free on every interface and in both families (TensorFlow binds
    [::]:port). `inv check` and the port choice of `inv train` both ask this, so both choose
    ports alike."""
    socks = []
    try:
        for _ in range(count):
            s, anywhere = any_address_socket()
            socks.append(s)
            s.bind((anywhere, 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def ports_free(ports):
    """Which of `ports` this host could listen on now, as TensorFlow's gRPC would (every
    interface, SO_REUSEADDR: connections of a task that ended, in TIME_WAIT, do not hold its
    port; another program listening there does)."""
    free = []
    for port in ports:
        s, anywhere = any_address_socket()
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((anywhere, port))
            free.append(port)
        except OSError:
            pass
        finally:
            s.close()
    return free


def data_problem(path):
    """Why the tasks could not read their data directory `path`, or None."""
    path = os.path.expanduser(path)
    if not os.path.exists(path):
        return "does not exist"
    if not os.path.isdir(path):
        return "is not a directory"
    if not os.access(path, os.R_OK | os.X_OK):
        return "is not readable by %s" % (os.environ.get("USER") or "this user")
    return None


def probe(workdir, count, data=None):
    base = existing_ancestor(workdir)
    st = os.statvfs(base)
    return {
        "data_problem": data_problem(data) if data else None,
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "externally_managed": externally_managed(),
        "versions": versions(),
        "disk_path": base,
        "disk_free": st.f_bavail * st.f_frsize,
        "writable": os.access(base, os.W_OK | os.X_OK),
        "workdir_problem": unsafe_workdir(workdir),
        "ports": free_ports(count),
        "ipv6": has_ipv6(),
    }


# A check connection's greeting and answer are one short line each. They are read with recv,
# not a file object: with 65,280 connections in a 256-host lab on one machine, each
# connection's cost decides how long the mesh check takes. Four fifths of it is the kernel's
# TCP work (benchmarks/bench_timeline.py --start-cost), which no change here takes away.
LINE_MAX = 512


def read_line(conn):
    """The first line `conn` sends (without its newline), at most LINE_MAX bytes; what came
    when it closes first."""
    data = b""
    while b"\n" not in data and len(data) < LINE_MAX:
        piece = conn.recv(LINE_MAX - len(data))
        if not piece:
            break
        data += piece
    return data.split(b"\n", 1)[0].decode("utf-8", "replace")


def serve(listener, port, host, nonce, counts, lock):
    """Answer each check connection with who we are, so the caller knows it reached us."""
    listener.settimeout(0.2)
    answer = ("%s %s %s %d\n" % (HELLO, nonce, host, port)).encode()
    while not counts["stop"]:
        try:
            conn, _ = listener.accept()
        except socket.timeout:
            continue
        except OSError:
            return
        with conn:
            conn.settimeout(2.0)
            try:
                if read_line(conn).split()[:2] == [HELLO, nonce]:
                    conn.sendall(answer)
                    with lock:
                        counts[port] += 1
            except OSError:
                continue


def socket_host(address):
    """`address` as the socket calls should get it. A host given to them as text goes through
    the idna codec, which an agent would import for this alone (a twentieth of its start's
    CPU): an ASCII name or address is given as bytes, any other name as the text it is."""
    return address.encode("ascii") if address.isascii() else address


def reach(address, port, expect_host, nonce, deadline, attempt):
    """Connect until answered or the deadline: a peer's listener may start a moment later."""
    last = "no attempt"
    greeting = ("%s %s\n" % (HELLO, nonce)).encode()
    host = socket_host(address)
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=min(
                    attempt, max(0.1, deadline - time.monotonic()))) as s:
                s.settimeout(2.0)
                s.sendall(greeting)
                answer = read_line(s).split()
            if answer[:2] != [HELLO, nonce] or len(answer) < 4:
                return {"error": "foreign", "detail": "answered by something that is not a "
                        "tfdeploy check listener"}
            if answer[2] != expect_host:
                return {"error": "wrong-host", "detail": answer[2]}
            return {"ok": True}
        except socket.timeout:
            last = "timeout"
        except ConnectionRefusedError:
            last = "refused"
            time.sleep(0.1)
        except OSError as exc:
            last = exc.strerror or str(exc)
            time.sleep(0.1)
    return {"error": last}


# Dials one host makes at once: enough to probe many peers quickly, few enough that 64 hosts'
# probes do not flood a loaded machine with threads.
DIALERS = 8


def wait_for(lines, deadline):
    """The next command, or None when the controller is gone or the deadline passed."""
    try:
        return lines.get(timeout=max(0.0, deadline - time.monotonic()))
    except queue.Empty:
        return None


def dial_all(targets, nonce, attempt, retry_until):
    """Reach every target, DIALERS at a time; `retry_until(now)` is how long a refused port
    is tried again."""
    results = [None] * len(targets)
    pending = list(enumerate(targets))
    lock = threading.Lock()

    def dialer():
        while True:
            with lock:
                if not pending:
                    return
                i, target = pending.pop(0)
            results[i] = reach(target[0], int(target[1]), target[2], nonce,
                               retry_until(time.monotonic()), attempt)
    threads = [threading.Thread(target=dialer, daemon=True)
               for _ in range(min(DIALERS, len(targets)))]
    for t in threads:
        t.start()
    return results, threads


def mesh(spec, lines=None, say=None):
    """spec: {"host", "nonce", "window", "attempt", "listen": {port: expected connections},
    "targets": [[address, port, host], ...], "driven": deadline (optional)}.

    Driven by the controller (`driven` seconds at most, its commands arriving on the queue
    `lines`, answers given to `say`): listen on every port and say {"listening": ...}; on
    "dial", dial every target (each one for the window at most) and say {"dialed": ...};
    on "close" (or None: the controller is gone, or the deadline) close and answer. Every
    host listens before any host dials, however long the hosts took to start.

    Not driven: dial at once, trying a refused port again until the window ends (a peer may
    start a moment later), and listen until every expected caller came or the window ends."""
    window, started = float(spec["window"]), time.monotonic()
    driven = spec.get("driven")
    deadline = started + (float(driven) if driven else window)
    listen = {int(p): n for p, n in spec["listen"].items()}
    counts, lock, listeners, threads, bind_errors = {"stop": False}, threading.Lock(), [], [], {}
    for port in listen:
        counts[port] = 0
        s, anywhere = any_address_socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((anywhere, port))
            s.listen(1024)
        except OSError as exc:
            bind_errors[str(port)] = exc.strerror or str(exc)
            s.close()
            continue
        listeners.append(s)
        threads.append(threading.Thread(target=serve, daemon=True, args=(
            s, port, spec["host"], spec["nonce"], counts, lock)))
    for t in threads:
        t.start()
    attempt = float(spec["attempt"])
    if driven:
        say({"listening": sorted(listen), "bind_errors": bind_errors})
        dial = wait_for(lines, deadline) == "dial"
        targets = spec["targets"] if dial else []
        retry_until = lambda now: min(deadline, now + window)  # noqa: E731
    else:
        targets = spec["targets"]
        retry_until = lambda now: started + window  # noqa: E731
    results, callers = dial_all(targets, spec["nonce"], attempt, retry_until)
    for t in callers:
        t.join(max(0.0, deadline - time.monotonic()) + 3)
    if driven:
        if dial:
            say({"dialed": len(targets)})
            wait_for(lines, deadline)        # "close", or the controller is gone
    else:
        # Stay reachable until every expected caller came, or the window is over.
        while time.monotonic() < started + window + 1:
            with lock:
                if all(counts[p] >= n for p, n in listen.items() if str(p) not in bind_errors):
                    break
            time.sleep(0.05)
    counts["stop"] = True
    for s in listeners:
        # shutdown wakes a serve() blocked in accept at once (close alone leaves it there
        # until its accept timeout: a fifth of a second added to every check).
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        s.close()
    # A listener's thread may be serving a caller that came late: let it finish (it gives up
    # within its connection's timeout) rather than end the process under it.
    for t in threads:
        t.join(3)
    return {"connects": [dict(r or {"error": "no answer"}, address=t[0], port=int(t[1]),
                              host=t[2]) for r, t in zip(results, spec["targets"])],
            "accepted": {str(p): counts[p] for p in listen},
            "bind_errors": bind_errors}


def installed():
    """This python's version and those of PACKAGES (None: not installed)."""
    return dict(versions(), python=sys.version.split()[0])


def main(argv):
    """`python -I - ASKED`: this file run by another interpreter than the agent's (the
    environment `inv setup` built), from its stdin, what is asked a JSON object on its command
    line: the probe ({"workdir", "count", "data"}, as the agent's probe_host), or only the
    versions ({"versions": true}, as venv.py asks them)."""
    asked = json.loads(argv[0])
    answer = installed() if asked.get("versions") else \
        probe(asked["workdir"], asked["count"], asked["data"])
    sys.stdout.write(json.dumps(answer) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
