"""A compromised lab host: its `python:` is a wrapper that runs the real interpreter, but the
run's agent (started as `python -I -S -c BOOT`, deploy/plan/planner.py agent_command) first
runs `install()`, which patches deploy.host.agent as soon as the agent has loaded it from
memory. What it then does wrong is read from a mode file at each request, so a test changes
it between commands:

    archive   the chief's output archive carries hostile members (tests/hostile.py: the
              symlink chain that gets through tarfile's filter="data", files written through
              it, `..` names, links, a device, a fifo) aimed at a victim directory
    backup    the same, in the chief's backup archive, aimed from another host's backup dir,
              each hostile file listed as one of the backup's
    bomb      the chief's output archive is a gzip bomb (a file of zeros)
    big       the chief's output archive is 1 GiB of bytes that are not a tar.gz
    beat      once the run is followed, a heartbeat announces and sends a 1 GiB body
    state     every task's state is an OSC 52 clipboard write ended by ESC \\

Nothing here imports deploy: the agent loads its own package from memory.
"""
from __future__ import annotations

import json
import os
import stat
import sys
import threading
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parent
# The state a tampered host reports: a clipboard write (OSC 52), ended by ESC \ (ST).
ESCAPE_STATE = "\x1b]52;c;dGZkZXBsb3k=\x1b\\"
GiB = 1 << 30


class TamperedPython:
    """The wrapper and its files in `folder`; `config` is what install() reads: runs_dir (the
    controller's, for the output archive), backup_dest (the other host's workdir), victim,
    bomb (a file)."""

    def __init__(self, folder: Path, **config):
        folder.mkdir(parents=True, exist_ok=True)
        self.folder, self.python = folder, folder / "python"
        self.mode_file = folder / "mode"
        self.set()
        (folder / "config.json").write_text(json.dumps(
            {**{k: str(v) for k, v in config.items()}, "mode": str(self.mode_file)}))
        hook = (f"import sys; sys.path.insert(0, {str(TESTS)!r}); import tampered; "
                f"tampered.install({str(folder / 'config.json')!r})\n")
        self.python.write_text(
            f"#!{sys.executable}\n"
            "import os, sys\n"
            f"REAL, HOOK = {sys.executable!r}, {hook!r}\n"
            "args = sys.argv[1:]\n"
            "if args[:3] == ['-I', '-S', '-c']:       # the run's agent: tampered\n"
            "    args[3] = HOOK + args[3]\n"
            "os.execv(REAL, [REAL] + args)\n")
        self.python.chmod(stat.S_IRWXU)

    def set(self, *modes: str) -> None:
        self.mode_file.write_text(" ".join(modes))


def install(config_file: str) -> None:
    """In the agent, before its boot: patch deploy.host.agent once it is loaded."""
    config = json.loads(Path(config_file).read_text())

    class Path_(list):
        def insert(self, index, finder):
            loaded = finder.exec_module

            def exec_module(module):
                loaded(module)
                if module.__name__ == "deploy.host.agent":
                    tamper(module, config)
            finder.exec_module = exec_module
            list.insert(self, index, finder)
    sys.meta_path = Path_(sys.meta_path)


def modes(config) -> list[str]:
    try:
        return Path(config["mode"]).read_text().split()
    except OSError:
        return []


def tamper(agent, config) -> None:
    import hostile
    pack, statuses, follow = agent.archive.pack, agent.tasks.statuses, agent.tasks.follow
    pack_changed = agent.archive.pack_changed
    followed = threading.Event()

    def hostile_pack(folder, limits=None):
        honest = pack(folder, limits)
        run_id = os.path.basename(os.path.dirname(folder))
        now = modes(config)
        if folder.endswith("/output") and "archive" in now:
            dest = os.path.join(config["runs_dir"], run_id, "artifacts")
            return hostile.hostile_tar_gz(dest, os.path.relpath(config["victim"], dest), honest)
        if folder.endswith("/output") and "bomb" in now:
            return Path(config["bomb"]).read_bytes()
        return honest

    def hostile_pack_changed(folder, known, limits):
        """The backup's hostile members, each listed as if it were one of its files."""
        honest, files = pack_changed(folder, known, limits)
        if "backup" not in modes(config) or files is None:
            return honest, files
        run_id = os.path.basename(os.path.dirname(folder))
        dest = os.path.join(config["backup_dest"], "runs", run_id, "backup")
        body = hostile.hostile_tar_gz(dest, os.path.relpath(config["victim"], dest), honest)
        return body, dict(files, **hostile.listing(body))

    def hostile_statuses(*args, **kwargs):
        tasks = statuses(*args, **kwargs)
        if "state" in modes(config):
            for status, _ in tasks.values():
                status["state"] = ESCAPE_STATE
        return tasks

    def watched_follow(*args, **kwargs):
        followed.set()
        return follow(*args, **kwargs)

    def respond(request, channel, work):
        if request.get("verb") == "tar-out" and "big" in modes(config):
            return send_big(channel, {"id": request["id"]})
        return honest_respond(request, channel, work)

    def beat(channel, serving):
        while True:
            if followed.is_set() and "beat" in modes(config):
                send_big(channel, {"beat": time.time()})
            channel.send({"beat": time.time()})
            time.sleep(agent.BEAT)

    def send_big(channel, doc):
        """A frame announcing and sending 1 GiB, a piece at a time (this host holds none of
        it); a controller that refuses it closes the channel, and this agent ends."""
        piece = bytes(1 << 20)
        try:
            with channel.lock:
                channel.out.write(json.dumps(dict(doc, length=GiB)).encode() + b"\n")
                for _ in range(GiB // len(piece)):
                    channel.out.write(piece)
                channel.out.flush()
        except (OSError, ValueError):
            os._exit(0)
        return True

    honest_respond = agent.respond
    agent.archive.pack = hostile_pack
    agent.archive.pack_changed = hostile_pack_changed
    agent.tasks.statuses = hostile_statuses
    agent.tasks.follow = watched_follow
    agent.respond = respond
    agent.beat = beat
