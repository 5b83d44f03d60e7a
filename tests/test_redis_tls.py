"""The conversation store over TLS (`rediss://`, hub/redis_urls.py), against Debian's
redis-server serving TLS with a certificate a CA made for the test signed: a genuine 5.x hub
that trusts that CA (`?ssl_ca_certs=`) keeps its conversations there; one that does not trust
it serves no turn from it, says why in its log and is not ready; and a TLS setting on a URL
without TLS stops the hub at its start. Sentinel and Cluster over TLS: tests/test_sentinel.py
and tests/test_redis_cluster.py, parametrized "tls"."""
import pytest
from replicas import replica
from servers import RedisServer
from test_hub_metrics import fetch
from waiting import wait_until

from hivemind_chat_agent import HiveMindChatAgent
from hivemind_chat_agent.errors import ConversationStoreError

pytestmark = pytest.mark.hub


@pytest.fixture
def tls_redis(tmp_path, redis_tls):
    """A redis-server on TLS (its plain port left for the test's own reads) and its CA file."""
    server = RedisServer(str(tmp_path / "redis"), tls=redis_tls).start()
    yield server, redis_tls[0]
    server.stop()


def test_a_hub_that_trusts_the_redis_ca_keeps_its_conversations_there_over_tls(tls_redis):
    server, ca = tls_redis
    hub = replica(f"rediss://127.0.0.1:{server.tls_port}/0?ssl_ca_certs={ca}").start()
    try:
        agent = HiveMindChatAgent(hub.add_client(name="tls").agent_config(timeout=20))
        try:
            assert "Ada" in agent.get_response("my name is Ada", session_id="kitchen")
            assert agent.get_response("what is my name",
                                      session_id="kitchen") == "Your name is Ada."
        finally:
            agent.shutdown()
        assert fetch(hub.health_port, "/readyz")[0] == 200
        import redis
        plain = redis.Redis(port=server.port, decode_responses=True)
        try:            # what the hub wrote over TLS is in this Redis
            assert any(":history:" in key for key in plain.keys("hivemind-chat:*"))
        finally:
            plain.close()
    finally:
        hub.cleanup()


def test_a_hub_that_does_not_trust_the_certificate_serves_no_turn_and_says_why(tls_redis):
    """Without `ssl_ca_certs` the certificate is checked against the system's CAs, which
    never signed it: nothing is read or written, each turn fails naming the store (the client
    is told it never ran), /readyz says store_unavailable, and the hub's log names the
    certificate, so the operator knows what to fix."""
    server, _ca = tls_redis
    hub = replica(f"rediss://127.0.0.1:{server.tls_port}/0").start()
    try:
        agent = HiveMindChatAgent(hub.add_client(name="untrusted").agent_config(timeout=20))
        try:
            with pytest.raises(ConversationStoreError):
                agent.get_response("my name is Ada", session_id="kitchen")
        finally:
            agent.shutdown()
        status, body = fetch(hub.health_port, "/readyz")
        assert status == 503 and '"reason": "store_unavailable"' in body
        assert wait_until(lambda: "certificate verify failed" in hub.logs().lower(), 10), \
            hub.logs()[-2000:]
    finally:
        hub.cleanup()


def test_a_tls_setting_on_a_url_without_tls_stops_the_hub_at_its_start(tls_redis):
    server, ca = tls_redis
    hub = replica(f"redis://127.0.0.1:{server.port}/0?ssl_ca_certs={ca}")
    try:
        with pytest.raises(RuntimeError) as refused:
            hub.start()
        assert "TLS settings but no TLS" in str(refused.value)
    finally:
        hub.cleanup()
