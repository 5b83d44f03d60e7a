"""The whole tier under Redis Sentinel with no single Redis to lose (issue 27, parts 1 and 6):
two genuine 5.x replicas behind haproxy (config/haproxy.cfg), the conversations on
`redis+sentinel://`, and hivemind-core's client database (hivemind-redis-database, which
takes one HOST:PORT and cannot ask Sentinel) through a second haproxy that sends it to
whichever Redis says role:master (config/haproxy-redis.cfg). After `kill -9` of the primary
the conversation goes on, a satellite that connects afresh logs in, and a client registered
after the failover is one satellite on both replicas: the client database followed the
promotion. When the old primary comes back it says role:master for some seconds before
Sentinel makes it a replica: haproxy never lets it in meanwhile (its `rise`)."""
import os
import time

import pytest
from replicas import CONFIG, ReplicaSet, replica
from sentinels import SentinelSet
from servers import HAProxy
from waiting import wait_until

from hivemind_chat_agent import HiveMindChatAgent
from hivemind_chat_agent.errors import ConversationStoreError, HiveMindChatError

pytestmark = pytest.mark.hub
FAILOVER_BOUND = 90.0     # seconds for the promotion on a loaded machine (about 2-5 s idle)


@pytest.fixture
def tier(tmp_path):
    """The Sentinel set, the haproxy in front of its primary, and the replicas (not started)
    whose client database is behind that haproxy."""
    sentinel = SentinelSet(str(tmp_path / "sentinel")).start()
    primary = HAProxy(str(tmp_path / "haproxy-redis"), os.path.join(CONFIG, "haproxy-redis.cfg"),
                      [sentinel.primary.port, sentinel.replica.port])
    deployment = ReplicaSet(str(tmp_path / "tier"),
                            hub=lambda _url, _clients: replica(sentinel.url, primary))
    try:
        primary.start()
        assert primary.wait_until(lambda s: s["redis1"]["status"] == "UP" and
                                  s["redis2"]["status"] == "DOWN"), primary.servers()
        yield sentinel, primary, deployment
    finally:
        deployment.stop()
        primary.stop()
        sentinel.stop()


def answered_after_failover(agent_config, text, session_id):
    """`text` asked by a new satellite (a connection of its own: a fresh login) until it is
    answered; the errors meanwhile (the store failing over, a login the client database could
    not answer yet) are what a satellite retrying sees."""
    failures = []

    def ask():
        agent = HiveMindChatAgent(agent_config)
        try:
            return agent.get_response(text, session_id=session_id)
        except (ConversationStoreError, HiveMindChatError) as e:
            failures.append(type(e).__name__)
            return None
        finally:
            agent.shutdown()
    answer = wait_until(ask, FAILOVER_BOUND, poll=0.2)
    return answer, failures


def test_the_client_database_follows_the_primary_through_a_failover(tier):
    sentinel, primary, deployment = tier
    deployment.start()
    first = HiveMindChatAgent(deployment.agent_config(timeout=20))
    try:
        assert "Ada" in first.get_response("my name is Ada", session_id="kitchen")
        deployment.add_replica()
    finally:
        first.shutdown()
    assert wait_until(sentinel.in_sync, 10)
    sentinel.primary.kill()
    killed = time.monotonic()
    assert primary.wait_until(lambda s: s["redis2"]["status"] == "UP", FAILOVER_BOUND), \
        primary.servers()
    answer, failures = answered_after_failover(deployment.agent_config(timeout=20),
                                               "what is my name", "kitchen")
    assert answer == "Your name is Ada.", (answer, failures)
    login_after = time.monotonic() - killed
    # a client registered now is written to the promoted primary, and known to both replicas
    later = deployment.hubs[1].add_client(name="after-failover")
    for hub in deployment.hubs:
        agent = HiveMindChatAgent(dict(later.agent_config(timeout=20), port=hub.port))
        try:
            assert "Bo" in agent.get_response("my name is Bo", session_id="later")
        finally:
            agent.shutdown()
    # the old primary back, as after a reboot: a master in its own eyes until Sentinel's
    # conversion, and never counted up by haproxy while it is one (never promoted either:
    # SentinelSet.bring_back_primary says why)
    sentinel.bring_back_primary()
    both, until = set(), time.monotonic() + 25
    while time.monotonic() < until:
        servers = primary.servers()
        both.add(servers["redis1"]["status"])
        assert servers["redis2"]["status"] == "UP" and servers["redis1"]["status"] != "UP", \
            servers
        time.sleep(0.2)
    agent = HiveMindChatAgent(later.agent_config(timeout=20))
    try:
        assert agent.get_response("what is my name", session_id="later") == "Your name is Bo."
    finally:
        agent.shutdown()
    counted = max((int(s.split()[1].split("/")[0]) for s in both if "/" in s), default=0)
    print(f"a fresh login answered {login_after:.1f} s after the kill ({len(failures)} tries "
          f"failed first); the old primary back said master for {counted} checks in a row")
