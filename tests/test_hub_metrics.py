"""The health endpoint of genuine hivemind-core 5.x hubs running the plugin with `health` on a
free loopback port: after turns of known outcomes the metrics read (with prometheus_client's own
parser) match exactly; `/readyz` follows a real redis-server going down and coming back; and a
real haproxy from config/haproxy.cfg sends no new satellite to a replica whose `/readyz` fails."""
import urllib.error
import urllib.request

import pytest
from hubs import HubProcess, free_port, plugin_config
from prometheus_client.parser import text_string_to_metric_families
from replicas import ReplicaSet, replica
from servers import RedisServer
from waiting import wait_until

from hivemind_chat_agent import HiveMindChatAgent
from hivemind_chat_agent.errors import HiveMindChatError

pytestmark = pytest.mark.hub


def fetch(port, path):
    """(status, body) of GET `path` on the health port."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError:
        return None, ""


def scrape(port):
    """{(sample name, sorted label items): value} of /metrics."""
    status, text = fetch(port, "/metrics")
    assert status == 200, text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def turns(got):
    return {dict(labels)["outcome"]: value for (name, labels), value in got.items()
            if name == "hivemind_chat_turns_total"}


def run(agent, text, session_id="metrics", stop_after_first=False):
    """One turn to its end (a failure's exception swallowed: its status says it)."""
    turn = agent.begin([{"role": "user", "content": text}], session_id=session_id)
    try:
        for _ in turn:
            if stop_after_first:
                turn.terminate()
                break
    except HiveMindChatError:
        pass
    return turn


@pytest.fixture(params=["memory", "redis"])
def store_settings(request, tmp_path):
    """The plugin's store settings: the memory store, or a real redis-server's."""
    if request.param == "memory":
        yield {}
        return
    redis = RedisServer(str(tmp_path / "redis")).start()
    try:
        yield {"conversation_store": redis.url}
    finally:
        redis.stop()


def test_turns_of_known_outcomes_are_counted_exactly(store_settings):
    """Turns, their histograms and the gauges on either store; the store's calls timed on
    Redis only (the memory store's are dictionary operations, not timed: docs/metrics.md)."""
    port = free_port()
    hub = HubProcess(plugin_config(timeout=2, health=f"127.0.0.1:{port}",
                                   **store_settings)).start()
    try:
        assert wait_until(lambda: fetch(port, "/readyz")[0] == 200, 30)
        agent = HiveMindChatAgent(hub.add_client().agent_config(timeout=20))
        try:
            assert run(agent, "hello").status.value == "answered"
            assert run(agent, "hello").status.value == "answered"
            assert run(agent, "empty").status.value == "not_understood"
            run(agent, "hang 4")                               # past the plugin's 2 s
            run(agent, "talk 30 0.3", stop_after_first=True)   # the satellite stops it
            assert run(agent, "raise").status.value == "failed"    # the engine raised
            # asked: no chat engine asks (docs/metrics.md); replayed: tests/test_replicas.py
            expected = {"answered": 2, "not_understood": 1, "timed_out": 1, "stopped": 1,
                        "asked": 0, "failed": 1, "replayed": 0}
            assert wait_until(lambda: turns(scrape(port)) == expected, 20), \
                turns(scrape(port))
            assert wait_until(lambda: scrape(port)[("hivemind_chat_turns_in_flight", ())]
                              == 0, 20)
            got = scrape(port)
            assert got[("hivemind_chat_turn_seconds_count", ())] == 6
            # hello, hello and the stopped talk spoke; empty and the hung turn never did
            assert got[("hivemind_chat_turn_first_sentence_seconds_count", ())] == 3
            timed = {dict(labels)["op"]: value for (name, labels), value in got.items()
                     if name == "hivemind_chat_store_seconds_count"}
            if store_settings:
                assert timed["begin"] == 6 and timed["finish"] == 6, timed
            else:
                assert timed == {}
            assert got[("hivemind_chat_store_errors_total", ())] == 0
            assert got[("hivemind_chat_sessions", ())] == 1
            assert got[("hivemind_chat_satellites", ())] == 1
        finally:
            agent.shutdown()
        assert wait_until(lambda: scrape(port)[("hivemind_chat_satellites", ())] == 0, 20)
    finally:
        hub.cleanup()
    assert wait_until(lambda: fetch(port, "/healthz")[0] is None, 20)   # gone with the hub


def test_readyz_follows_the_redis_store_down_and_back(tmp_path):
    redis = RedisServer(str(tmp_path / "redis")).start()
    port = free_port()
    hub = HubProcess(plugin_config(conversation_store=redis.url,
                                   health=f"127.0.0.1:{port}")).start()
    try:
        assert wait_until(lambda: fetch(port, "/readyz")[0] == 200, 30)
        redis.stop()
        assert wait_until(lambda: fetch(port, "/readyz")[0] == 503, 20)
        status, body = fetch(port, "/readyz")
        assert '"reason": "store_unavailable"' in body
        assert fetch(port, "/healthz")[0] == 200        # alive all the same
        assert scrape(port)[("hivemind_chat_store_errors_total", ())] >= 1
        redis.start()                                   # the same port, as a restart
        assert wait_until(lambda: fetch(port, "/readyz")[0] == 200, 20)
    finally:
        hub.cleanup()
        redis.stop()


def test_haproxy_sends_no_new_satellite_to_the_replica_whose_readyz_fails(tmp_path):
    """hub2's own Redis stops: its /readyz fails, haproxy takes it out of the balancing by the
    example's `option httpchk GET /readyz?not_ready=404` and `disable-on-404` (NOLB: no new
    connection, the open ones kept), and every new connection goes to hub1."""
    own = RedisServer(str(tmp_path / "redis2")).start()
    stores = iter([None, own.url])
    deployment = ReplicaSet(str(tmp_path),
                            hub=lambda url, clients: replica(next(stores) or url, clients))
    agents = []
    try:
        deployment.start()
        first = HiveMindChatAgent(deployment.agent_config(timeout=20))
        agents.append(first)
        assert "Ada" in first.get_response("my name is Ada", session_id="one")
        deployment.add_replica()          # counted UP: its /readyz answered haproxy's check
        own.stop()
        assert deployment.proxy.wait_until(lambda s: s["hub2"]["status"] == "NOLB"), \
            deployment.proxy.servers()
        before = deployment.proxy.servers()
        for i in range(4):                # new satellites: each a connection of its own
            agent = HiveMindChatAgent(deployment.agent_config(timeout=20))
            agents.append(agent)
            assert agent.get_response("hello", session_id=f"new-{i}")
        after = deployment.proxy.servers()
        assert after["hub2"]["total"] == before["hub2"]["total"]
        assert after["hub1"]["total"] >= before["hub1"]["total"] + 4
        own.start()
        assert deployment.proxy.wait_until(lambda s: s["hub2"]["status"] == "UP")
    finally:
        for agent in agents:
            agent.shutdown()
        deployment.stop()
        own.stop()
