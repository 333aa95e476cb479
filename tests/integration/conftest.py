"""The integration tier: every test here is marked `integration` (real OpenSSH servers, host
agents as processes, git, TensorFlow; docs/testing.md, "Tiers")."""
from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items):
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.integration)
