"""Task progress from agent answers: whole lines, metrics, loss agreement."""
from __future__ import annotations

import base64
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deploy.host.protocol import TaskStatus
from deploy.state.progress import MAX_PARTIAL, TaskProgress, losses_agree, parse_event


def chunk(data: bytes, offset: int, size: int, **status) -> dict:
    return {"data": base64.b64encode(data).decode(), "offset": offset, "size": size, **status}


def update(task: TaskProgress, answer: dict, **kw) -> tuple[bytes, list[str]]:
    """One answer as the controller takes it in: (its log bytes, the lines they complete).
    A host always says the state: the task's last one where `answer` does not."""
    data = base64.b64decode(answer["data"])
    fields = {k: v for k, v in answer.items() if k != "data"}
    status = TaskStatus(**{"state": task.state, **fields, "data": data})
    return data, task.update(status, **kw).all()


def feed_in_pieces(log: bytes, cuts: list[int], final_state: str = "exited") -> tuple[TaskProgress, list[str]]:
    """Send `log` as poll answers cut at `cuts`; the last answer says the task ended."""
    task = TaskProgress(0, "h")
    bounds = [0] + sorted(set(c for c in cuts if 0 < c < len(log))) + [len(log)]
    lines = []
    for n, (start, end) in enumerate(zip(bounds, bounds[1:])):
        last = n == len(bounds) - 2
        status = {"state": final_state, "code": 0} if last else {"state": "running"}
        lines += update(task, chunk(log[start:end], end, len(log), **status))[1]
    return task, lines


def test_lines_split_across_chunks_come_out_whole():
    task = TaskProgress(0, "a")
    raw, lines = update(task, chunk(b'hello\n{"event": "epoch", "epo', 28, 100, state="running"))
    assert raw == b'hello\n{"event": "epoch", "epo' and lines == ["hello"]
    assert task.partial == b'{"event": "epoch", "epo' and task.epoch is None
    _, lines = update(task, chunk(b'ch": 1, "loss": 0.5, "accuracy": 0.9}\nwor', 68, 100))
    assert lines == ['{"event": "epoch", "epoch": 1, "loss": 0.5, "accuracy": 0.9}']
    assert (task.epoch, task.loss, task.metrics) == (1, 0.5, {"loss": 0.5, "accuracy": 0.9})
    assert task.first_step and task.speaks_events
    assert task.state == "running" and not task.finished
    # The last line has no newline; it is shown once the task has ended and all is read.
    _, lines = update(task, chunk(b"ld", 70, 70, state="exited", code=0, started=1.0, ended=4.5))
    assert lines == ["world"]
    assert task.finished and not task.failed and task.duration == 3.5
    assert task.tail == ["hello", '{"event": "epoch", "epoch": 1, "loss": 0.5, "accuracy": 0.9}',
                         "world"]


def test_partial_line_waits_while_log_bytes_remain_unread():
    task = TaskProgress(0, "a")
    # Exited, but the agent has more log than it sent (offset < size): not finished yet.
    _, lines = update(task, chunk(b"abc\nde", 6, 10, state="exited", code=0))
    assert lines == ["abc"] and not task.finished and task.partial == b"de"
    _, lines = update(task, chunk(b"f\ngh", 10, 10))
    assert lines == ["def", "gh"] and task.finished and task.partial == b""
    # Nothing more to say afterwards.
    assert update(task, chunk(b"", 10, 10))[1] == []


def test_a_running_task_keeps_its_partial_line():
    task = TaskProgress(0, "a")
    assert update(task, chunk(b"no newline yet", 14, 14, state="running"))[1] == []
    assert update(task, chunk(b"", 14, 14, state="running"))[1] == []
    assert update(task, chunk(b"", 14, 14, state="lost"))[1] == ["no newline yet"]


def test_crlf_and_invalid_utf8_and_characters_split_between_chunks():
    snow = "☃".encode()
    log = b"dos line\r\n" + snow[:1]
    task = TaskProgress(0, "a")
    assert update(task, chunk(log, len(log), 20, state="running"))[1] == ["dos line"]
    rest = snow[1:] + b" ok\n\xff\xfe bad\n"
    assert update(task, chunk(rest, 20, 20, state="running"))[1] == ["☃ ok", "\ufffd\ufffd bad"]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["", "a", "epoch ☃", '{"event": "epoch", "epoch": 2, "loss": 1}',
                                 "x" * 30, "\r"]), max_size=8),
       st.booleans(), st.lists(st.integers(min_value=0, max_value=400), max_size=10))
def test_any_chunking_gives_the_same_lines(pieces, newline_at_end, cuts):
    text = "\n".join(pieces) + ("\n" if newline_at_end and pieces else "")
    log = text.encode()
    _, lines = feed_in_pieces(log, cuts)
    _, whole = feed_in_pieces(log, [])
    *whole_lines, partial = text.split("\n")
    # Whole lines lose a trailing \r; the final partial line (if any) is shown as it is.
    expected = [line.rstrip("\r") for line in whole_lines] + ([partial] if partial else [])
    assert lines == whole == expected


def test_tail_keeps_the_last_lines():
    task = TaskProgress(0, "a")
    log = "".join(f"line {i}\n" for i in range(100)).encode()
    update(task, chunk(log, len(log), len(log), state="running"), tail_lines=5)
    assert task.tail == [f"line {i}" for i in range(95, 100)]


def test_status_fields_and_failures():
    lost = TaskProgress(1, "b")
    update(lost, chunk(b"", 0, 0, state="lost", pid=123, started=2.0))
    assert lost.finished and lost.failed and lost.pid == 123 and lost.duration is None
    assert lost.name == "worker-1"
    crashed = TaskProgress(2, "b")
    update(crashed, chunk(b"", 0, 0, state="exited", code=3))
    assert crashed.finished and crashed.failed and crashed.code == 3
    pending = TaskProgress(3, "b")
    update(pending, {"state": "pending", "size": 0, "offset": 0, "data": ""})
    assert not pending.finished and not pending.failed
    running = TaskProgress(4, "b")
    update(running, chunk(b"", 0, 0, state="running"))
    update(running, chunk(b"", 0, 0))          # state carries over when an answer omits it
    assert running.state == "running" and not running.finished


def test_events_set_first_step_epoch_loss_and_metrics():
    task = TaskProgress(0, "a")
    log = "\n".join([
        "plain output",
        json.dumps({"event": "first_step", "task": 0}),
        json.dumps({"event": "epoch", "task": 0, "epoch": 1, "loss": 2, "acc": 0.1, "note": "x"}),
        json.dumps({"event": "epoch", "task": 0, "epoch": 2, "loss": 0.5, "acc": 0.7}),
        json.dumps({"event": "epoch", "task": 0, "epoch": 3, "loss": "n/a"}),
    ]).encode() + b"\n"
    update(task, chunk(log, len(log), len(log), state="running"))
    assert task.first_step and task.speaks_events
    assert task.losses == [2.0, 0.5] and task.loss == 0.5 and task.epoch == 3
    assert task.metrics == {}       # the last epoch line carried no numeric metric


def test_plain_output_does_not_count_as_events():
    task = TaskProgress(0, "a")
    update(task, chunk(b"Epoch 1/3 loss: 0.5\n{not json}\n", 30, 30, state="running"))
    assert not task.speaks_events and not task.first_step and task.losses == []


def test_parse_event_ignores_ordinary_output():
    assert parse_event('{"event": "first_step", "task": 0}') == {"event": "first_step", "task": 0}
    assert parse_event('  {"event": "epoch", "epoch": 1}  \r') == {"event": "epoch", "epoch": 1}
    for line in ("plain text", "{not json}", '{"no_event": 1}', "[1, 2]", "", "{", "}",
                 '"{}"', '{"event": 1', 'prefix {"event": "epoch"}', "{}", "null",
                 '{"event": "epoch"} trailing', "{'event': 'epoch'}"):
        assert parse_event(line) is None, line


def with_losses(*series):
    tasks = []
    for i, losses in enumerate(series):
        task = TaskProgress(i, "h")
        task.losses = list(losses)
        tasks.append(task)
    return tasks


@pytest.mark.parametrize("series, expected", [
    (([1.0, 0.5], [1.0, 0.5]), True),
    (([1.0, 0.5], [1.0, 0.5], [1.0, 0.5]), True),
    (([1.0, 0.5], [1.0, 0.5 + 1e-9]), True),            # within rel_tol
    (([1000.0], [1000.0 + 1e-4]), True),                # tolerance scales with the value
    (([1.0, 0.5], [1.0, 0.6]), False),
    (([1.0, 0.5], [1.0, 0.5], [1.0, 0.6]), False),
    (([1.0, 0.5], [1.0]), False),                       # a task that stopped early
    (([1e-9], [2e-9 + 1e-6]), False),
    (([1.0],), None),                                   # one task: nothing to compare
    (([], []), None),                                   # no losses printed
    ((), None),
])
def test_losses_agree(series, expected):
    assert losses_agree(with_losses(*series)) is expected


def test_a_nan_loss_does_not_agree_with_a_number():
    # JSON from Python's json.dumps(float('nan')) is NaN, which parse_event accepts.
    task = TaskProgress(1, "h")
    line = json.dumps({"event": "epoch", "epoch": 2, "loss": float("nan")}).encode() + b"\n"
    update(task, chunk(line, len(line), len(line), state="running"))
    task.losses = [1.0] + task.losses
    good = with_losses([1.0, 0.5])[0]
    assert losses_agree([good, task]) is False


def epoch_line(epoch: int, loss: float) -> str:
    return json.dumps({"event": "epoch", "task": 0, "epoch": epoch, "loss": loss})


def test_replaying_the_local_copy_then_reading_on_gives_what_one_reader_saw():
    log = ("\n".join(["start", epoch_line(1, 2.0), epoch_line(2, 1.0), "tail without"]) +
           " newline\n" + epoch_line(3, 0.5) + "\n").encode()
    whole, _ = feed_in_pieces(log, [])
    cut = log.index(b"tail without") + 4
    again = TaskProgress(0, "h")
    replayed = again.replay(log[:cut]).all()
    assert (again.offset, again.size) == (cut, cut)
    assert replayed == ["start", epoch_line(1, 2.0), epoch_line(2, 1.0)]
    _, rest = update(again, chunk(log[cut:], len(log), len(log), state="exited", code=0))
    assert rest == ["tail without newline", epoch_line(3, 0.5)]
    assert again.losses == whole.losses == [2.0, 1.0, 0.5] and again.epoch == 3


def test_a_resumed_attempt_replaces_the_losses_after_its_backup():
    task = TaskProgress(0, "h")
    task.replay(("\n".join([epoch_line(1, 2.0), epoch_line(2, 1.0), epoch_line(3, 0.9)]) +
                 "\n").encode())
    task.state, task.code, task.first_step = "exited", 3, True
    task.new_attempt()
    assert (task.state, task.code, task.first_step, task.offset) == ("pending", None, False,
                                                                      task.size)
    more = "\n".join([json.dumps({"event": "resumed", "task": 0, "epoch": 2}),
                      epoch_line(3, 0.7), ""]).encode()
    update(task, chunk(more, task.offset + len(more), task.offset + len(more), state="running"))
    assert task.losses == [2.0, 1.0, 0.7]


def test_a_flood_stays_one_block_and_every_event_is_taken_in():
    lines = [f"line {i:06d} " + "x" * 60 for i in range(50_000)]
    for n in range(1, 11):
        lines.insert(n * 4000, epoch_line(n, 1.0 / n))
    log = ("\n".join(lines) + "\n").encode()
    task = TaskProgress(0, "h")
    new = task.update(TaskStatus("running", offset=len(log), size=len(log), data=log))
    assert new.block == log and new.count == len(lines)
    assert new.events == [epoch_line(n, 1.0 / n) for n in range(1, 11)]
    assert task.losses == [1.0 / n for n in range(1, 11)] and task.epoch == 10
    assert new.last_lines(2) == lines[-2:] and task.tail == lines[-40:]
    assert new.all() == lines


def test_a_line_without_end_keeps_only_its_last_bytes_in_memory():
    task = TaskProgress(0, "h")
    bar = b"\r[=====>      ] 12/100" * 20_000           # a progress bar, never a newline
    for _ in range(5):
        update(task, chunk(bar, 0, 0, state="running"))
    assert len(task.partial) == MAX_PARTIAL and bar.endswith(task.partial[-len(bar) // 100:])
    _, lines = update(task, chunk(b" done\n", 0, 0, state="running"))
    assert len(lines) == 1 and lines[0].endswith("12/100 done")
