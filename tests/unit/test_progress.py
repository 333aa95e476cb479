"""Task progress from agent answers: whole lines, metrics, loss agreement."""
from __future__ import annotations

import base64

from deploy.progress import TaskProgress, losses_agree, parse_event


def chunk(data: bytes, offset: int, size: int, **status) -> dict:
    return {"data": base64.b64encode(data).decode(), "offset": offset, "size": size, **status}


def test_lines_split_across_chunks_come_out_whole():
    task = TaskProgress(0, "a")
    _, lines = task.update(chunk(b'hello\n{"event": "epoch", "epo', 28, 100, state="running"))
    assert lines == ["hello"]
    _, lines = task.update(chunk(b'ch": 1, "loss": 0.5, "accuracy": 0.9}\nwor', 68, 100))
    assert lines == ['{"event": "epoch", "epoch": 1, "loss": 0.5, "accuracy": 0.9}']
    assert (task.epoch, task.loss, task.metrics) == (1, 0.5, {"loss": 0.5, "accuracy": 0.9})
    assert task.first_step and task.speaks_events
    # The last line has no newline; it is shown once the task has ended and all is read.
    _, lines = task.update(chunk(b"ld", 70, 70, state="exited", code=0, started=1.0, ended=4.5))
    assert lines == ["world"]
    assert task.finished and not task.failed and task.duration == 3.5


def test_lost_or_nonzero_tasks_are_failures():
    lost = TaskProgress(1, "b")
    lost.update(chunk(b"", 0, 0, state="lost"))
    assert lost.finished and lost.failed
    crashed = TaskProgress(2, "b")
    crashed.update(chunk(b"", 0, 0, state="exited", code=3))
    assert crashed.failed


def test_parse_event_ignores_ordinary_output():
    assert parse_event('{"event": "first_step", "task": 0}') == {"event": "first_step", "task": 0}
    for line in ("plain text", "{not json}", '{"no_event": 1}', "[1, 2]", ""):
        assert parse_event(line) is None


def with_losses(*series):
    tasks = []
    for i, losses in enumerate(series):
        task = TaskProgress(i, "h")
        task.losses = list(losses)
        tasks.append(task)
    return tasks


def test_losses_agree():
    assert losses_agree(with_losses([1.0, 0.5], [1.0, 0.5])) is True
    assert losses_agree(with_losses([1.0, 0.5], [1.0, 0.6])) is False
    assert losses_agree(with_losses([1.0, 0.5], [1.0])) is False
    assert losses_agree(with_losses([1.0])) is None
    assert losses_agree(with_losses([], [])) is None
