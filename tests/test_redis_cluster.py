"""The conversation store on a genuine Redis Cluster (tests/clusters.py: Debian's redis-server
with --cluster-enabled, joined by redis-cli --cluster create): conversations of clients whose
keys land on different nodes, every call within one slot (no node ever answers CROSSSLOT), a
primary's failover to its replica (through the plugin, and through a genuine 5.x hub and our
client), and two genuine 5.x hubs behind haproxy sharing the cluster."""
import json
import time

import pytest
from clusters import RedisClusterSet, SharedRedis
from test_conversation_store import Replica, Satellite
from waiting import wait_until

from hivemind_chat_agent.core.satellites import client_fingerprint
from hivemind_chat_agent.core.transcript import ANSWERED, Exchange
from hivemind_chat_agent.errors import ConversationStoreError
from hivemind_chat_agent.hub.redis_keys import conversation_tag, prefixer
from hivemind_chat_agent.hub.redis_store import RedisStore

pytestmark = pytest.mark.hub
FAILOVER_BOUND = 60.0    # seconds for a replica's promotion on a loaded machine (~2 s idle)


def refused(cluster: RedisClusterSet, kind: str) -> int:
    """How many commands the running nodes refused with `kind` (CROSSSLOT, MOVED ...)."""
    return sum(int(stats.get(f"errorstat_{kind}", {}).get("count", 0))
               for stats in cluster.errors().values())


def keys_on_three_nodes(cluster: RedisClusterSet, secret: bytes):
    """Three access keys whose clients' conversations live on three different primaries."""
    chosen, nodes = [], set()
    for i in range(200):
        key = f"key-{i}"
        node = cluster.node_of(prefixer(True)(f"sat-{client_fingerprint(secret, key)}-x"))
        if node not in nodes:
            chosen.append(key)
            nodes.add(node)
        if len(chosen) == 3:
            return chosen
    raise AssertionError("no three keys on three nodes")


def kill_the_conversations_primary(cluster: RedisClusterSet):
    """kill -9 of the primary holding the one conversation stored: its history key and that
    primary's port."""
    shared = SharedRedis(cluster.url, cluster)
    [history_key] = [k for k in shared.stored() if ":history:" in k]
    shared.close()
    return history_key, cluster.kill_primary_of(history_key)


@pytest.fixture
def cluster_shared(redis_cluster):
    shared = SharedRedis(redis_cluster.url, redis_cluster)
    shared.flush()
    yield shared
    shared.close()


def test_conversations_on_three_nodes_continue_on_another_hub_and_no_call_crosses_slots(
        cluster_shared, redis_cluster, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    probe = RedisStore(redis_cluster.url, 10, 32768, 600)
    keys = keys_on_three_nodes(redis_cluster, probe.secret())
    probe.close()
    hubs = {key: (Replica(redis_cluster.url, tmp_path, Satellite(peer=f"{key}::1", key=key)),
                  Replica(redis_cluster.url, tmp_path, Satellite(peer=f"{key}::2", key=key)))
            for key in keys}
    try:
        for key, (a, _b) in hubs.items():
            assert a.ask(f"note the {key} door", turn_id=f"{key}-t1") == ["noted"]
            assert a.ask("hello", turn_id=f"{key}-t2") == ["hello there"]
        for key, (_a, b) in hubs.items():      # the other hub: history, Session, records
            history = json.loads(b.ask("history")[0])
            assert [text for role, text in history if role == "user"] == [
                f"note the {key} door", "hello"]
            assert b.ask("notes") == [f"notes: the {key} door"]
            assert b.ask("count 9", turn_id=f"{key}-t2") == ["hello there"]   # its record
            assert b.protocol.engine.asked == ["history", "notes"]
        stored = cluster_shared.stored()
        by_client = {}
        for name in stored:
            if name.startswith("hivemind-chat:{"):
                tag = name.split("{", 1)[1].split("}", 1)[0]
                by_client.setdefault(tag, set()).add(cluster_shared.raw.keyslot(name))
        assert len(by_client) == 3 and all(len(slots) == 1 for slots in by_client.values())
        assert len({redis_cluster.node_of(f"{{{tag}}}") for tag in by_client}) == 3
        assert {n for n in stored if not n.startswith("hivemind-chat:{")} <= {
            "hivemind-chat:secret", *(f"hivemind-chat:alive:{r.protocol.store.owner}"
                                      for pair in hubs.values() for r in pair)}
        assert refused(redis_cluster, "CROSSSLOT") == 0
        assert refused(redis_cluster, "MOVED") == 0
    finally:
        for pair in hubs.values():
            for replica in pair:
                replica.close()


def test_a_client_at_its_caps_on_a_cluster_runs_its_scripts_in_its_slot(cluster_shared,
                                                                       redis_cluster):
    """The scripts (evicting sessions, making room for records) name keys from their tagged
    prefix: none leaves the slot of its KEYS."""
    store = RedisStore(redis_cluster.url, 2, 256, 60, max_sessions_per_client=2,
                       max_turn_records_per_client=4)
    try:
        for i in range(12):
            session = f"sat-c0ffee-s{i % 5}"
            begun = store.begin(session, f"t{i}", client="c0ffee")
            store.finish(session, f"t{i}", Exchange("q", "a", ANSWERED), ["a"], begun.history,
                         keep_exchange=True, client="c0ffee")
        assert len(cluster_shared.keys("history:*")) == 2
        assert len(cluster_shared.keys("turn:*")) <= 4
        assert conversation_tag("sat-c0ffee-s1") == "c0ffee"
        assert refused(redis_cluster, "CROSSSLOT") == 0
    finally:
        store.close()


@pytest.fixture
def replicated_cluster(request, tmp_path):
    """Three primaries with a replica each; "tls" as the test's parameter: every node on TLS
    too (and its cluster bus), the URL the rediss+cluster:// one trusting the test's CA."""
    tls = request.getfixturevalue("redis_tls") if getattr(request, "param", "") == "tls" \
        else None
    cluster = RedisClusterSet(str(tmp_path / "cluster"), masters=3, replicas=1, tls=tls).start()
    yield cluster
    cluster.stop()


def test_a_primarys_failover_loses_no_durable_exchange_and_the_conversation_continues(
        replicated_cluster):
    """kill -9 of the primary holding a conversation: every exchange a durable write
    returned from was acknowledged by the replica, and is there after its promotion, without
    waiting for the replica to catch up first; calls meanwhile fail with
    ConversationStoreError within the store's bounds, none hangs. The promoted replica has no
    replica of its own (its own was the primary killed), so durable writes are refused there
    until one is attached, and plain ones go on."""
    durable = RedisStore(replicated_cluster.url, 50, 10 ** 6, 600, durable=True)
    plain = RedisStore(replicated_cluster.url, 50, 10 ** 6, 600)
    session = "sat-feed01-kitchen"
    kept = []
    try:
        for i in range(5):
            kept.append(Exchange(f"before {i}", "answered", ANSWERED))
            durable.record(session, kept[-1])
        port = replicated_cluster.kill_primary_of(prefixer(True)(session))
        failed, slowest, answered_at = 0, 0.0, None
        killed = time.monotonic()
        while answered_at is None and time.monotonic() - killed < FAILOVER_BOUND:
            exchange = Exchange(f"after {failed}", "answered", ANSWERED)
            started = time.monotonic()
            try:
                plain.record(session, exchange)
                kept.append(exchange)
                answered_at = time.monotonic() - killed
            except ConversationStoreError as e:
                failed += 1
                assert "redis+cluster://" in str(e), e
                time.sleep(0.2)
            slowest = max(slowest, time.monotonic() - started)
        assert answered_at is not None, "no write succeeded since the kill"
        assert replicated_cluster.node_of(prefixer(True)(session)) != port
        history = plain.history(session)          # a failed write may be there too
        assert [e for e in history if e in kept] == kept, history   # none acknowledged lost
        assert slowest < 4 * 2.0 + 2, slowest
        with pytest.raises(ConversationStoreError, match="replica's acknowledgement"):
            durable.record(session, Exchange("no replica", "left", ANSWERED))
        print(f"cluster failover: written again {answered_at:.1f} s after the kill of the "
              f"primary; {failed} writes failed meanwhile, the slowest call {slowest:.2f} s")
    finally:
        durable.close()
        plain.close()


def test_two_genuine_hubs_behind_haproxy_share_a_conversation_on_the_cluster(redis_cluster,
                                                                           cluster_shared,
                                                                           tmp_path):
    from replicas import ReplicaSet, replica

    from hivemind_chat_agent import HiveMindChatAgent
    deployment = ReplicaSet(str(tmp_path),
                            hub=lambda _url, clients: replica(redis_cluster.url, clients)).start()
    try:
        agent = HiveMindChatAgent(deployment.agent_config(timeout=20))
        try:
            assert "Ada" in agent.get_response("my name is Ada", session_id="kitchen")
            first, second = deployment.hubs[0], deployment.add_replica()
            first.kill()
            assert deployment.wait_no_sessions(first)
            assert agent.get_response("what is my name", session_id="kitchen") == \
                "Your name is Ada."
            assert deployment.holder() is second
            assert wait_until(lambda: any(k.startswith("hivemind-chat:{") for k in
                                          cluster_shared.stored()), 5)
            assert refused(redis_cluster, "CROSSSLOT") == 0
        finally:
            agent.shutdown()
    finally:
        deployment.stop()


def test_a_conversation_through_the_plugin_survives_its_primarys_failover(replicated_cluster,
                                                                          tmp_path,
                                                                          monkeypatch):
    """The plugin (durable) takes two turns; the primary of the client's slot gets kill -9;
    another plugin instance's turns end store_unavailable until the replica is promoted, then
    answer from the conversation's history and Session."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    first = Replica(replicated_cluster.url, tmp_path, Satellite(), store_durable=True)
    try:
        assert first.ask("note the blue door", turn_id="t-1") == ["noted"]
        assert first.ask("hello", turn_id="t-2") == ["hello there"]
    finally:
        first.close()
    kill_the_conversations_primary(replicated_cluster)
    second = Replica(replicated_cluster.url, tmp_path, Satellite())
    try:
        failed, killed, replies = 0, time.monotonic(), None
        while time.monotonic() - killed < FAILOVER_BOUND:
            replies = second.ask("notes")
            if replies and isinstance(replies[0], str):
                break
            assert replies[0]["reason"] == "store_unavailable", replies
            failed += 1
            time.sleep(0.2)
        assert replies == ["notes: the blue door"], replies
        assert [text for role, text in json.loads(second.ask("history")[0])
                if role == "user"] == ["note the blue door", "hello", "notes"]
        print(f"through the plugin: answered from its history {time.monotonic() - killed:.1f} s "
              f"after the kill, {failed} turns store_unavailable meanwhile")
    finally:
        second.close()


@pytest.mark.parametrize("replicated_cluster", ["plain", "tls"], indirect=True)
def test_a_genuine_hub_answers_from_the_history_after_its_primarys_failover(
        replicated_cluster):
    """A genuine 5.x hub on the cluster, our client over its websocket: the primary holding
    the client's conversation gets kill -9 once its replica has caught up; its turns end with
    the store's failure (never a hang) until the replica is promoted, then answer from the
    history; with TLS the hub reaches every node only over it (rediss+cluster://). (With
    `store_durable` they would keep failing after the promotion, rightly: the promoted
    replica has no replica of its own to acknowledge a write.)"""
    from replicas import replica

    from hivemind_chat_agent import HiveMindChatAgent
    from hivemind_chat_agent.errors import ConversationStoreError
    hub = replica(replicated_cluster.url).start()
    try:
        agent = HiveMindChatAgent(hub.add_client(name="cluster").agent_config(timeout=20))
        try:
            assert "Ada" in agent.get_response("my name is Ada", session_id="kitchen")
            assert wait_until(replicated_cluster.in_sync, 10)
            history_key, port = kill_the_conversations_primary(replicated_cluster)
            failed, killed, answer = 0, time.monotonic(), None
            while answer is None and time.monotonic() - killed < FAILOVER_BOUND:
                started = time.monotonic()
                try:
                    answer = agent.get_response("what is my name", session_id="kitchen")
                except ConversationStoreError:        # store_unavailable
                    failed += 1
                    time.sleep(0.2)
                assert time.monotonic() - started < 25      # the turn's timeout, never more
            assert answer == "Your name is Ada.", answer
            assert replicated_cluster.node_of(history_key) != port
            print(f"a genuine hub answered from the history {time.monotonic() - killed:.1f} s "
                  f"after the kill; {failed} turns failed with the store meanwhile")
        finally:
            agent.shutdown()
    finally:
        hub.cleanup()


def test_the_store_is_not_ready_while_the_cluster_serves_no_longer_every_slot(tmp_path):
    """/readyz reads `ping`: with a primary gone and no replica to promote, every turn of its
    slots fails, while a PING to any other node still succeeds; `cluster_state` says so."""
    cluster = RedisClusterSet(str(tmp_path / "cluster"), masters=3).start()
    store = RedisStore(cluster.url, history_turns=10, history_bytes=32768, session_ttl=600)
    try:
        assert store.ping()
        cluster.nodes[-1].kill()
        assert wait_until(lambda: not store.ping(), FAILOVER_BOUND)
        assert not store.ping()
    finally:
        store.close()
        cluster.stop()
