"""GPUs shared by a lab, on two sshd hosts: h1 has four GPUs, as the suite's own nvidia-smi
(tests/fakegpu, first on its PATH by sshd's SetEnv) reports them: GPU 1 held by a process of
the user `nobody` (a real one, started here with setpriv), GPU 2 without a utilisation
([N/A]), GPU 3 with most of its memory in use and no process listed. h2 has none. The tasks
are plain Python that print what they were given; the GPUs are the stand-in's only."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from procs import end, wait_until_gone
from sshlab import SshLab
from test_setup import SSHD_PATH

REPO = Path(__file__).resolve().parents[2]
FAKE = REPO / "tests" / "fakegpu" / "nvidia-smi"


def inv(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=REPO, text=True,
                          capture_output=True, timeout=300,
                          env={**os.environ, "COLUMNS": "300", **(env or {})})


def flat(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture(scope="module")
def gpu_lab(tmp_path_factory):
    base = tmp_path_factory.mktemp("gpulab")
    holder = subprocess.Popen(["setpriv", "--reuid=nobody", "--regid=nogroup",
                               "--clear-groups", "sleep", "600"], start_new_session=True)
    bindir = base / "h1-bin"
    bindir.mkdir()
    (bindir / "nvidia-smi").symlink_to(FAKE)
    tag = base.name        # GPU UUIDs of this lab alone: leases are host-wide
    gpus = [{"index": i, "uuid": f"GPU-{tag}-{i}", "name": "NVIDIA A100-SXM4-40GB",
             "memory_total": 40960, "memory_used": used, "utilization": use}
            for i, used, use in ((0, 3, 0), (1, 20480, 87), (2, 5, "[N/A]"), (3, 39000, 12))]
    (bindir / "nvidia-smi.json").write_text(json.dumps({"gpus": gpus, "apps": [
        {"pid": holder.pid, "uuid": f"GPU-{tag}-1", "used_memory": 20470, "name": "python3"}]}))
    try:
        with SshLab(base / "lab", first_octet=120) as lab:
            (h1,) = lab.start(1, setenv={"PATH": f"{bindir}:{SSHD_PATH}"})
            (h2,) = lab.start(1)
            yield lab, h1, h2, holder
    finally:
        end(holder)


def payload(tmp_path: Path, seconds: float = 0) -> Path:
    path = tmp_path / "payload"
    path.mkdir(exist_ok=True)
    (path / "train.py").write_text(
        "import json, os, time\n"
        "print(json.dumps({k: os.environ.get(k) for k in ('CUDA_VISIBLE_DEVICES', "
        "'NCCL_SOCKET_IFNAME', 'TF_FORCE_GPU_ALLOW_GROWTH', 'NCCL_DEBUG')}), flush=True)\n"
        f"time.sleep({seconds})\n")
    return path


def only_run(runs: Path) -> Path:
    (run_dir,) = [p for p in runs.iterdir() if p.is_dir()]
    return run_dir


def given(run_dir: Path) -> list[dict]:
    """What each task printed of its environment, by task index."""
    return [json.loads((run_dir / f"worker-{i}.log").read_text().splitlines()[0])
            for i in range(len(list(run_dir.glob("worker-*.log"))))]


def test_check_names_who_holds_each_gpu_and_a_host_without(gpu_lab, tmp_path):
    lab, h1, h2, holder = gpu_lab
    inventory = lab.write_inventory(tmp_path / "hosts.yaml", [h1, h2])
    done = inv("check", "--hosts", str(inventory))
    assert done.returncode == 0, done.stdout + done.stderr
    out = flat(done.stdout)
    assert "h1: GPU 0 NVIDIA A100-SXM4-40GB 3/40960 MiB 0% free" in out, out
    assert (f"h1: GPU 1 NVIDIA A100-SXM4-40GB 20480/40960 MiB 87% busy: held by nobody "
            f"(pid {holder.pid})") in out
    assert "h1: GPU 2 NVIDIA A100-SXM4-40GB 5/40960 MiB - free" in out
    assert ("h1: GPU 3 NVIDIA A100-SXM4-40GB 39000/40960 MiB 12% busy: 39000 of 40960 MiB in "
            "use, no process visible") in out
    assert "h2: no GPU (nvidia-smi not found on the PATH)" in out


def test_n_free_gpus_get_the_free_ones_and_their_memory_is_recorded(gpu_lab, tmp_path):
    lab, h1, _, _ = gpu_lab
    inventory = lab.write_inventory(tmp_path / "hosts.yaml", [h1], gpus=2,
                                    forward_env=["NCCL_*"])
    runs = tmp_path / "runs"
    done = inv("train", "--hosts", str(inventory), "--payload", str(payload(tmp_path, 6)),
               "--runs-dir", str(runs), env={"NCCL_DEBUG": "INFO"})
    assert done.returncode == 0, done.stdout + done.stderr
    run_dir = only_run(runs)
    assert given(run_dir) == [
        {"CUDA_VISIBLE_DEVICES": gpu, "NCCL_SOCKET_IFNAME": "lo",
         "TF_FORCE_GPU_ALLOW_GROWTH": "true", "NCCL_DEBUG": "INFO"} for gpu in ("0", "2")]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert [(t["gpu"], t["gpu_memory_peak_mib"]) for t in summary["tasks"]] == [("0", 3),
                                                                                ("2", 5)]
    assert "GPUs: h1 0, 2" in done.stdout
    plan = (run_dir / "plan.json").read_text()
    assert "INFO" not in plan                 # forwarded values are shown masked
    assert not list(Path("/tmp/tfdeploy-gpu-leases").glob(f"*{run_dir.name}*"))


def test_a_busy_listed_gpu_or_too_few_free_refuse_the_run_before_it_starts(gpu_lab, tmp_path):
    lab, h1, _, holder = gpu_lab
    runs = tmp_path / "runs"
    listed = lab.write_inventory(tmp_path / "listed.yaml", [h1], gpus=[1])
    refused = inv("train", "--hosts", str(listed), "--payload", str(payload(tmp_path)),
                  "--runs-dir", str(runs))
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert (f"h1 ({h1.address}): GPU 1 is busy: held by nobody (pid {holder.pid}) "
            f"(--allow-busy-gpus runs anyway)") in flat(refused.stdout)
    host_runs = Path(h1.workdir) / "runs"
    assert not runs.exists() and (not host_runs.exists() or not list(host_runs.iterdir()))

    three = lab.write_inventory(tmp_path / "three.yaml", [h1], gpus=3)
    refused = inv("train", "--hosts", str(three), "--payload", str(payload(tmp_path)),
                  "--runs-dir", str(runs))
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "3 GPU(s) wanted, 2 free of 4" in flat(refused.stdout)

    anyway = inv("train", "--hosts", str(listed), "--payload", str(payload(tmp_path)),
                 "--runs-dir", str(runs), "--allow-busy-gpus")
    assert anyway.returncode == 0, anyway.stdout + anyway.stderr
    run_dir = only_run(runs)
    assert given(run_dir)[0]["CUDA_VISIBLE_DEVICES"] == "1"


def test_runs_started_at_the_same_moment_never_share_a_gpu(gpu_lab, tmp_path):
    """Two controllers, each `gpus: 1` on h1, started together; five times over."""
    lab, h1, _, _ = gpu_lab
    inventory = lab.write_inventory(tmp_path / "hosts.yaml", [h1], gpus=1)
    work = payload(tmp_path, 2)
    for attempt in range(5):
        runs = [tmp_path / f"runs-{attempt}-{n}" for n in range(2)]
        controllers = [subprocess.Popen(
            [sys.executable, "-m", "invoke", "train", "--hosts", str(inventory), "--payload",
             str(work), "--runs-dir", str(r), "--no-check"], cwd=REPO, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for r in runs]
        try:
            outs = [c.communicate(timeout=180)[0] for c in controllers]
        finally:
            for c in controllers:
                end(c)
        assert [c.returncode for c in controllers] == [0, 0], outs
        got = sorted(given(only_run(r))[0]["CUDA_VISIBLE_DEVICES"] for r in runs)
        assert got == ["0", "2"], (attempt, outs)
        for r in runs:
            assert wait_until_gone(only_run(r).name, timeout=5) == []
