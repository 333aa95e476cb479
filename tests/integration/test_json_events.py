"""`--json`: `inv train`, `inv check` and `inv logs --follow` as a script reads them, on the
default local inventory: stdout is JSON lines only, one event each, and a run's stream ends with
its summary (deploy/state/events.py; docs/events.md). And `inv logs --task` by a task's name."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from procs import processes_of_run, wait_until_gone

REPO = Path(__file__).resolve().parents[2]


def inv(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "FORCE_COLOR")}
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


def events(stdout: str) -> list[dict]:
    """Every line of stdout as one JSON object with its event's name (a line that is not one
    fails the test)."""
    docs = [json.loads(line) for line in stdout.splitlines()]
    assert docs and all(isinstance(d, dict) and isinstance(d.get("event"), str) for d in docs)
    return docs


def test_train_json_is_json_lines_only_ending_with_the_summary(tmp_path):
    runs = tmp_path / "runs"
    done = inv("train", "--json", "--runs-dir", str(runs))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    docs = events(done.stdout)
    kinds = [d["event"] for d in docs]
    assert kinds[0] == "run_planned" and kinds[-1] == "run_summary"
    for kind in ("hosts_checked", "records_at", "pushed", "tasks_started", "task_output",
                 "task_progressed"):
        assert kind in kinds, kind
    run_id = docs[0]["run_id"]
    summary = docs[-1]
    assert summary["run_id"] == run_id and summary["exit_code"] == 0
    assert summary["losses_agree"] is True and summary["teardown_problems"] == []
    assert [(t["name"], t["state"], t["code"], t["epoch"]) for t in summary["tasks"]] == [
        ("worker-0", "exited", 0, 3), ("worker-1", "exited", 0, 3)]
    assert summary["summary"] == str(runs / run_id / "summary.json")
    # Each epoch of each task, as its log's event lines said it.
    epochs = {(d["task"], d["epoch"]) for d in docs
              if d["event"] == "task_progressed" and d["epoch"] is not None}
    assert {(f"worker-{i}", n) for i in (0, 1) for n in (1, 2, 3)} <= epochs
    assert "Traceback" not in done.stderr
    assert processes_of_run(run_id) == []


def test_check_json_is_one_report(tmp_path):
    done = inv("check", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    (report,) = events(done.stdout)
    assert report["event"] == "check_reported" and report["ok"] is True
    assert [h["host"] for h in report["hosts"]] == ["local"]
    assert report["problems"] == [] and report["hosts"][0]["problems"] == []


def test_logs_follow_json_takes_a_detached_run_to_its_summary(tmp_path):
    payload = tmp_path / "payload"
    payload.mkdir()
    (payload / "count.py").write_text(textwrap.dedent("""
        import json, os, time
        task = int(os.environ["TFDEPLOY_TASK_INDEX"])
        print(json.dumps({"event": "start", "task": task, "epochs": 3}), flush=True)
        for epoch in range(1, 4):
            time.sleep(1)
            print(json.dumps({"event": "epoch", "task": task, "epoch": epoch,
                              "loss": 1.0 / epoch}), flush=True)
    """))
    runs = tmp_path / "runs"
    started = inv("train", "--detach", "--no-check", "--payload", str(payload), "--entry",
                  "count.py", "--runs-dir", str(runs), "--json")
    assert started.returncode == 0, started.stdout + started.stderr
    detached = events(started.stdout)
    assert detached[-1]["event"] == "detached"
    run_id = detached[-1]["run_id"]
    try:
        followed = inv("logs", "--run", run_id, "--follow", "--json", "--runs-dir", str(runs))
        assert followed.returncode == 0, followed.stdout + followed.stderr
        docs = events(followed.stdout)
        assert docs[-1]["event"] == "run_summary" and docs[-1]["exit_code"] == 0
        lines = [line for d in docs if d["event"] == "task_output" for line in d["lines"]]
        assert sum('"event": "epoch"' in line for line in lines) == 6     # each line once
        # One task's log, named as its log file is, every line as written.
        one = inv("logs", "--run", run_id, "--task", "worker-1", "--verbose", "--runs-dir",
                  str(runs))
        assert one.returncode == 0, one.stdout + one.stderr
        assert one.stdout.count("[worker-1 local]") == 4 and "worker-0" not in one.stdout
    finally:
        if processes_of_run(run_id):
            inv("down", "--run", run_id, "--runs-dir", str(runs))
    assert wait_until_gone(run_id, 10) == []
