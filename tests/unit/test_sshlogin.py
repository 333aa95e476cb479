"""The gateway pool: hosts behind the same gateways share one login, opened once even when
they connect at the same moment; a failure reaches every host that waited for it; the last
host to let go closes it."""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from deploy.transport.login import GatewayPool
from deploy.transport.base import LoginFailed


class FakeLogin:
    def __init__(self):
        self.is_connected, self.closed = True, False

    def close(self):
        self.is_connected, self.closed = False, True


def test_parallel_hosts_share_one_login_and_the_last_closes_it():
    pool, opened, lock = GatewayPool(), [], threading.Lock()

    def open_logins():
        time.sleep(0.05)               # the others arrive while this one opens
        with lock:
            opened.append([FakeLogin(), FakeLogin()])
        return opened[-1]

    with ThreadPoolExecutor(8) as workers:
        got = list(workers.map(lambda _: pool.acquire(("gw",), open_logins), range(8)))
    assert len(opened) == 1 and all(g is opened[0][-1] for g in got)
    for _ in range(7):
        pool.release(("gw",))
    assert not any(login.closed for login in opened[0])
    pool.release(("gw",))
    assert all(login.closed for login in opened[0]) and pool.open_count() == 0


def test_a_failure_reaches_the_waiting_hosts_once_and_a_later_host_tries_again():
    pool, attempts = GatewayPool(), []

    def failing():
        attempts.append(1)
        time.sleep(0.05)
        raise LoginFailed("gateway gw: cannot connect to port 22: Connection refused")

    with ThreadPoolExecutor(4) as workers:
        futures = [workers.submit(pool.acquire, ("gw",), failing) for _ in range(4)]
    for future in futures:
        with pytest.raises(LoginFailed, match="gateway gw: cannot connect"):
            future.result()
    assert len(attempts) < 4 and pool.open_count() == 0
    assert pool.acquire(("gw",), lambda: [FakeLogin()]).is_connected


def test_a_dropped_gateway_login_is_opened_again_and_other_gateways_are_apart():
    pool = GatewayPool()
    first = pool.acquire(("gw",), lambda: [FakeLogin()])
    first.is_connected = False
    second = pool.acquire(("gw",), lambda: [FakeLogin()])
    assert second is not first and first.closed
    other = pool.acquire(("gw2",), lambda: [FakeLogin()])
    assert other is not second and pool.open_count() == 2
