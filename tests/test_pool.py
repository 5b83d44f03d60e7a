"""ConnectionPool bookkeeping with fake connections and a fake clock (no sockets)."""
import time

import pytest
from ovos_bus_client.session import Session

from hivemind_chat_agent.client.config import ClientConfig
from hivemind_chat_agent.client.pool import ConnectionPool
from hivemind_chat_agent.errors import AgentClosedError


class FakeConnection:
    opened = []
    many_sessions = False          # a 4.x hub

    def __init__(self, config, session):
        self.session_id = session.session_id if session is not None else ""   # "": a spare
        self.useragent = f"fake-{len(FakeConnection.opened)}"
        self.alive = True
        self.leases = 0
        self.last_used = 0.0
        self.retired = False
        FakeConnection.opened.append(self)

    def connect(self):
        return self

    def claim(self, session):
        assert self.session_id == "" and self.alive
        self.session_id = session.session_id
        return self

    def confirm(self, timeout):
        pass

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


class SharingConnection(FakeConnection):
    many_sessions = True           # a 5.x hub: each message declares its Session

    def __init__(self, config, session):
        super().__init__(config, session)
        self.many_sessions = True


@pytest.fixture
def shared_pool():
    FakeConnection.opened = []
    clock = Clock()
    config = ClientConfig.from_dict({"host": "127.0.0.1", "key": "k", "password": "p",
                                     "max_connections": 2, "idle_timeout": 10,
                                     "shared_connections": 4})
    p = ConnectionPool(config, factory=SharingConnection, clock=clock)
    p.clock = clock
    yield p
    p.close_all()


def test_a_sharing_hub_carries_every_session_over_a_few_connections(shared_pool):
    """A new conversation joins an open connection (no handshake); another connection opens
    only while all are busy, up to shared_connections; a session stays where it was."""
    held = [shared_pool.acquire(Session(f"s{k}")) for k in range(100)]   # all in flight
    assert len(FakeConnection.opened) == 4 == len(shared_pool)
    assert max(c.leases for c in FakeConnection.opened) <= 25
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


def test_one_idle_connection_serves_new_sessions_one_after_another(shared_pool):
    for k in range(50):
        shared_pool.release(shared_pool.acquire(Session(f"s{k}")))
    assert len(FakeConnection.opened) == 1


def test_discarding_a_shared_connection_waits_for_the_other_sessions_turns(shared_pool):
    a = shared_pool.acquire(Session("s1"))
    b = shared_pool.acquire(Session("s2"))
    assert a is b and a.leases == 2
    shared_pool.release(a)
    shared_pool.discard("s1")
    assert a.alive and a.retired                  # s2's turn is still on it
    fresh = shared_pool.acquire(Session("s1"))
    assert fresh is not a
    shared_pool.release(b)
    assert not a.alive                            # closed with its last turn
    shared_pool.release(fresh)


def test_a_hub_that_mixes_up_sessions_falls_back_to_one_connection_each(shared_pool):
    first = shared_pool.acquire(Session("s1"))
    shared_pool.release(first)
    first.many_sessions = False                   # it answered a turn under another id
    again = shared_pool.acquire(Session("s1"))
    other = shared_pool.acquire(Session("s2"))
    assert again is not first and other is not again and not first.alive
    shared_pool.release(again)
    shared_pool.release(other)


def test_idle_shared_connections_are_reaped_unless_someone_listens(shared_pool):
    conn = shared_pool.acquire(Session("s1"))
    shared_pool.release(conn)
    shared_pool.pin("s1")
    shared_pool.clock.now = 100
    assert shared_pool.reap_idle() == 0 and conn.alive
    shared_pool.unpin("s1")
    assert shared_pool.reap_idle() == 1 and not conn.alive and len(shared_pool) == 0


def spare_pool(count, factory=FakeConnection):
    FakeConnection.opened = []
    config = ClientConfig.from_dict({"host": "127.0.0.1", "key": "k", "password": "p",
                                     "spare_connections": count, "churn_guard": 0})
    return ConnectionPool(config, factory=factory)


def settle(pool, count):
    deadline = time.monotonic() + 5
    while len(pool.spares) < count and time.monotonic() < deadline:
        time.sleep(0.01)
    return len(pool.spares)


def test_warm_up_fills_spares_and_a_new_session_claims_one_without_a_handshake():
    pool = spare_pool(3)
    try:
        pool.warm()
        assert settle(pool, 3) == 3 and len(FakeConnection.opened) == 3
        conn = pool.acquire(Session("new"))
        assert conn.session_id == "new" and conn in FakeConnection.opened[:3]
        assert len(FakeConnection.opened) == 3          # claimed, not opened
        assert len(pool.spares) == 2                    # no refill while a turn holds one
        time.sleep(0.3)
        assert len(pool.spares) == 2
        pool.release(conn)
        assert settle(pool, 3) == 3 and len(FakeConnection.opened) == 4
        assert pool.acquire(Session("new")) is conn     # a known session keeps its own
    finally:
        pool.close_all()
    assert not any(c.alive for c in FakeConnection.opened)


def test_a_dead_spare_is_skipped_and_without_spares_a_session_connects():
    pool = spare_pool(1)
    try:
        pool.warm()
        assert settle(pool, 1) == 1
        FakeConnection.opened[0].alive = False          # the hub restarted meanwhile
        conn = pool.acquire(Session("a"))
        assert conn is not FakeConnection.opened[0] and conn.session_id == "a"
        pool.release(conn)
        assert settle(pool, 1) == 1                     # finding none started a refill
        none = spare_pool(0)
        none.warm()                                     # connects, learns, keeps nothing
        proved = FakeConnection.opened[0]
        assert len(FakeConnection.opened) == 1 and len(none.spares) == 0 and not proved.alive
        none.close_all()
    finally:
        pool.close_all()


def test_a_refill_stops_at_a_failure_and_the_next_new_session_starts_it_again():
    from hivemind_chat_agent.errors import HubUnreachableError
    restarting = []

    class Flaky(FakeConnection):
        def connect(self):
            if restarting and self.session_id == "":      # spares fail while it restarts
                raise HubUnreachableError("the hub is restarting")
            return self
    pool = spare_pool(2, factory=Flaky)
    try:
        pool.warm()
        assert settle(pool, 2) == 2
        restarting.append(True)
        for sid in ("a", "b"):
            pool.release(pool.acquire(Session(sid)))
        deadline = time.monotonic() + 5
        while (len(pool.spares) or pool.spares._refilling) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(pool.spares) == 0 and not pool.spares._refilling   # gave up: no loop
        opened = len(FakeConnection.opened)
        time.sleep(0.3)
        assert len(FakeConnection.opened) == opened
        restarting.clear()
        pool.release(pool.acquire(Session("c")))    # finds none: connects, and refills
        assert settle(pool, 2) == 2
    finally:
        pool.close_all()


def test_warm_up_with_sharing_off_still_connects_and_raises_a_refusal():
    from hivemind_chat_agent.errors import AccessKeyRejectedError

    class Refused(FakeConnection):
        def connect(self):
            raise AccessKeyRejectedError("unknown key")
    FakeConnection.opened = []
    config = ClientConfig.from_dict({"host": "127.0.0.1", "key": "k", "password": "p",
                                     "share_connections": False})
    pool = ConnectionPool(config, factory=Refused)
    try:
        with pytest.raises(AccessKeyRejectedError):
            pool.warm()
    finally:
        pool.close_all()


def test_a_turn_during_warm_up_of_a_sharing_hub_joins_its_connection():
    import threading

    class SlowClaim(SharingConnection):
        def claim(self, session):
            time.sleep(0.3)
            return super().claim(session)
    pool = spare_pool(0, factory=SlowClaim)
    try:
        warming = threading.Thread(target=pool.warm)
        warming.start()
        time.sleep(0.1)                          # warm-up is claiming its shared connection
        conn = pool.acquire(Session("early"))
        warming.join(5)
        assert len(FakeConnection.opened) == 1 and conn is FakeConnection.opened[0]
    finally:
        pool.close_all()


def test_a_sharing_hub_has_no_spares_and_warm_up_opens_the_shared_connection():
    pool = spare_pool(4, factory=SharingConnection)
    try:
        pool.warm()
        time.sleep(0.2)
        assert len(FakeConnection.opened) == 1 and len(pool.spares) == 0
        assert pool.acquire(Session("x")) is FakeConnection.opened[0]
    finally:
        pool.close_all()


def test_a_host_list_is_tried_in_order_and_the_hub_that_answered_is_tried_first():
    from hivemind_chat_agent.errors import HubUnreachableError, WrongPasswordError
    down, tried = {"hub-a"}, []

    class ListedConnection(FakeConnection):
        def __init__(self, config, session):
            super().__init__(config, session)
            self.where = (config.host, config.port)

        def connect(self):
            tried.append(self.where)
            if self.where[0] in down:
                raise HubUnreachableError(f"{self.where[0]} is down")
            if self.where[0] == "hub-refusing":
                raise WrongPasswordError("wrong password")
            return self
    config = ClientConfig.from_dict({"host": ["ws://hub-a:5679", "hub-b:5680", "hub-c"],
                                     "port": 5678, "key": "k", "password": "p",
                                     "share_connections": False})
    assert config.hubs == (("hub-a", False, 5679), ("hub-b", False, 5680),
                           ("hub-c", False, 5678))
    assert (config.host, config.port) == ("hub-a", 5679)
    pool = ConnectionPool(config, factory=ListedConnection)
    assert pool.acquire(Session("s1")).where == ("hub-b", 5680)
    assert pool.acquire(Session("s2")).where == ("hub-b", 5680)    # no detour through a
    assert tried == [("hub-a", 5679), ("hub-b", 5680), ("hub-b", 5680)]
    down.update({"hub-b", "hub-c"})
    with pytest.raises(HubUnreachableError, match="hub-c is down"):    # the last one's
        pool.acquire(Session("s3"))
    pool.close_all()
    refusing = ClientConfig.from_dict({"host": ["hub-refusing", "hub-b"], "key": "k",
                                       "password": "p"})
    with pytest.raises(WrongPasswordError):       # a refusal is not passed on to the next
        ConnectionPool(refusing, factory=ListedConnection).acquire(Session("s4"))


class SlowConnection(FakeConnection):
    """A connect that lasts until it is aborted (HubConnection.abort_connect), as a 4.x
    hub's handshake does for a while."""

    def __init__(self, config, session):
        super().__init__(config, session)
        import threading
        self.started, self.aborted = threading.Event(), threading.Event()
        self.error = None

    def connect(self):
        self.started.set()
        if not self.aborted.wait(5):
            return self
        raise self.error

    def abort_connect(self, error):
        self.error = error
        self.aborted.set()


def test_a_connect_for_a_caller_who_gave_up_is_dropped_or_aborted():
    """A front's caller who hangs up while its new conversation connects: a connect not begun
    is never started, one in progress is aborted, and nothing is filed in the pool."""
    import threading

    from hivemind_chat_agent.client.abandonment import Abandonment, TurnAbandoned
    FakeConnection.opened = []
    config = ClientConfig.from_dict({"host": "127.0.0.1", "key": "k", "password": "p"})
    pool = ConnectionPool(config, factory=SlowConnection, clock=Clock())
    try:
        gone = Abandonment()
        gone.give_up()
        with pytest.raises(TurnAbandoned):
            pool.acquire(Session("never"), gone)
        assert FakeConnection.opened == []                     # not even created
        connecting = Abandonment()
        failed = []

        def acquire():
            try:
                pool.acquire(Session("aborted"), connecting)
            except TurnAbandoned as e:
                failed.append(e)
        worker = threading.Thread(target=acquire)
        worker.start()
        deadline = time.monotonic() + 5
        while not (FakeConnection.opened and FakeConnection.opened[0].started.is_set()):
            assert time.monotonic() < deadline, "the connect never began"
            time.sleep(0.01)
        connecting.give_up()
        worker.join(2)
        assert failed and FakeConnection.opened[0].aborted.is_set() and len(pool) == 0
    finally:
        pool.close_all()
