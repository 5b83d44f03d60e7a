"""ConnectionPool with fake connections and a fake clock (no sockets): the policy it chooses at
the first handshake (a connection per session, or shared ones), bounds, eviction, idle reaping,
pins, discard and shutdown. Spares and connecting: tests/test_pool_spares.py."""
from collections import Counter

import pytest
from fake_clock import FakeClock
from fake_connections import FakeConnection, SharingConnection, make_pool
from ovos_bus_client.session import Session

from hivemind_chat_agent.errors import AgentClosedError


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def pool(clock):
    p = make_pool(clock=clock, max_connections=2, idle_timeout=10)
    yield p
    p.close_all()


@pytest.fixture
def shared_pool(clock):
    p = make_pool(SharingConnection, clock=clock, max_connections=2, idle_timeout=10,
                  shared_connections=4)
    yield p
    p.close_all()


def open_sessions(pool, *sids):
    return {sid for sid in sids if pool.peek(sid) is not None}


# ---- the choice, at the first handshake ----

def test_the_policy_is_chosen_by_the_first_handshake(pool, shared_pool):
    assert pool.sharing is None and shared_pool.sharing is None and len(pool) == 0
    pool.release(pool.acquire(Session("a")))
    shared_pool.release(shared_pool.acquire(Session("a")))
    assert pool.sharing is False and shared_pool.sharing is True
    off = make_pool(SharingConnection, share_connections=False)
    assert off.sharing is False                      # sharing off: no handshake to wait for
    a, b = off.acquire(Session("a")), off.acquire(Session("b"))
    assert a is not b                                # a 5.x hub, yet a connection each
    off.close_all()


# ---- a connection per session (4.x) ----

def test_reuses_a_live_connection(pool):
    a = pool.acquire(Session("a"))
    pool.release(a)
    assert pool.acquire(Session("a")) is a
    assert len(FakeConnection.opened) == 1 == pool.connections_opened


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
    assert open_sessions(pool, "a", "b", "c") == {"a", "c"}
    assert not FakeConnection.opened[1].alive


def test_a_leased_connection_is_never_evicted(pool):
    a = pool.acquire(Session("a"))                    # a turn is about to start on it
    pool.release(pool.acquire(Session("b")))
    pool.release(pool.acquire(Session("c")))
    assert a.alive and open_sessions(pool, "a", "b", "c") == {"a", "c"}
    pool.release(a)


def test_a_pinned_connection_is_neither_evicted_nor_reaped(pool, clock):
    pool.release(pool.acquire(Session("a")))
    pool.pin("a")
    pool.pin("a")                                     # two listeners
    for sid in ("b", "c"):
        pool.release(pool.acquire(Session(sid)))
    assert open_sessions(pool, "a", "b", "c") == {"a", "c"}
    clock.advance(10)
    assert pool.reap_idle() == 1 and open_sessions(pool, "a", "c") == {"a"}
    pool.unpin("a")
    assert pool.reap_idle() == 0                      # one listener is left
    pool.unpin("a")
    assert pool.reap_idle() == 1 and len(pool) == 0


def test_over_bound_when_all_are_leased_then_trimmed_by_the_reaper(pool):
    leased = [pool.acquire(Session(s)) for s in "abc"]
    assert len(pool) == 3                             # nothing idle to close yet
    for conn in leased:
        pool.release(conn)
    pool.reap_idle()
    assert len(pool) == 2


def test_idle_connections_are_reaped_after_idle_timeout(pool, clock):
    pool.release(pool.acquire(Session("a")))
    clock.advance(9.9)
    assert pool.reap_idle() == 0
    clock.advance(0.1)
    assert pool.reap_idle() == 1 and len(pool) == 0


def test_idle_time_counts_from_the_last_turns_end(pool, clock):
    conn = pool.acquire(Session("a"))
    clock.advance(30)                                 # a long turn holds it
    assert pool.reap_idle() == 0
    pool.release(conn)
    clock.advance(9.9)
    assert pool.reap_idle() == 0 and conn.alive


def test_a_discarded_connection_is_closed_and_the_next_turn_connects(pool):
    a = pool.acquire(Session("a"))
    pool.release(a)
    pool.discard("a")
    assert not a.alive and pool.peek("a") is None
    assert pool.acquire(Session("a")) is not a


def test_closed_pool_refuses_and_closes_everything(pool):
    a = pool.acquire(Session("a"))
    pool.close_all()
    assert not a.alive
    pool.release(a)                                   # the turn ends after the shutdown
    with pytest.raises(AgentClosedError):
        pool.acquire(Session("b"))
    assert len(pool) == 0


# ---- shared connections (5.x) ----

def test_a_sharing_hub_carries_every_session_over_a_few_connections(shared_pool):
    """A new conversation joins an open connection (no handshake); another connection opens
    only while all are busy, up to shared_connections; a session stays where it was."""
    held = [shared_pool.acquire(Session(f"s{k}")) for k in range(100)]   # all in flight
    assert len(FakeConnection.opened) == 4 == len(shared_pool)
    assert max(Counter(map(id, held)).values()) <= 25
    for k, conn in enumerate(held):
        assert shared_pool.peek(f"s{k}") is conn
        shared_pool.release(conn)
    for k, conn in enumerate(held):
        again = shared_pool.acquire(Session(f"s{k}"))
        assert again is conn
        shared_pool.release(again)
    fresh = shared_pool.acquire(Session("new"))
    assert fresh in held and len(FakeConnection.opened) == 4
    shared_pool.release(fresh)


def test_another_shared_connection_opens_only_once_one_carries_16_turns(shared_pool):
    held = [shared_pool.acquire(Session(f"s{k}")) for k in range(16)]
    assert len(set(map(id, held))) == 1
    held.append(shared_pool.acquire(Session("s16")))
    assert held[-1] is not held[0] and len(shared_pool) == 2
    for conn in held:
        shared_pool.release(conn)


def test_one_idle_connection_serves_new_sessions_one_after_another(shared_pool):
    for k in range(50):
        shared_pool.release(shared_pool.acquire(Session(f"s{k}")))
    assert len(FakeConnection.opened) == 1


def test_discarding_a_shared_connection_waits_for_the_other_sessions_turns(shared_pool):
    a = shared_pool.acquire(Session("s1"))
    b = shared_pool.acquire(Session("s2"))
    assert a is b
    shared_pool.release(a)
    shared_pool.discard("s1")
    assert a.alive and shared_pool.peek("s2") is None   # s2's turn is still on it: retired
    fresh = shared_pool.acquire(Session("s1"))
    assert fresh is not a
    assert shared_pool.acquire(Session("s2")) is fresh  # no new turn joins the retired one
    shared_pool.release(fresh)
    shared_pool.release(b)
    assert not a.alive                                  # closed with its last turn
    shared_pool.release(fresh)


def test_shutdown_closes_a_retired_connection_a_turn_still_holds(shared_pool):
    a = shared_pool.acquire(Session("s1"))
    shared_pool.acquire(Session("s2"))
    shared_pool.discard("s1")
    shared_pool.close_all()
    assert not a.alive


def test_a_hub_that_mixes_up_sessions_falls_back_to_one_connection_each(shared_pool):
    first = shared_pool.acquire(Session("s1"))
    shared_pool.release(first)
    first.many_sessions = False                   # it answered a turn under another id
    again = shared_pool.acquire(Session("s1"))
    other = shared_pool.acquire(Session("s2"))
    assert again is not first and other is not again and not first.alive
    assert shared_pool.sharing is False and shared_pool.peek("s1") is again
    shared_pool.release(again)
    shared_pool.release(other)


def test_a_connection_a_turn_holds_closes_when_sharing_ends_with_its_turn(shared_pool):
    first = shared_pool.acquire(Session("s1"))
    first.many_sessions = False
    other = shared_pool.acquire(Session("s2"))
    assert other is not first and first.alive     # s1's turn is still on it
    shared_pool.release(first)
    assert not first.alive
    shared_pool.release(other)


def test_idle_shared_connections_are_reaped_unless_someone_listens(shared_pool, clock):
    conn = shared_pool.acquire(Session("s1"))
    shared_pool.release(conn)
    shared_pool.pin("s1")
    clock.advance(100)
    assert shared_pool.reap_idle() == 0 and conn.alive
    shared_pool.unpin("s1")
    assert shared_pool.reap_idle() == 1 and not conn.alive and len(shared_pool) == 0


