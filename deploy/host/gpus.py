"""A host's GPUs as its driver's `nvidia-smi` reports them, who holds each, and leases that keep
two runs started at once off one GPU. Standard library only, like the rest of deploy/host.

    query()            every GPU (index, uuid, model, memory, utilisation) and its compute
                       processes, each with its user (from /proc: this runs on the host), or
                       why there is none ("nvidia-smi not found", "No devices were found")
    place(...)         the GPUs a host's tasks get (a list, N free ones, every free one),
                       each leased for the run, or why not
    release(run_id)    that run's leases let go (its teardown)
    interface_of(ip)   the network interface that carries an address (NCCL_SOCKET_IFNAME)

A GPU is busy when a compute process is on it, when more than BUSY_MEMORY of its memory is in
use (a process of another container is not listed, its memory is), or when another live run
holds its lease. Leases live host-wide in LEASES (sticky, every user may write, as /tmp), one
file per GPU UUID created with O_EXCL: runs of different users on one server see each other's.
A lease is stale when every process it names is gone.
"""
import json
import os
import pwd
import shutil
import socket
import struct
import subprocess
import threading
import time

from deploy.host.probe import socket_host
from deploy.host.protocol import MAX_GPU_PROCESSES, MAX_GPUS

QUERY_GPUS = ("--query-gpu=index,uuid,name,memory.total,memory.used,utilization.gpu",
              "--format=csv,noheader,nounits")
QUERY_APPS = ("--query-compute-apps=pid,gpu_uuid,used_memory,process_name",
              "--format=csv,noheader,nounits")
NO_VALUE = ("[N/A]", "[Not Supported]", "N/A", "")
BUSY_MEMORY = 0.10
LEASES = "/tmp/tfdeploy-gpu-leases"
TIMEOUT = 20.0
MAX_APPS = MAX_GPUS * MAX_GPU_PROCESSES
HOLDING = threading.Lock()


def value(text):
    """A CSV field: None where the board has no value; the number without its unit."""
    text = text.strip()
    if text in NO_VALUE:
        return None
    for unit in (" MiB", " %"):
        if text.endswith(unit):
            text = text[:-len(unit)]
    return text


def number(text):
    text = value(text)
    try:
        return int(float(text)) if text is not None else None
    except ValueError:
        return None


def parse_gpus(text):
    """`--query-gpu` lines: index, uuid, name, memory.total, memory.used, utilization.gpu."""
    gpus = []
    for line in text.splitlines()[:MAX_GPUS]:
        fields = line.split(", ")
        if len(fields) < 6 or number(fields[0]) is None:
            continue
        gpus.append({"index": number(fields[0]), "uuid": value(fields[1]) or "",
                     "name": value(", ".join(fields[2:-3])) or "",
                     "memory_total": number(fields[-3]), "memory_used": number(fields[-2]),
                     "utilization": number(fields[-1]), "processes": []})
    return gpus


def parse_apps(text):
    """`--query-compute-apps` lines: pid, gpu_uuid, used_memory, process_name."""
    apps = []
    for line in text.splitlines()[:MAX_APPS]:
        fields = line.split(", ")
        if len(fields) < 4 or number(fields[0]) is None:
            continue
        apps.append({"pid": number(fields[0]), "uuid": value(fields[1]) or "",
                     "used_memory": number(fields[2]),
                     "name": value(", ".join(fields[3:])) or ""})
    return apps


def owner(pid):
    """The user whose process `pid` is, by name (its uid where it has none); None if gone."""
    try:
        uid = os.stat("/proc/%d" % pid).st_uid
    except OSError:
        return None
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def smi(args):
    """nvidia-smi's output, or (None, why)."""
    program = shutil.which("nvidia-smi")
    if program is None:
        return None, "nvidia-smi not found on the PATH"
    try:
        done = subprocess.run([program, *args], stdin=subprocess.DEVNULL,
                              capture_output=True, timeout=TIMEOUT)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, "nvidia-smi failed: %s" % exc
    out = done.stdout.decode("utf-8", "replace")
    said = (out + done.stderr.decode("utf-8", "replace")).strip()
    if "No devices were found" in said:
        return None, "No devices were found"
    if done.returncode != 0:
        return None, "nvidia-smi exited %d: %s" % (done.returncode, said[-300:])
    return out, None


def query():
    """{"gpus": [...], "note": why none, or None}."""
    out, why = smi(QUERY_GPUS)
    if out is None:
        return {"gpus": [], "note": why}
    gpus = parse_gpus(out)
    if not gpus:
        return {"gpus": [], "note": "nvidia-smi lists no GPU"}
    apps, _ = smi(QUERY_APPS)
    by_uuid = {g["uuid"]: g for g in gpus}
    for app in parse_apps(apps or ""):
        gpu = by_uuid.get(app["uuid"])
        if gpu is not None:
            gpu["processes"].append({"pid": app["pid"], "user": owner(app["pid"]),
                                     "used_memory": app["used_memory"], "name": app["name"]})
    return {"gpus": gpus, "note": None}


def sample():
    """Each GPU's utilisation (%) and memory in use (MiB) now, by index: what the live view
    shows of the tasks' GPUs ({} where nvidia-smi answers nothing)."""
    out, _ = smi(("--query-gpu=index,utilization.gpu,memory.used",
                  "--format=csv,noheader,nounits"))
    found = {}
    for line in (out or "").splitlines()[:MAX_GPUS]:
        fields = line.split(", ")
        if len(fields) == 3 and number(fields[0]) is not None:
            found[str(number(fields[0]))] = [number(fields[1]), number(fields[2])]
    return found


def busy_reason(gpu):
    """Why another run or user holds the GPU (its processes, or its memory in use), or None."""
    held = ["%s (pid %d)" % (p["user"] or "a process gone since", p["pid"])
            for p in gpu["processes"]]
    if held:
        return "held by " + ", ".join(held)
    total, used = gpu["memory_total"], gpu["memory_used"]
    if total and used is not None and used > BUSY_MEMORY * total:
        return "%d of %d MiB in use, no process visible" % (used, total)
    return None


# -- leases ----------------------------------------------------------------------------------

def _lease_dir():
    try:
        os.mkdir(LEASES, 0o1777)
        os.chmod(LEASES, 0o1777)          # past the umask: every user's runs lease here
    except FileExistsError:
        pass
    st = os.lstat(LEASES)
    if not os.path.isdir(LEASES) or os.path.islink(LEASES):
        raise OSError("%s is not a directory" % LEASES)
    return LEASES, st


def _lease_path(uuid):
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in uuid)[:128]
    return os.path.join(LEASES, "gpu-%s.lease" % safe)


def _alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True                       # another user's: alive


def holder(uuid):
    """The lease on the GPU `uuid` if a live run holds it: {run_id, user, pids}, else None (a
    stale lease is removed where this user may)."""
    path = _lease_path(uuid)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError:
        return {"run_id": "?", "user": "?", "pids": []}      # a link planted there: held
    with os.fdopen(fd, "rb") as f:
        try:
            lease = json.loads(f.read(4096))
            pids = [int(p) for p in lease.get("pids", [])]
        except (ValueError, TypeError, AttributeError):
            return {"run_id": "?", "user": "?", "pids": []}
    if any(_alive(p) for p in pids):
        return lease
    try:
        os.unlink(path)
    except OSError:
        pass
    return None


def _take(uuid, run_id, pids):
    """Lease the GPU for `run_id`: True if this call created the lease (O_EXCL)."""
    lease = {"run_id": run_id, "user": pwd.getpwuid(os.getuid()).pw_name,
             "pids": list(pids), "since": time.time()}
    for _ in range(2):
        try:
            fd = os.open(_lease_path(uuid), os.O_WRONLY | os.O_CREAT | os.O_EXCL |
                         os.O_NOFOLLOW, 0o644)
        except FileExistsError:
            if holder(uuid) is not None:  # a live run's; a stale one is gone: try again
                return False
            continue
        os.fchmod(fd, 0o644)              # readable by every user: whose run holds it
        with os.fdopen(fd, "w") as f:
            json.dump(lease, f)
        return True
    return False


def leases_of(run_id):
    """The lease files of `run_id` on this host (this user's)."""
    found = []
    try:
        names = os.listdir(LEASES)
    except OSError:
        return found
    for name in names:
        if not (name.startswith("gpu-") and name.endswith(".lease")):
            continue
        path = os.path.join(LEASES, name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            continue
        with os.fdopen(fd, "rb") as f:
            if os.fstat(f.fileno()).st_uid != os.getuid():
                continue
            try:
                lease = json.loads(f.read(4096))
            except ValueError:
                continue
        if isinstance(lease, dict) and lease.get("run_id") == run_id:
            found.append((path, lease))
    return found


def hold(run_id, pids):
    """Name `pids` (the tasks' supervisors) in the run's leases beside the agent's, so that
    the leases outlive the agent (a detached run) and go stale with the tasks."""
    with HOLDING:                   # the tasks of one host start at once, each in a thread
        for path, lease in leases_of(run_id):
            lease["pids"] = sorted(set(lease.get("pids", [])) | set(pids))
            tmp = "%s.%d.tmp" % (path, os.getpid())
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
            os.fchmod(fd, 0o644)
            with os.fdopen(fd, "w") as f:
                json.dump(lease, f)
            os.replace(tmp, path)


def release(run_id):
    """Delete the run's leases; how many."""
    found = leases_of(run_id)
    for path, _ in found:
        try:
            os.unlink(path)
        except OSError:
            pass
    return len(found)


def place(want, run_id, allow_busy, pids):
    """The GPU indices the host's tasks get, leased for `run_id`, or a refusal.

    `want`: a list of indices, an int N (N free GPUs), or "free" (every free GPU). Returns
    {"indices": [...], "problem": None} or {"indices": [], "problem": why}, leasing nothing
    in the second case."""
    found = query()
    gpus = found["gpus"]
    if not gpus:
        return {"indices": [], "problem": "no GPU: %s" % found["note"]}
    _lease_dir()
    by_index = {g["index"]: g for g in gpus}

    def reason(gpu):
        lease = holder(gpu["uuid"])
        if lease is not None and lease.get("run_id") != run_id:
            return "leased by run %s of %s" % (lease.get("run_id"), lease.get("user"))
        return busy_reason(gpu)

    taken = []

    def give_back(problem):
        for index in taken:
            try:
                os.unlink(_lease_path(by_index[index]["uuid"]))
            except OSError:
                pass
        return {"indices": [], "problem": problem}

    if isinstance(want, list):
        for index in want:
            gpu = by_index.get(index)
            if gpu is None:
                return give_back("GPU %d does not exist (GPUs: %s)" % (
                    index, ", ".join(str(i) for i in sorted(by_index))))
            why = reason(gpu)
            if why and not allow_busy:
                return give_back("GPU %d is busy: %s (--allow-busy-gpus runs anyway)" % (
                    index, why))
            if not _take(gpu["uuid"], run_id, pids) and not allow_busy:
                return give_back("GPU %d was leased by another run just now" % index)
            taken.append(index)
        return {"indices": taken, "problem": None}
    candidates = [g for g in sorted(gpus, key=lambda g: g["index"]) if not reason(g)]
    count = len(candidates) if want == "free" else want
    for gpu in candidates:
        if len(taken) == count:
            break
        if _take(gpu["uuid"], run_id, pids):
            taken.append(gpu["index"])
    if not taken or len(taken) < count:
        # Asked again now (a lease file read per GPU, once): a run at the same moment may
        # have taken what was free a moment ago.
        busy = ["GPU %d %s" % (g["index"], why) for g in gpus
                if g["index"] not in taken and (why := reason(g))]
        return give_back("%s GPU(s) wanted, %d free of %d%s" % (
            "free" if want == "free" else count, len(taken), len(gpus),
            ": " + "; ".join(busy) if busy else ""))
    return {"indices": taken, "problem": None}


# -- the cluster address's interface ------------------------------------------------------------

SIOCGIFFLAGS, SIOCGIFADDR, IFF_LOOPBACK = 0x8913, 0x8915, 0x8


def _ioctl(sock, request, name):
    import fcntl
    try:
        return fcntl.ioctl(sock.fileno(), request, struct.pack("256s", name.encode()[:15]))
    except OSError:
        return None


def interface_of(address):
    """The name of the interface that holds `address` (a name: what it resolves to here), or
    None: an interface's own address (its first IPv4 one, or any IPv6 one), a loopback address
    (all of 127.0.0.0/8 is the loopback interface's), else what `ip` says where installed."""
    try:                                   # a name: the address it has here
        address = socket.getaddrinfo(socket_host(address), None,
                                     proto=socket.IPPROTO_TCP)[0][4][0]
    except (OSError, IndexError):
        return None
    if ":" in address:
        try:
            with open("/proc/net/if_inet6") as f:
                lines = f.read().splitlines()
            packed = socket.inet_pton(socket.AF_INET6, address).hex()
        except (OSError, ValueError):
            return None
        return next((line.split()[5] for line in lines
                     if len(line.split()) >= 6 and line.split()[0] == packed), None)
    loopback = address.startswith("127.")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            got = _ioctl(s, SIOCGIFADDR, name)
            if got is not None and socket.inet_ntoa(got[20:24]) == address:
                return name
            flags = _ioctl(s, SIOCGIFFLAGS, name)
            if loopback and flags is not None and \
                    struct.unpack("H", flags[16:18])[0] & IFF_LOOPBACK:
                return name
    ip = shutil.which("ip")
    if ip is None:
        return None
    try:
        done = subprocess.run([ip, "-o", "addr", "show", "to", address],
                              capture_output=True, text=True, timeout=TIMEOUT)
    except (OSError, subprocess.TimeoutExpired):
        return None
    fields = done.stdout.split()
    return fields[1].split("@")[0] if done.returncode == 0 and len(fields) > 1 else None
