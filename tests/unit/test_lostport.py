"""A task that could not bind its port, recognised in its last log lines (run/lostport.py)."""
from __future__ import annotations

from deploy.run.lostport import lost_port
from deploy.state.progress import TaskProgress

# The end of a TensorFlow 2.21 worker whose port another process had bound first.
TENSORFLOW = [
    "E0000 00:00:1796291376.780618   19836 add_port.cc:83] Failed to add port to server: No "
    "address added out of total 1 resolved for '0.0.0.0:45149'",
    "E0000 00:00:1796291376.787716   19836 grpc_server_lib.cc:618] UNKNOWN: Could not start "
    "gRPC server",
    "Traceback (most recent call last):",
    "tensorflow.python.framework.errors_impl.UnknownError: Could not start gRPC server",
]


def ended_with(lines: list[str]) -> TaskProgress:
    task = TaskProgress(0, "h1")
    task.replay(("\n".join(lines) + "\n").encode())
    return task


def test_tensorflows_bind_failure_names_the_port():
    assert lost_port(ended_with(TENSORFLOW), planned=23456) == 45149


def test_without_the_port_in_the_log_the_planned_one_is_named():
    assert lost_port(ended_with(TENSORFLOW[1:]), planned=23456) == 23456
    python = ["Traceback (most recent call last):",
              "OSError: [Errno 98] Address already in use"]
    assert lost_port(ended_with(python), planned=23457) == 23457


def test_other_failures_are_not_a_lost_port():
    assert lost_port(ended_with(["crashing on purpose"]), planned=23456) is None
    assert lost_port(ended_with(["ValueError: port must be 0-65535"]), planned=1) is None
    assert lost_port(TaskProgress(0, "h1"), planned=23456) is None


def test_a_port_another_program_listens_on_is_not_free_and_one_left_in_time_wait_is():
    """What an in-place relaunch asks first (host/probe.py ports_free): a listener holds its
    port; a port whose last connection closed (TIME_WAIT, as a killed task's) is free, as it
    is for gRPC, which binds with SO_REUSEADDR."""
    import socket
    from deploy.host.probe import any_address_socket, ports_free
    listener, anywhere = any_address_socket()
    listener.bind((anywhere, 0))
    listener.listen()
    held = listener.getsockname()[1]
    spare, _ = any_address_socket()
    spare.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    spare.bind((anywhere, 0))
    spare.listen()
    ended = spare.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", ended))
    accepted, _ = spare.accept()
    accepted.close()                  # this side closes first: its end waits in TIME_WAIT
    client.close()
    spare.close()
    try:
        assert ports_free((held, ended)) == [ended]
    finally:
        listener.close()
