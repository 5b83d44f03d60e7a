"""Fake connections for the pool's tests (tests/test_pool.py, tests/test_pool_spares.py): what
ConnectionPool uses of a HubConnection, no socket; a fresh `make_pool` forgets the connections
the last one opened (`FakeConnection.opened`). They carry no pool state: the pool keeps its own."""
from fake_clock import FakeClock

from hivemind_chat_agent.client.config import ClientConfig
from hivemind_chat_agent.client.pool import ConnectionPool

SETTLE = 5.0     # seconds at most for the pool's threads (a spares refill) to reach a rest


class FakeConnection:
    opened = []
    many_sessions = False          # a 4.x hub

    def __init__(self, config, session):
        self.session_id = session.session_id if session is not None else ""   # "": a spare
        self.useragent = f"fake-{len(FakeConnection.opened)}"
        self.alive = True
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


class SharingConnection(FakeConnection):
    many_sessions = True           # a 5.x hub: each message declares its Session

    def __init__(self, config, session):
        super().__init__(config, session)
        self.many_sessions = True


def make_pool(factory=FakeConnection, clock=None, **settings):
    FakeConnection.opened = []
    config = ClientConfig.from_dict({"host": "127.0.0.1", "key": "k", "password": "p",
                                     **settings})
    return ConnectionPool(config, factory=factory, clock=clock or FakeClock())
