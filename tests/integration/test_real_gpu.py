"""On a machine with a real NVIDIA GPU (skipped where `nvidia-smi` is absent, as on this
project's own machines): `inv check` sees the GPU, and a short `inv train` with `gpus: 1` on a
localhost host places TensorFlow's ops on GPU:0, its memory growing as used. How to run it:
docs/testing.md."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.gpu


@pytest.fixture
def real_gpu():
    if shutil.which("nvidia-smi") is None:
        pytest.skip("no nvidia-smi here: no GPU to check on")


def inv(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=REPO, text=True,
                          capture_output=True, timeout=600)


def test_a_short_run_places_tensorflow_on_the_gpu_it_was_given(real_gpu, tmp_path):
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text("hosts:\n  - {name: local, transport: local, gpus: 1}\n")
    checked = inv("check", "--hosts", str(inventory))
    assert "GPU 0 " in checked.stdout, checked.stdout + checked.stderr
    payload = tmp_path / "payload"
    payload.mkdir()
    (payload / "train.py").write_text(
        "import json, os\n"
        "import tensorflow as tf\n"
        "x = tf.random.uniform((512, 512))\n"
        "y = tf.linalg.matmul(x, x)\n"
        "print(json.dumps({'device': y.device, 'gpus': len(tf.config.list_physical_devices("
        "'GPU')), 'visible': os.environ.get('CUDA_VISIBLE_DEVICES'), 'growth': "
        "os.environ.get('TF_FORCE_GPU_ALLOW_GROWTH')}))\n")
    runs = tmp_path / "runs"
    done = inv("train", "--hosts", str(inventory), "--payload", str(payload), "--runs-dir",
               str(runs), "--allow-busy-gpus")
    assert done.returncode == 0, done.stdout + done.stderr
    (run_dir,) = runs.iterdir()
    said = json.loads(next(line for line in (run_dir / "worker-0.log").read_text().splitlines()
                           if line.startswith("{")))
    assert said["device"].endswith("GPU:0") and said["gpus"] == 1, said
    assert said["growth"] == "true" and said["visible"] is not None
