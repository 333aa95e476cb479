"""Bad input as a new user gives it, through `python -m invoke` as a user runs it: each case
must end with its exit status (2 for bad input, 1 where a host or run is at fault), a red
`error:` line, no Python traceback, an answer within 90 s, and, for `inv train`, the dry run
refusing exactly what the real run refuses. No hostile value may be executed.

The inventory's one host is 127.0.0.1 port 9, where nothing listens: a real run whose input
passed every check ends in a connection failure (exit 1), never in a run.

    python benchmarks/bad_inputs.py          # from the checkout; prints a line per case
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LIMIT = 90
SENTINEL = Path(tempfile.gettempdir()) / "tfdeploy-bad-input-executed"
HOST = "{name: a, address: 127.0.0.1, port: 9, workdir: /tmp/tfdeploy-bad-input}"
GOOD = f"hosts:\n  - {HOST}\n"


def inventory(body: str) -> dict:
    return {"hosts.yaml": body}


def host(**fields) -> dict:
    extra = "".join(f", {k}: {v}" for k, v in fields.items())
    return inventory(f"hosts:\n  - {HOST[:-1]}{extra}}}\n")


# name: (files to write in the lab, train flags, expected exit status)
TRAIN = {
    "inventory missing": ({}, ["--hosts", "nowhere.yaml"], 2),
    "inventory a directory": ({"inv.d/x": ""}, ["--hosts", "inv.d"], 2),
    "inventory empty": (inventory(""), [], 2),
    "inventory not yaml": (inventory("hosts: [\n"), [], 2),
    "inventory not utf-8": ({"hosts.yaml": b"hosts:\n  - name: \xff\n"}, [], 2),
    "inventory huge": ({"hosts.yaml": b"#" * (2 << 20)}, [], 2),
    "inventory nested deep": (inventory("a: " + "[" * 5000), [], 2),
    "inventory a list": (inventory("- a\n- b\n"), [], 2),
    "hosts empty": (inventory("hosts: []\n"), [], 2),
    "unknown field": (host(wrokers=2), [], 2),
    "workers typo": (host(workers=1000000000), [], 2),
    "workers zero": (host(workers=0), [], 2),
    "workers a string": (host(workers="two"), [], 2),
    "too many tasks": (inventory("hosts:\n" + "".join(
        f"  - {{name: h{i}, address: 127.0.0.{i + 2}, port: 9, workers: 128}}\n"
        for i in range(5))), [], 2),
    "too many hosts": (inventory("hosts:\n" + "".join(
        f"  - {{name: h{i}, address: 10.9.{i // 200}.{i % 200 + 1}}}\n"
        for i in range(600))), [], 2),
    "port out of range": (host(port=99999), [], 2),
    "bad host name": (inventory("hosts:\n  - {name: 'a;b', address: 127.0.0.1}\n"), [], 2),
    "workdir root": (host(workdir="/"), [], 2),
    "gpus twice": (host(gpus="[0, 0]"), [], 2),
    "env reserved": (host(env="{TF_CONFIG: x}"), [], 2),
    "env unset secret": (host(env="{TOKEN: '${TFDEPLOY_BAD_INPUT_UNSET}'}"), [], 2),
    "data missing": (host(data="{local: ./nowhere}"), [], 2),
    "data a file": ({**host(data="{local: ./afile}"), "afile": "x"}, [], 2),
    "data symlink out": ({**host(data="{local: ./shards}"), "shards/a": "1",
                          "shards/out": ("LINK", "/etc")}, [], 2),
    "payload missing": ({}, ["--payload", "nowhere"], 2),
    "payload a file": ({"afile": "x"}, ["--payload", "afile"], 2),
    "entry missing": ({}, ["--entry", "main.py"], 2),
    "entry outside": ({}, ["--entry", "../../../etc/passwd"], 2),
    "entry absolute": ({}, ["--entry", "/etc/passwd"], 2),
    "entry a directory": ({"payload/pkg/x.py": ""}, ["--entry", "pkg"], 2),
    "entry hostile": ({}, ["--entry", f";touch {SENTINEL}"], 2),
    "entry ignored": ({"payload/.tfdeployignore": "train.py\n"}, [], 2),
    "payload symlink out": ({"payload/etc": ("LINK", "/etc")}, [], 2),
    "ignore reversed range": ({"payload/.tfdeployignore": "*.log\n[z-a]\n"}, [], 2),
    "ignore unclosed bracket": ({"payload/.tfdeployignore": "data[\n"}, [], 2),
    "ignore bad class": ({"payload/.tfdeployignore": "[[:nope:]]\n"}, [], 2),
    "ignore trailing backslash": ({"payload/.tfdeployignore": "a\\\n"}, [], 2),
    "ignore not utf-8": ({"payload/.tfdeployignore": b"ok\n\xff\n"}, [], 2),
    "ignore huge": ({"payload/.tfdeployignore": b"*.x\n" * (300 << 10)}, [], 2),
    "keras 3 import": ({**host(workers=2), "payload/model.py": "import keras\n"}, [], 2),
    "runs dir a file": ({"afile": "x"}, ["--runs-dir", "afile"], 2),
    "runs dir under a file": ({"afile": "x"}, ["--runs-dir", "afile/runs"], 2),
    "grace inf": ({}, ["--grace", "inf"], 2),
    "grace nan": ({}, ["--grace", "nan"], 2),
    "grace negative": ({}, ["--grace=-1"], 2),
    "timeout huge": ({}, ["--connect-timeout", "1e309"], 2),
    "start timeout words": ({}, ["--start-timeout", "soon"], 2),
    "lost after negative": ({}, ["--lost-after=-5"], 2),
    "max fetch words": ({}, ["--max-fetch", "lots"], 2),
    "max fetch too small": ({}, ["--max-fetch", "1KiB"], 2),
    "restarts unicode digits": ({}, ["--restarts", "²"], 2),
    "restarts huge": ({}, ["--restarts", "9" * 5000], 2),
    "restarts with detach": ({}, ["--restarts", "1", "--detach"], 2),
    "args unbalanced": ({}, ["--args", '"unclosed'], 2),
    "args hostile": ({}, ["--args", f"$(touch {SENTINEL}) `touch {SENTINEL}`"], 1),
}

RUN = "20260101-000000-abcdef"
RECORD_CASES = {
    # name: (change to a good record's document, or raw bytes; command; exit status)
    "record not json": (b"{not json", ["status", "--run", RUN], 2),
    "record nested deep": (b"[" * 100000, ["status", "--run", RUN], 2),
    "record wrong version": ({"version": 99}, ["logs", "--run", RUN], 2),
    "record workers null": ({"hosts.0.workers": None}, ["status", "--run", RUN], 2),
    "record workdir root": ({"hosts.0.workdir": "/"}, ["down", "--run", RUN], 2),
    "record port a string": ({"hosts.0.target.port": "22"}, ["down", "--run", RUN], 2),
    "run id unknown": (None, ["status", "--run", "nope"], 2),
    "run id hostile": (None, ["down", "--run", "../../etc"], 2),
    "task out of range": (None, ["logs", "--task", "7"], 2),
    "task not a task's name": (None, ["logs", "--task", "x"], 2),
    "logs lost after words": (None, ["logs", "--lost-after", "soon"], 2),
    "down max fetch nan": (None, ["down", "--max-fetch", "nanGiB"], 2),
    "runs dir a file (inv runs)": (None, ["runs", "--runs-dir", "afile"], 2),
}


def write(lab: Path, files: dict) -> None:
    for name, content in files.items():
        path = lab / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, tuple):
            path.symlink_to(content[1])
        elif isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)


def invoke(lab: Path, args: list[str]) -> tuple[int, str, float]:
    started = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-m", "invoke", "-r", str(REPO), *args],
                              cwd=lab, capture_output=True, text=True, timeout=LIMIT,
                              env={**os.environ, "COLUMNS": "400"})
    except subprocess.TimeoutExpired:
        return -1, "no answer", LIMIT
    return done.returncode, done.stdout + done.stderr, time.monotonic() - started


def judged(name: str, code: int, out: str, took: float, expected: int) -> list[str]:
    problems = []
    if code != expected:
        problems.append(f"exit {code}, expected {expected}")
    if "Traceback" in out:
        problems.append("a traceback")
    if expected == 2 and "error:" not in out:
        problems.append("no error line")
    if took >= LIMIT:
        problems.append("no answer within 90 s")
    if SENTINEL.exists():
        problems.append("a hostile value was executed")
        SENTINEL.unlink()
    return problems


def error_line(out: str) -> str:
    lines = [line for line in out.splitlines() if line.startswith("error:")]
    return lines[0] if lines else out.strip().splitlines()[-1] if out.strip() else ""


def lab_with(root: Path, files: dict) -> Path:
    lab = Path(tempfile.mkdtemp(dir=root))
    shutil.copytree(REPO / "payload", lab / "payload")
    write(lab, {"hosts.yaml": GOOD, **files})
    return lab


def a_run(lab: Path) -> Path:
    """A record of a detached run on the lab's host (written as `inv train` writes one)."""
    sys.path.insert(0, str(REPO))
    from deploy.inventory.load import load_inventory
    from deploy.plan.planner import Options, plan_run
    from deploy.state.record import RunRecord, RunState, write_record
    plan = plan_run(load_inventory(lab / "hosts.yaml", {}), Options(), RUN,
                    {0: 20000})
    run_dir = lab / "runs" / plan.run_id
    run_dir.mkdir(parents=True)
    write_record(run_dir, RunRecord.of(plan, RunState.DETACHED, time.time(), controller_pid=None))
    return run_dir / "record.json"


def damaged(record: Path, change) -> None:
    if isinstance(change, bytes):
        record.write_bytes(change)
        return
    doc = json.loads(record.read_text())
    for path, value in change.items():
        *parents, last = path.split(".")
        where = doc
        for key in parents:
            where = where[int(key)] if isinstance(where, list) else where[key]
        where[last] = value
    record.write_text(json.dumps(doc))


def main() -> int:
    failed = 0
    total = 0
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for name, (files, flags, expected) in TRAIN.items():
            lab = lab_with(root, files)
            answers = []
            for dry in (["--dry-run"], []):
                code, out, took = invoke(lab, ["train", *flags, *dry, "--connect-timeout", "3"]
                                         if "--connect-timeout" not in flags else
                                         ["train", *flags, *dry])
                answers.append((code, out, took))
            (dcode, dout, dtook), (rcode, rout, rtook) = answers
            # A dry run of good input prints the plan (0); the real run then fails to connect.
            problems = judged(name, rcode, rout, rtook, expected)
            problems += judged(name, dcode, dout, dtook, 0 if expected == 1 else expected)
            if expected == 2 and error_line(dout) != error_line(rout):
                problems.append("the dry run says something else than the real run")
            total += 1
            failed += bool(problems)
            print(f"{'FAIL' if problems else 'ok  '} train: {name:28} exit {dcode}/{rcode} "
                  f"{max(dtook, rtook):5.1f}s  {error_line(rout)[:110]}"
                  + (f"  <- {'; '.join(problems)}" if problems else ""))
        for name, (change, args, expected) in RECORD_CASES.items():
            lab = lab_with(root, {"afile": "x"})
            record = a_run(lab)
            if change is not None:
                damaged(record, change)
            code, out, took = invoke(lab, [*args, "--connect-timeout", "3"]
                                     if args[0] != "runs" else args)
            problems = judged(name, code, out, took, expected)
            total += 1
            failed += bool(problems)
            print(f"{'FAIL' if problems else 'ok  '} {args[0]}: {name:28} exit {code} "
                  f"{took:5.1f}s  {error_line(out)[:110]}"
                  + (f"  <- {'; '.join(problems)}" if problems else ""))
    print(f"{total - failed} of {total} bad inputs answered as they must")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
