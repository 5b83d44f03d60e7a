"""`store_durable`: a turn's outcome is written and acknowledged by a Redis replica (WAIT 1)
before the hub says the turn answered. Against Debian's redis-server as a primary with a real
replica (`--replicaof`), and with that replica stopped: the write then fails within
DURABLE_WAIT_MS and the turn ends `store_unavailable`, though its sentences went out."""
import os
import time

import pytest
import redis
from servers import RedisServer
from test_conversation_store import Replica, Satellite
from waiting import wait_until

from hivemind_chat_agent.core.transcript import ANSWERED, Exchange
from hivemind_chat_agent.errors import ConfigurationError, ConversationStoreError
from hivemind_chat_agent.hub.redis_rounds import DURABLE_WAIT_MS
from hivemind_chat_agent.hub.settings import HubSettings
from hivemind_chat_agent.hub.stores import open_store


@pytest.mark.parametrize("value", ["true", 1, "yes", None, 0])
def test_store_durable_must_be_a_json_boolean(value):
    with pytest.raises(ConfigurationError, match="store_durable must be true or false"):
        HubSettings.from_dict({"engine": "x", "store_durable": value})
    assert HubSettings.from_dict({"engine": "x", "store_durable": True}).store_durable
    assert not HubSettings.from_dict({"engine": "x"}).store_durable


def test_the_memory_store_refuses_durable_mode(tmp_path):
    with pytest.raises(ConfigurationError, match="replica to wait for"):
        open_store("memory", 2, 256, 60, data_home=lambda: str(tmp_path), durable=True)


class PrimaryAndReplica:
    def __init__(self, directory):
        self.primary = RedisServer(os.path.join(directory, "primary"))
        self.replica = RedisServer(os.path.join(directory, "replica"),
                                   extra=("--replicaof", "127.0.0.1", str(self.primary.port)))

    def start(self):
        self.primary.start()
        self.replica.start()
        assert wait_until(self.synced, 30), "the replica never came online"
        return self

    def synced(self) -> bool:
        client = redis.Redis(port=self.primary.port, socket_timeout=2)
        try:
            return client.info("replication").get("connected_slaves", 0) >= 1 and \
                client.info("replication")["slave0"]["state"] == "online"
        finally:
            client.close()

    def stop(self):
        self.replica.stop()
        self.primary.stop()


@pytest.fixture
def pair(tmp_path):
    servers = PrimaryAndReplica(str(tmp_path)).start()
    yield servers
    servers.stop()


@pytest.mark.hub
def test_a_durable_write_is_on_the_replica_when_it_returns_and_fails_without_one(pair):
    store = open_store(pair.primary.url, 5, 4096, 60, data_home=lambda: "", durable=True)
    on_replica = redis.Redis(port=pair.replica.port, decode_responses=True)
    try:
        begun = store.begin("sat-ab12-kitchen", "t1", client="ab12")
        exchange = Exchange("hello", "hello there", ANSWERED)
        store.finish("sat-ab12-kitchen", "t1", exchange, ["hello there"], begun.history,
                     keep_exchange=True, client="ab12")
        # acknowledged: the replica has it now, not eventually
        assert on_replica.lrange("hivemind-chat:history:sat-ab12-kitchen", 0, -1) == [
            '["hello", "hello there", "answered"]']
        assert "done" in on_replica.get("hivemind-chat:turn:16:sat-ab12-kitchen:t1")
        pair.replica.stop()
        started = time.monotonic()
        with pytest.raises(ConversationStoreError) as failed:
            store.finish("sat-ab12-kitchen", "t2", exchange, ["hello there"], [exchange],
                         keep_exchange=True, client="ab12")
        took = time.monotonic() - started
        assert "replica's acknowledgement" in str(failed.value)
        assert DURABLE_WAIT_MS / 1000 * 0.9 <= took < DURABLE_WAIT_MS / 1000 + 1.5, took
        with pytest.raises(ConversationStoreError):
            store.record("sat-ab12-kitchen", exchange)
        with pytest.raises(ConversationStoreError):
            store.keep_session("sat-ab12-kitchen", {"session_id": "x"})
        assert store.begin("sat-ab12-kitchen", "").history      # reads need no replica
        plain = open_store(pair.primary.url, 5, 4096, 60, data_home=lambda: "")
        plain.record("sat-ab12-kitchen", exchange)                # nor does a plain store
        plain.close()
    finally:
        on_replica.close()
        store.close()


@pytest.mark.hub
def test_a_durable_hub_says_store_unavailable_for_an_answer_no_replica_acknowledged(
        pair, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    hub = Replica(pair.primary.url, tmp_path, Satellite(), store_durable=True)
    try:
        assert hub.ask("hello", turn_id="t-1") == ["hello there"]
        pair.replica.stop()
        said, failure = hub.ask("count 1", turn_id="t-2")
        assert said == "sentence 1"                              # it went out as it came
        assert failure["reason"] == "store_unavailable", failure
        assert "replica's acknowledgement" in failure["message"]
        pair.replica.start()
        assert wait_until(pair.synced, 30)
        assert hub.ask("hello", turn_id="t-3") == ["hello there"]
        assert hub.protocol.engine.asked == ["hello", "count 1", "hello"]
    finally:
        hub.close()


@pytest.mark.hub
@pytest.mark.parametrize("durable", [True, False], ids=["durable", "plain"])
def test_under_sentinel_a_failover_loses_no_durable_write_and_plain_ones_it_may(durable,
                                                                               tmp_path):
    """10 conversations written back to back while the replica lags (SIGSTOP, and the
    primary drops its replication link: it gets nothing more; on loopback a replica is
    otherwise never far enough behind to lose anything) and the primary then gets kill -9;
    the replica goes on (SIGCONT) and is promoted. Durable: every write that returned is in
    the promoted replica's history (those made while it lagged failed, and said so). Plain:
    writes acknowledged during the lag are gone, which is what a durable store is for."""
    import signal
    import threading

    from sentinels import SentinelSet
    sentinel = SentinelSet(str(tmp_path)).start()
    store = open_store(sentinel.url, 1000, 10 ** 7, 600, data_home=lambda: "", durable=durable)
    returned = {f"sat-c0de-{i}": [] for i in range(10)}
    stop, errors = threading.Event(), []
    writer = threading.Thread(target=_write, args=(store, returned, errors, stop), daemon=True)
    replica = sentinel.replica.process
    try:
        assert wait_until(sentinel.in_sync, 10)
        writer.start()
        assert wait_until(lambda: all(len(k) >= 20 for k in returned.values()), 30)
        before = sum(map(len, returned.values()))
        os.kill(replica.pid, signal.SIGSTOP)            # lags from now on
        primary = redis.Redis(port=sentinel.primary.port, socket_timeout=2)
        primary.client_kill_filter(_type="slave")       # what it had not sent stays there
        primary.close()
        assert wait_until(lambda: errors or sum(map(len, returned.values())) > before + 50, 10)
        sentinel.primary.kill()
        os.kill(replica.pid, signal.SIGCONT)
        stop.set()
        writer.join(30)
        plain = open_store(sentinel.url, 1000, 10 ** 7, 600, data_home=lambda: "")
        try:
            assert wait_until(lambda: _answers(plain), 90), "no promotion"
            lost = sum(len([e for e in kept if e not in plain.history(s)])
                       for s, kept in returned.items())
        finally:
            plain.close()
        print(f"{'durable' if durable else 'plain'} under Sentinel: "
              f"{sum(map(len, returned.values()))} writes returned, {len(errors)} failed, "
              f"{lost} of those returned lost in the failover")
        assert lost == 0 if durable else lost > 0
    finally:
        stop.set()
        if replica.poll() is None:
            os.kill(replica.pid, signal.SIGCONT)
        store.close()
        sentinel.stop()


def _write(store, returned, errors, stop) -> None:
    """Exchanges into each conversation in turn until `stop`: those whose write returned
    into `returned`, each failure into `errors`."""
    n = 0
    while not stop.is_set():
        for session, kept in returned.items():
            exchange = Exchange(f"turn {n}", "answered", ANSWERED)
            try:
                store.record(session, exchange)
                kept.append(exchange)
            except ConversationStoreError:
                errors.append(session)
        n += 1


def _answers(store) -> bool:
    try:
        store.record("sat-c0de-probe", Exchange("probe", "answered", ANSWERED))
        return True
    except ConversationStoreError:
        return False
