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
import errno
import json
import os
import pwd
import queue
import re
import selectors
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


# A check connection's greeting and answer are one short line each, read with recv into a
# buffer of at most this many bytes.
LINE_MAX = 512
# How long either end of a check connection waits for the other's line.
LINE_WAIT = 2.0
# Between two tries of a port that refused (or failed otherwise), a dial waits this long.
RETRY_PAUSE = 0.1

# Both ends of the check connections run in one thread each, over nonblocking sockets and a
# selector, not in a thread per listener and per dial: with 65,280 connections in a 256-host
# lab on one machine, each connection's cost decides how long the mesh check takes. Most of
# it is the kernel's TCP work (benchmarks/bench_timeline.py --start-cost).


def first_line(data, closed):
    """The line `data` holds once whole (without its newline): at its newline, at LINE_MAX
    bytes, or at what came before the peer closed; None while more may come."""
    if b"\n" in data or len(data) >= LINE_MAX or closed:
        return data.split(b"\n", 1)[0].decode("utf-8", "replace")
    return None


def serve(listeners, host, nonce, counts, lock):
    """Answer each check connection to `listeners` ({socket: port}) with who we are, so the
    caller knows it reached us, until counts["stop"] (a listener shut down wakes the loop)."""
    selector = selectors.DefaultSelector()
    for listener, port in listeners.items():
        listener.setblocking(False)
        selector.register(listener, selectors.EVENT_READ, port)
    callers = {}                  # connection -> [port, bytes read, when to give up on it]
    hello = [HELLO, nonce]
    answers = {port: ("%s %s %s %d\n" % (HELLO, nonce, host, port)).encode()
               for port in listeners.values()}

    def drop(conn):
        if conn in callers:
            selector.unregister(conn)
            del callers[conn]
        conn.close()

    def hear(conn, caller):
        """Read what the caller sent; answer and close once its line is whole. Whether the
        line is still to come."""
        try:
            piece = conn.recv(LINE_MAX - len(caller[1]))
        except BlockingIOError:
            return True
        except OSError:
            piece = b""
        caller[1] += piece
        line = first_line(caller[1], not piece)
        if line is None:
            return True
        port = caller[0]
        if line.split()[:2] == hello:
            answer = answers[port]
            try:
                # A fresh connection's send buffer takes a short line whole.
                if conn.send(answer) == len(answer):
                    with lock:
                        counts[port] += 1
            except OSError:
                pass
        drop(conn)
        return False

    try:
        while not counts["stop"]:
            now = time.monotonic()
            wait = min([c[2] for c in callers.values()] + [now + 0.2]) - now
            for key, _ in selector.select(max(0.0, wait)):
                if key.data is not None:          # a listener (its port): a new caller
                    try:
                        conn, _ = key.fileobj.accept()
                    except BlockingIOError:
                        continue
                    except OSError:               # shut down: the probe is ending
                        selector.unregister(key.fileobj)
                        continue
                    conn.setblocking(False)
                    caller = [key.data, b"", time.monotonic() + LINE_WAIT]
                    # The greeting has often come with the connection: read at once, and
                    # watch the connection only when it has not.
                    if hear(conn, caller):
                        callers[conn] = caller
                        selector.register(conn, selectors.EVENT_READ)
                    continue
                hear(key.fileobj, callers[key.fileobj])
            now = time.monotonic()
            for conn in [c for c, caller in callers.items() if caller[2] <= now]:
                drop(conn)
    finally:
        for conn in list(callers):
            drop(conn)
        selector.close()


def socket_host(address):
    """`address` as the socket calls should get it. A host given to them as text goes through
    the idna codec, which an agent would import for this alone (a twentieth of its start's
    CPU): an ASCII name or address is given as bytes, any other name as the text it is."""
    return address.encode("ascii") if address.isascii() else address


class Dial:
    """One target's tries, until answered or its deadline (a peer's listener may start a
    moment later): its socket and step between the selector's events."""

    def __init__(self, index, target, deadline):
        self.index, self.host, self.port = index, socket_host(target[0]), int(target[1])
        self.expect_host, self.deadline = target[2], deadline
        self.last = "no attempt"      # why the last try failed
        self.addresses = []           # the rest of the name's addresses for this try
        self.sock = None
        self.until = 0.0              # when this step (connecting, the answer) gives up
        self.unsent = b""             # of the greeting, while connecting
        self.data = b""               # of the answer


# Dials one host has in flight at once: enough to probe many peers quickly, few enough that
# a peer that drops packets holds only these while its tries time out.
DIALERS = 8


def wait_for(lines, deadline):
    """The next command, or None when the controller is gone or the deadline passed."""
    try:
        return lines.get(timeout=max(0.0, deadline - time.monotonic()))
    except queue.Empty:
        return None


def dial_all(targets, nonce, attempt, retry_until):
    """Reach every target ([address, port, host]), DIALERS at a time, each try for `attempt`
    seconds at most; `retry_until(now)` is until when a target is tried again, from when its
    tries start. The results (filled in as they come) and the thread that dials."""
    results = [None] * len(targets)
    thread = threading.Thread(target=_dial_loop, daemon=True, args=(
        targets, results, nonce, float(attempt), retry_until))
    thread.start()
    return results, thread


def _dial_loop(targets, results, nonce, attempt, retry_until):
    hello = [HELLO, nonce]
    greeting = ("%s %s\n" % (HELLO, nonce)).encode()
    selector = selectors.DefaultSelector()
    pending = list(enumerate(targets))[::-1]
    dials = []                        # in flight: connecting, awaiting the answer, or paused

    def finish(dial, result):
        dials.remove(dial)
        results[dial.index] = result

    def release(dial):
        if dial.sock is not None:
            selector.unregister(dial.sock)
            dial.sock.close()
            dial.sock = None

    def pause(dial, why, now, wait=RETRY_PAUSE):
        """This try failed: the next one after `wait` seconds, unless its deadline comes
        first."""
        release(dial)
        dial.last, dial.until, dial.addresses = why, now + wait, []

    def connect(dial, now):
        """The next try, to the next of the name's addresses."""
        try:
            if not dial.addresses:
                dial.addresses = socket.getaddrinfo(dial.host, dial.port, 0,
                                                    socket.SOCK_STREAM)
            family, kind, proto, _, address = dial.addresses.pop(0)
            sock = socket.socket(family, kind, proto)
        except OSError as exc:
            return pause(dial, exc.strerror or str(exc), now)
        sock.setblocking(False)
        dial.sock, dial.unsent, dial.data = sock, greeting, b""
        selector.register(sock, selectors.EVENT_WRITE, dial)
        dial.until = now + min(attempt, max(0.1, dial.deadline - now))
        code = sock.connect_ex(address)
        if code not in (0, errno.EINPROGRESS):
            return failed(dial, code, now)
        # Over loopback or a near link the connection is often up already: the greeting goes
        # now rather than after the selector's next look. Only once it has a peer: a send while
        # it connects is EAGAIN on Linux, but ENOTCONN on the BSDs.
        try:
            sock.getpeername()
        except OSError:
            return
        step(dial, now)

    def failed(dial, code, now):
        """Connecting failed with errno `code`: the name's next address, or a pause (none
        after a timeout: that try took its time)."""
        release(dial)
        if dial.addresses:
            return connect(dial, now)
        if code == errno.ETIMEDOUT:
            return pause(dial, "timeout", now, wait=0.0)
        pause(dial, "refused" if code == errno.ECONNREFUSED else os.strerror(code), now)

    def step(dial, now):
        """The socket is ready: connected (send the greeting), or the answer came."""
        sock = dial.sock
        if dial.unsent:
            code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if code:
                return failed(dial, code, now)
            try:
                dial.unsent = dial.unsent[sock.send(dial.unsent):]
            except BlockingIOError:
                return
            except OSError as exc:
                return pause(dial, exc.strerror or str(exc), now)
            if not dial.unsent:
                selector.modify(sock, selectors.EVENT_READ, dial)
                dial.until = now + LINE_WAIT
            return
        try:
            piece = sock.recv(LINE_MAX - len(dial.data))
        except BlockingIOError:
            return
        except OSError as exc:
            return pause(dial, exc.strerror or str(exc), now)
        dial.data += piece
        line = first_line(dial.data, not piece)
        if line is None:
            return
        release(dial)
        answer = line.split()
        if answer[:2] != hello or len(answer) < 4:
            return finish(dial, {"error": "foreign", "detail": "answered by something that "
                                 "is not a tfdeploy check listener"})
        if answer[2] != dial.expect_host:
            return finish(dial, {"error": "wrong-host", "detail": answer[2]})
        finish(dial, {"ok": True})

    try:
        while pending or dials:
            now = time.monotonic()
            while pending and len(dials) < DIALERS:
                index, target = pending.pop()
                dial = Dial(index, target, retry_until(now))
                dials.append(dial)
                dial.until = now          # its first try starts below
            for dial in [d for d in dials if d.until <= now]:
                if dial.sock is not None:                 # this step gave up
                    failed(dial, errno.ETIMEDOUT, now)
                elif now >= dial.deadline:
                    finish(dial, {"error": dial.last})
                else:
                    connect(dial, now)
            if not dials:
                continue
            wait = min(d.until for d in dials) - time.monotonic()
            for key, _ in selector.select(max(0.0, wait)):
                if key.data.sock is key.fileobj:          # not released by an earlier event
                    step(key.data, time.monotonic())
    finally:
        for dial in dials:
            release(dial)
        selector.close()


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
    counts, lock, listeners, bind_errors = {"stop": False}, threading.Lock(), {}, {}
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
        listeners[s] = port
    server = threading.Thread(target=serve, daemon=True, args=(
        listeners, spec["host"], spec["nonce"], counts, lock))
    server.start()
    attempt = float(spec["attempt"])
    if driven:
        say({"listening": sorted(listen), "bind_errors": bind_errors})
        dial = wait_for(lines, deadline) == "dial"
        targets = spec["targets"] if dial else []
        retry_until = lambda now: min(deadline, now + window)  # noqa: E731
    else:
        targets = spec["targets"]
        retry_until = lambda now: started + window  # noqa: E731
    results, dialer = dial_all(targets, spec["nonce"], attempt, retry_until)
    dialer.join(max(0.0, deadline - time.monotonic()) + 3)
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
        # shutdown wakes serve()'s wait at once (it looks at counts["stop"] a fifth of a
        # second apart otherwise: added to every check).
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
    # The listeners are closed once serve() no longer waits on them.
    server.join(3)
    for s in listeners:
        s.close()
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
