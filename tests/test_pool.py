"""ConnectionPool bookkeeping with fake connections and a fake clock (no sockets)."""
import pytest
from ovos_bus_client.session import Session

from hivemind_chat_agent.client.config import ClientConfig
from hivemind_chat_agent.errors import AgentClosedError
from hivemind_chat_agent.client.pool import ConnectionPool


class FakeConnection:
    opened = []

    def __init__(self, config, session):
        self.session_id = session.session_id
        self.alive = True
        self.leases = 0
        self.last_used = 0.0
        FakeConnection.opened.append(self)

    def connect(self):
        return self

    def close(self):
        self.alive = False


class Clock:
    now = 0.0

    def __call__(self):
        return self.now


@pytest.fixture
def pool():
    FakeConnection.opened = []
    clock = Clock()
    config = ClientConfig.from_dict({"host": "127.0.0.1", "key": "k", "password": "p",
                                     "max_connections": 2, "idle_timeout": 10})
    p = ConnectionPool(config, factory=FakeConnection, clock=clock)
    p.clock = clock
    yield p
    p.close_all()


def test_reuses_a_live_connection(pool):
    a = pool.acquire(Session("a"))
    pool.release(a)
    assert pool.acquire(Session("a")) is a
    assert len(FakeConnection.opened) == 1


def test_dead_connection_is_replaced(pool):
    a = pool.acquire(Session("a"))
    pool.release(a)
    a.alive = False
    b = pool.acquire(Session("a"))
    assert b is not a and len(pool) == 1


def test_least_recently_used_idle_connection_is_evicted(pool):
    for sid in ("a", "b"):
        pool.release(pool.acquire(Session(sid)))
    pool.release(pool.acquire(Session("a")))          # "b" is now least recently used
    pool.release(pool.acquire(Session("c")))
    assert set(pool._conns) == {"a", "c"}
    assert not FakeConnection.opened[1].alive


def test_a_leased_connection_is_never_evicted(pool):
    a = pool.acquire(Session("a"))                    # a turn is about to start on it
    pool.release(pool.acquire(Session("b")))
    pool.release(pool.acquire(Session("c")))
    assert a.alive and "a" in pool._conns and "b" not in pool._conns
    pool.release(a)


def test_over_bound_when_all_are_leased_then_trimmed_by_the_reaper(pool):
    leased = [pool.acquire(Session(s)) for s in "abc"]
    assert len(pool) == 3                             # nothing idle to close yet
    for conn in leased:
        pool.release(conn)
    pool.reap_idle()
    assert len(pool) == 2


def test_idle_connections_are_reaped_after_idle_timeout(pool):
    pool.release(pool.acquire(Session("a")))
    pool.clock.now = 9.9
    assert pool.reap_idle() == 0
    pool.clock.now = 10.0
    assert pool.reap_idle() == 1 and len(pool) == 0


def test_closed_pool_refuses_and_closes_everything(pool):
    a = pool.acquire(Session("a"))
    pool.close_all()
    assert not a.alive
    with pytest.raises(AgentClosedError):
        pool.acquire(Session("b"))
