"""The installed `tfdeploy` command: the same tasks as `inv` in this checkout, from any
directory, with the built-in inventory where there is no hosts.yaml."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from deploy.inventory.builtin import builtin_inventory
from deploy.inventory.load import load_inventory

REPO = Path(__file__).resolve().parents[2]
TFDEPLOY = Path(sys.executable).parent / "tfdeploy"


def tfdeploy(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    assert TFDEPLOY.is_file(), f"{TFDEPLOY} missing: install the project (pip install -e .)"
    return subprocess.run([str(TFDEPLOY), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "COLUMNS": "200"})


def test_the_command_lists_and_documents_the_tasks_outside_the_checkout(tmp_path):
    listed = tfdeploy(tmp_path, "--list")
    assert listed.returncode == 0, listed.stderr
    tasks = {line.split()[0] for line in listed.stdout.splitlines()[1:] if line.strip()}
    assert {"train", "check", "setup", "runs", "status", "logs", "down"} <= tasks
    helped = tfdeploy(tmp_path, "train", "--help")
    assert helped.returncode == 0 and "--hosts" in helped.stdout and "--payload" in helped.stdout


def test_without_a_hosts_file_the_built_in_inventory_is_used_and_named(tmp_path):
    done = tfdeploy(tmp_path, "train", "--dry-run", "--payload", str(REPO / "payload"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "using the built-in inventory (two workers on localhost)" in done.stdout
    assert "2 task(s) on 1 host(s)" in done.stdout
    assert not any(tmp_path.iterdir())          # a dry run writes nothing


def test_a_missing_inventory_given_by_name_is_refused(tmp_path):
    done = tfdeploy(tmp_path, "train", "--dry-run", "--hosts", "nowhere.yaml")
    assert done.returncode == 2 and "nowhere.yaml" in done.stdout
    assert "Traceback" not in done.stdout + done.stderr


def test_the_built_in_inventory_is_the_checkouts_default():
    assert builtin_inventory().hosts == load_inventory(REPO / "hosts.yaml").hosts


def test_max_fetch_takes_a_size_and_refuses_what_is_not_one():
    import pytest
    import tasks
    from deploy.errors import BadInput
    from deploy.host.archive import Limits
    assert tasks.fetch_limits("--max-fetch", "") == Limits()
    assert tasks.fetch_limits("--max-fetch", "500MiB").bytes == 500 << 20
    assert tasks.fetch_limits("--max-fetch", "32g").bytes == 32 << 30
    for bad in ("lots", "1KiB", "nanGiB", "infT", "-1GiB", "2000TiB"):
        with pytest.raises(BadInput, match="--max-fetch takes a size from 1MiB to 1024TiB"):
            tasks.fetch_limits("--max-fetch", bad)


def into_closed_pipe(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """`argv` run with its stdout a pipe whose reader has left, as `| head -1` leaves it once
    it has read its line; stderr captured."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(argv, cwd=cwd, stdout=write_end, stderr=subprocess.PIPE,
                              text=True, timeout=120)
    finally:
        os.close(write_end)


def test_output_cut_short_by_a_closed_pipe_ends_quietly_with_141(tmp_path):
    """`tfdeploy --help | head -1`, `tfdeploy runs | head -1`, `inv --list | head -1` in the
    checkout: the reader is gone before the command has said all; it ends as a program SIGPIPE
    ended (128 + 13), without a traceback, whether Invoke prints (help, the task list) or a
    task does, under the installed command or Invoke's own `inv`. (A bare `inv --help` is
    printed by Invoke before it reads tasks.py: out of this code's reach.)"""
    inv = Path(sys.executable).parent / "inv"
    runs = ["runs", "--runs-dir", str(tmp_path)]
    for program, cwd, helps in ((TFDEPLOY, tmp_path, [["--help"]]), (inv, REPO, [])):
        for args in (*helps, ["--list"], ["train", "--help"], runs):
            done = into_closed_pipe([str(program), *args], cwd)
            assert done.returncode == 141, (program.name, args, done.stderr)
            assert done.stderr == "", (program.name, args, done.stderr)


def test_a_broken_pipe_reaching_the_top_is_quiet_only_when_stdout_lost_its_reader(tmp_path):
    """closed_output_ends_quietly: Invoke's own help meeting `| head` exits 141 without a
    traceback; a BrokenPipeError of anything else (a socket's) keeps its traceback."""
    program = ("import sys; sys.path.insert(0, sys.argv[1])\n"
               "from deploy.run.signals import closed_output_ends_quietly\n"
               "closed_output_ends_quietly()\n"
               "print('usage ' * 20000)\n"              # larger than a pipe's buffer
               "raise BrokenPipeError(32, 'Broken pipe')\n")
    argv = [sys.executable, "-c", program, str(REPO)]
    gone = into_closed_pipe(argv, tmp_path)
    assert (gone.returncode, gone.stderr) == (141, "")
    kept = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert kept.returncode == 1 and "Traceback" in kept.stderr, kept.stderr
    assert "BrokenPipeError" in kept.stderr
