"""A host that answers garbage: a shell banner before the agent's frames, a foreign program in
the place of python, a frame announcing more bytes than any answer holds. Each gives an error
naming the host and quoting what came, never a traceback, and the controller holds nothing
more than the bounds allow."""
from __future__ import annotations

import dataclasses
import io
import stat
import sys
from pathlib import Path

import pytest

import hostpkg
from deploy.host.protocol import PollRequest, PortsRequest
from deploy.host.frames import MAX_CHUNK, FrameError, read_frame
from deploy.cluster.hostagent import StepFailed


def wrapper(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(stat.S_IRWXU)
    return str(path)


def test_a_banner_before_the_agent_is_quoted_with_the_host(tmp_path):
    python = wrapper(tmp_path, "python", f"echo 'Welcome to h!'\nexec {sys.executable} \"$@\"\n")
    host = dataclasses.replace(hostpkg.local_host(str(tmp_path / "work")), python=python)
    with hostpkg.LocalAgent(host) as agent:
        with pytest.raises(StepFailed) as failed:
            agent.ask(PortsRequest(1))
    message = str(failed.value)
    assert message.startswith("h: ") and "Welcome to h!" in message, message


def test_a_foreign_program_that_exits_is_named(tmp_path):
    python = wrapper(tmp_path, "python", "echo 'no python here' >&2\nexit 3\n")
    host = dataclasses.replace(hostpkg.local_host(str(tmp_path / "work")), python=python)
    with hostpkg.LocalAgent(host) as agent:
        with pytest.raises(StepFailed) as failed:
            agent.ask(PortsRequest(1))
    assert "no python here" in str(failed.value), failed.value


def test_a_frame_announcing_too_much_is_refused_before_it_is_read():
    header = b'{"tasks": {"0": {"state": "running", "length": %d}}}\n' % (MAX_CHUNK + 1)
    with pytest.raises(FrameError, match="bad length"):
        read_frame(io.BytesIO(header + b"x" * 10))
    huge_body = b'{"id": 1, "length": %d}\n' % (1 << 40)
    with pytest.raises(FrameError, match="bad length"):
        read_frame(io.BytesIO(huge_body))


def test_the_agent_still_serves_after_a_bad_request(tmp_path):
    with hostpkg.LocalAgent(hostpkg.local_host(str(tmp_path / "work"))) as agent:
        with pytest.raises(StepFailed, match="unknown request 'explode'"):
            agent.ask(hostpkg.Unchecked("explode"))
        with pytest.raises(StepFailed, match="not a tfdeploy run directory"):
            agent.ask(PollRequest(str(tmp_path), {"0": 0}))
        assert len(agent.ask(PortsRequest(2)).ports) == 2
