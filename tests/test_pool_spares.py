"""ConnectionPool's spares (4.x: handshaken connections waiting for new sessions) and its
connects (a host list, a caller who gave up, a shutdown), with fake connections; waits are for
events (`Spares.settle`, threading.Event), never for time to pass."""
import threading

import pytest
from fake_connections import SETTLE, FakeConnection, SharingConnection, make_pool
from ovos_bus_client.session import Session

from hivemind_chat_agent.client.abandonment import Abandonment, TurnAbandoned
from hivemind_chat_agent.client.config import ClientConfig
from hivemind_chat_agent.client.pool import ConnectionPool
from hivemind_chat_agent.errors import (
    AccessKeyRejectedError,
    AgentClosedError,
    HubUnreachableError,
    WrongPasswordError,
)

# ---- spares (4.x) ----

def spare_pool(count, factory=FakeConnection):
    return make_pool(factory, spare_connections=count, churn_guard=0)


def test_warm_up_fills_spares_and_a_new_session_claims_one_without_a_handshake():
    pool = spare_pool(3)
    try:
        pool.warm()
        assert pool.spares.settle(SETTLE) == 3 and len(FakeConnection.opened) == 3
        ready = pool.spares.ready()
        conn = pool.acquire(Session("new"))
        assert conn.session_id == "new" and conn in ready
        assert len(FakeConnection.opened) == 3          # claimed, not opened
        assert pool.spares.settle(SETTLE) == 2          # no refill while a turn holds one
        assert pool.spares.refilling and len(FakeConnection.opened) == 3
        pool.release(conn)
        assert pool.spares.settle(SETTLE) == 3 and len(FakeConnection.opened) == 4
        assert not pool.spares.refilling
        assert pool.acquire(Session("new")) is conn     # a known session keeps its own
    finally:
        pool.close_all()
    assert not any(c.alive for c in FakeConnection.opened)


def test_a_dead_spare_is_skipped_and_without_spares_a_session_connects():
    pool = spare_pool(1)
    try:
        pool.warm()
        assert pool.spares.settle(SETTLE) == 1
        FakeConnection.opened[0].alive = False          # the hub restarted meanwhile
        conn = pool.acquire(Session("a"))
        assert conn is not FakeConnection.opened[0] and conn.session_id == "a"
        pool.release(conn)
        assert pool.spares.settle(SETTLE) == 1          # finding none started a refill
        none = spare_pool(0)
        none.warm()                                     # connects, learns, keeps nothing
        proved = FakeConnection.opened[0]
        assert len(FakeConnection.opened) == 1 and len(none.spares) == 0 and not proved.alive
        assert none.sharing is False
        none.close_all()
    finally:
        pool.close_all()


def test_a_refill_stops_at_a_failure_and_the_next_new_session_starts_it_again():
    restarting = []

    class Flaky(FakeConnection):
        def connect(self):
            if restarting and self.session_id == "":      # spares fail while it restarts
                raise HubUnreachableError("the hub is restarting")
            return self
    pool = spare_pool(2, factory=Flaky)
    try:
        pool.warm()
        assert pool.spares.settle(SETTLE) == 2
        restarting.append(True)
        for sid in ("a", "b"):
            pool.release(pool.acquire(Session(sid)))
        assert pool.spares.settle(SETTLE) == 0
        assert not pool.spares.refilling                # gave up: no loop
        opened = len(FakeConnection.opened)
        assert pool.spares.settle(SETTLE) == 0 and len(FakeConnection.opened) == opened
        restarting.clear()
        pool.release(pool.acquire(Session("c")))    # finds none: connects, and refills
        assert pool.spares.settle(SETTLE) == 2
    finally:
        pool.close_all()


def test_warm_up_with_sharing_off_still_connects_and_raises_a_refusal():
    class Refused(FakeConnection):
        def connect(self):
            raise AccessKeyRejectedError("unknown key")
    pool = make_pool(Refused, share_connections=False)
    try:
        with pytest.raises(AccessKeyRejectedError):
            pool.warm()
    finally:
        pool.close_all()


def test_a_turn_during_warm_up_of_a_sharing_hub_joins_its_connection():
    claiming, proceed = threading.Event(), threading.Event()

    class SlowClaim(SharingConnection):
        def claim(self, session):
            claiming.set()
            assert proceed.wait(SETTLE)
            return super().claim(session)
    pool = spare_pool(0, factory=SlowClaim)
    got = []
    try:
        warming = threading.Thread(target=pool.warm)
        warming.start()
        assert claiming.wait(SETTLE)             # warm-up is claiming its shared connection
        turn = threading.Thread(target=lambda: got.append(pool.acquire(Session("early"))))
        turn.start()
        proceed.set()
        warming.join(SETTLE)
        turn.join(SETTLE)
        assert len(FakeConnection.opened) == 1 and got == [FakeConnection.opened[0]]
    finally:
        pool.close_all()


def test_a_sharing_hub_has_no_spares_and_warm_up_opens_the_shared_connection():
    pool = spare_pool(4, factory=SharingConnection)
    try:
        pool.warm()
        assert pool.spares.settle(SETTLE) == 0 and not pool.spares.refilling
        assert len(FakeConnection.opened) == 1 and pool.sharing is True
        assert pool.acquire(Session("x")) is FakeConnection.opened[0]
    finally:
        pool.close_all()


# ---- connecting ----

def test_a_host_list_is_tried_in_order_and_the_hub_that_answered_is_tried_first():
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
    started = threading.Event()

    def __init__(self, config, session):
        super().__init__(config, session)
        self.aborted = threading.Event()
        self.error = None

    def connect(self):
        SlowConnection.started.set()
        if not self.aborted.wait(SETTLE):
            return self
        raise self.error

    def abort_connect(self, error):
        self.error = error
        self.aborted.set()


def test_a_connect_for_a_caller_who_gave_up_is_dropped_or_aborted():
    """A front's caller who hangs up while its new conversation connects: a connect not begun
    is never started, one in progress is aborted, and nothing is filed in the pool."""
    SlowConnection.started.clear()
    pool = make_pool(SlowConnection)
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
        assert SlowConnection.started.wait(SETTLE), "the connect never began"
        connecting.give_up()
        worker.join(SETTLE)
        assert failed and FakeConnection.opened[0].aborted.is_set() and len(pool) == 0
    finally:
        pool.close_all()


def test_a_shutdown_aborts_a_connect_in_progress():
    SlowConnection.started.clear()
    pool = make_pool(SlowConnection)
    failed = []

    def acquire():
        try:
            pool.acquire(Session("a"))
        except AgentClosedError as e:
            failed.append(e)
    worker = threading.Thread(target=acquire)
    worker.start()
    assert SlowConnection.started.wait(SETTLE)
    pool.close_all()
    worker.join(SETTLE)
    assert failed and FakeConnection.opened[0].aborted.is_set()
