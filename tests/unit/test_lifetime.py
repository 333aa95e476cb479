"""How a task's end bears on the run, by role (state/lifetime.py)."""
from __future__ import annotations

import pytest

from deploy.state import lifetime
from deploy.state.progress import TaskProgress


def ended(role: str, code: int | None, index: int = 0) -> TaskProgress:
    task = TaskProgress(index, "h", role=role, type_index=index)
    task.state, task.code = ("exited", code) if code is not None else ("lost", None)
    return task


@pytest.mark.parametrize("role, code, action", [
    ("chief", 0, lifetime.SUCCEED), ("chief", 1, lifetime.FAIL), ("chief", None, lifetime.FAIL),
    ("ps", 0, lifetime.FAIL), ("ps", 137, lifetime.FAIL),
    ("worker", 137, lifetime.TOLERATE), ("worker", 0, lifetime.TOLERATE),
    ("evaluator", 0, lifetime.REPORT), ("evaluator", 1, lifetime.REPORT),
])
def test_a_ps_cluster_ends_with_its_chief(role, code, action):
    assert lifetime.on_end(ended(role, code), roles=True) == action


def test_a_worker_only_cluster_fails_on_any_failure_as_before():
    assert lifetime.on_end(ended("worker", 3), roles=False) == lifetime.FAIL
    assert lifetime.on_end(ended("worker", None), roles=False) == lifetime.FAIL
    assert lifetime.on_end(ended("worker", 0), roles=False) == lifetime.CONTINUE


def test_no_worker_left_once_every_worker_ended():
    running = TaskProgress(1, "h", state="running", role="worker", type_index=1)
    tasks = [ended("chief", 0), ended("worker", 137, 0), running]
    assert not lifetime.no_worker_left(tasks)
    assert lifetime.no_worker_left([ended("chief", 0), ended("worker", 137, 0),
                                    ended("worker", 137, 1)])


def test_success_is_the_chiefs_with_roles_and_everyones_without():
    stopped = [ended("chief", 0), ended("worker", 143), ended("ps", 143), ended("evaluator", 0)]
    assert lifetime.succeeded(stopped, roles=True)
    assert not lifetime.succeeded([ended("chief", 1)] + stopped[1:], roles=True)
    assert not lifetime.succeeded([ended("worker", 0), ended("worker", 143, 1)], roles=False)
    assert lifetime.succeeded([ended("worker", 0), ended("worker", 0, 1)], roles=False)


def test_the_startup_watchdog_waits_for_the_chief_only_with_roles():
    assert lifetime.watched(ended("worker", 0), roles=False)
    assert not lifetime.watched(ended("ps", 0), roles=True)
    assert lifetime.watched(ended("chief", 0), roles=True)
