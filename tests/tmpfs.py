"""A small disk for a test: a tmpfs of a given size mounted on a directory, unmounted on the
way out even when the test fails. Mounting needs root; tests skip without it."""
from __future__ import annotations

import os
import subprocess
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest


@contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    """`size` as mount takes it (30m, 600m): a filesystem that fills up at that size."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs",
                              str(path)], capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        # Lazy: a process of a failed test still holding a file there cannot keep it mounted.
        subprocess.run(["umount", "-l", str(path)], check=True)
