import os
import sys
import threading

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from hubs import HubProcess  # noqa: E402

from hivemind_chat_agent import HiveMindChatAgent  # noqa: E402


@pytest.fixture(scope="session")
def hub():
    """One real hub for the tests that do not break it."""
    h = HubProcess().start()
    yield h
    h.cleanup()


@pytest.fixture(scope="session")
def creds(hub):
    return hub.add_client()


@pytest.fixture
def own_hub():
    """A hub of this test's own, which it may kill."""
    h = HubProcess().start()
    yield h
    h.cleanup()


@pytest.fixture
def make_agent():
    agents = []

    def make(config, **extra):
        agent = HiveMindChatAgent({**config, **extra})
        agents.append(agent)
        return agent
    yield make
    for agent in agents:
        agent.shutdown()


def agent_threads():
    return {t for t in threading.enumerate()
            if t.name.startswith("hivemind-chat") or "_send_ping" in t.name}
