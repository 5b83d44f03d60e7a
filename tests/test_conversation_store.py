"""The hub's conversation store: in memory, and on a real redis-server shared by two plugin
instances (replicas). The satellites are connection objects shaped as hivemind-core 5.x's,
recording what they are sent; no hub process (tests/test_hub_history.py has the real hubs)."""
import asyncio
import json
import time
from types import SimpleNamespace

import pytest
from ovos_bus_client.message import Message
from ovos_bus_client.session import SessionManager

from engines import ScriptEngine
from hivemind_chat_agent import ChatAgentProtocol
from hivemind_chat_agent.core.protocol_names import TURN_TAG_KEY
from hivemind_chat_agent.core.transcript import ANSWERED, Exchange
from hivemind_chat_agent.errors import ConfigurationError, ConversationStoreError
from hivemind_chat_agent.hub.stores import open_store
from servers import RedisServer


class Satellite:
    """What the plugin needs of a 5.x connection; `heard` keeps (type, data) of each reply."""

    def __init__(self, peer="sat::1::x::s", key="key-1"):
        self.noise_transport, self.peer, self.key = object(), peer, key
        self.heard = []

    def send(self, hive_message):
        self.heard.append((hive_message.payload.msg_type, hive_message.payload.data))


class Replica:
    """One ChatAgentProtocol with its IO loop run by the test thread."""

    def __init__(self, store_url, tmp_path, satellite, **config):
        self.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self.loop)
        self.satellite = satellite
        self.protocol = ChatAgentProtocol(
            config={"engine": "engines:ScriptEngine", "conversation_store": store_url,
                    **config},
            engine=ScriptEngine(), hm_protocol=SimpleNamespace(clients={satellite.peer:
                                                                         satellite}))

    def send(self, text, session_id="kitchen", turn_id=None):
        """Hand the plugin an utterance (with our client's turn id, if given)."""
        asyncio.set_event_loop(self.loop)
        self._start = len(self.satellite.heard)
        context = {"source": self.satellite.peer, "session": {"session_id": session_id}}
        if turn_id is not None:
            context[TURN_TAG_KEY] = turn_id
        self.protocol.bus.emit(Message("recognizer_loop:utterance", {"utterances": [text]},
                                       context))

    def finish(self):
        """The sentences (or the failure) answering the last utterance, once its end came."""
        asyncio.set_event_loop(self.loop)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            self.loop.run_until_complete(asyncio.sleep(0.01))
            replies = self.satellite.heard[self._start:]
            if replies and replies[-1][0] == "ovos.utterance.handled":
                return [data.get("utterance") or data for kind, data in replies[:-1]]
        raise AssertionError(f"no end: {self.satellite.heard[self._start:]}")

    def ask(self, text, session_id="kitchen", turn_id=None):
        self.send(text, session_id, turn_id)
        return self.finish()

    def close(self):
        self.protocol.shutdown()
        self.loop.close()
        asyncio.set_event_loop(None)


@pytest.fixture
def redis_server(tmp_path):
    server = RedisServer(str(tmp_path / "redis")).start()
    yield server
    server.stop()


@pytest.fixture
def replicas(redis_server, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    made = []

    def make(**config):
        made.append(Replica(redis_server.url, tmp_path, Satellite(), **config))
        return made[-1]
    yield make
    for replica in made:
        replica.close()


def test_a_conversation_continues_on_another_hub_sharing_the_redis_store(replicas):
    a, b = replicas(), replicas()
    assert a.ask("note the heater is on") and a.ask("hello") == ["hello there"]
    history = json.loads(b.ask("history")[0])
    assert history == [["user", "note the heater is on"], ["assistant", a.satellite.heard[0][1]
                                                           ["utterance"]],
                       ["user", "hello"], ["assistant", "hello there"]]
    for sid in [sid for sid in SessionManager.sessions if sid != "default"]:
        SessionManager.sessions.pop(sid)     # what another process would not have
    assert b.ask("notes") == ["notes: the heater is on"]   # the Session the hub kept, too
    assert json.loads(a.ask("history", session_id="hall")[0]) == []   # another session


def test_redis_bounds_each_conversation_and_every_key_expires(redis_server):
    import redis
    store = open_store(redis_server.url, 3, 256, 60, data_home=lambda: "unused")
    for i in range(5):
        store.record("s1", Exchange(f"question {i}", f"answer {i}", ANSWERED))
    assert [e.user for e in store.history("s1")] == ["question 2", "question 3", "question 4"]
    store.record("s1", Exchange("q", "x" * 230, ANSWERED))   # bytes: older ones make room
    assert [e.user for e in store.history("s1")] == ["question 4", "q"]
    store.keep_session("s1", {"session_id": "s1", "lang": "de-DE"})
    assert store.begin("s1", "").session["lang"] == "de-DE"
    assert store.begin("s2", "").session is None
    raw = redis.Redis.from_url(redis_server.url)
    raw.rpush("hivemind-chat:history:s1", "not json", json.dumps([1, 2, 3]))
    assert [e.user for e in store.history("s1")] == ["question 4", "q"]   # junk is skipped
    assert all(0 < raw.ttl(key) <= 60 for key in raw.keys("hivemind-chat:*")
               if not key.endswith(b"secret"))
    other = open_store(redis_server.url, 3, 256, 60, data_home=lambda: "unused")
    assert store.secret() == other.secret() and len(store.secret()) == 32
    store.close()
    other.close()


def test_a_redis_outage_fails_turns_with_the_reason_and_the_hub_recovers(redis_server,
                                                                         replicas):
    a = replicas()
    assert a.ask("hello") == ["hello there"]
    redis_server.stop()
    [failure] = a.ask("hello")
    assert failure["reason"] == "store_unavailable"
    assert f"127.0.0.1:{redis_server.port}" in failure["message"]
    redis_server.start()                       # same port, empty (no persistence here)
    assert a.ask("hello") == ["hello there"]
    assert json.loads(a.ask("history")[0]) == [["user", "hello"], ["assistant", "hello there"]]


def test_the_store_is_memory_or_a_redis_url(tmp_path):
    memory = open_store("memory", 2, 256, 60, data_home=lambda: str(tmp_path))
    for i in range(3):
        memory.record("s", Exchange(f"q{i}", "a", ANSWERED))
    assert [e.user for e in memory.history("s")] == ["q1", "q2"]
    memory.forget("s")
    assert memory.history("s") == [] and len(memory.secret()) == 32
    with pytest.raises(ConfigurationError, match="redis://HOST:PORT/DB"):
        open_store("mongodb://x", 2, 256, 60, data_home=lambda: str(tmp_path))


def test_a_store_error_names_the_store_without_its_password():
    store = open_store("redis://:hunter2@127.0.0.1:1/0", 2, 256, 60, data_home=lambda: "")
    with pytest.raises(ConversationStoreError) as failure:
        store.history("s")
    assert "hunter2" not in str(failure.value) and "127.0.0.1:1" in str(failure.value)


def test_a_repeated_turn_id_is_answered_from_its_record_on_another_hub(replicas):
    """The client resends a turn lost with its connection, same id, wherever it lands: the
    hub that gets it replays the first run's answer; the engine runs it once."""
    a, b = replicas(), replicas()
    assert a.ask("count 2", turn_id="t-1") == ["sentence 1", "sentence 2"]
    assert b.ask("count 2", turn_id="t-1") == ["sentence 1", "sentence 2"]
    assert a.protocol.engine.asked == ["count 2"] and b.protocol.engine.asked == []
    assert json.loads(b.ask("history")[0]) == [["user", "count 2"],
                                               ["assistant", "sentence 1\nsentence 2"]]
    assert b.ask("count 1", turn_id="t-2") == ["sentence 1"]     # a new id runs
    assert a.satellite.heard[-1] == ("ovos.utterance.handled", {"turn_records": True})


def test_a_turn_id_still_running_elsewhere_is_waited_for_not_run_again(replicas):
    a, b = replicas(), replicas()
    a.send("wait 1", turn_id="t-slow")
    time.sleep(0.3)                           # a is running it
    assert b.ask("wait 1", turn_id="t-slow") == ["done waiting"]
    assert a.finish() == ["done waiting"]
    assert a.protocol.engine.asked == ["wait 1"] and b.protocol.engine.asked == []


def test_a_turn_whose_owner_died_is_taken_over_and_run_again(replicas, redis_server):
    """A record left 'running' by a replica that is gone (its alive key lapsed)."""
    import redis
    from hivemind_chat_agent.hub.conversation_store import RUNNING, TurnRecord, record_to_json
    b = replicas()
    b.ask("hello")                             # the engine session id of this satellite
    [session_key] = [k for k in redis.Redis.from_url(redis_server.url).keys(
        "hivemind-chat:history:*")]
    session_id = session_key.decode().split("history:", 1)[1]
    raw = redis.Redis.from_url(redis_server.url)
    raw.set(f"hivemind-chat:turn:{session_id}:t-orphan", record_to_json(
        TurnRecord(RUNNING, "a-replica-that-died")))
    assert b.ask("count 2", turn_id="t-orphan") == ["sentence 1", "sentence 2"]
    assert b.protocol.engine.asked == ["hello", "count 2"]


@pytest.mark.parametrize("backend", ["memory", pytest.param("redis", marks=pytest.mark.hub)])
def test_a_turn_record_is_claimed_once_and_done_with_what_was_said(backend, tmp_path,
                                                                    request):
    from hivemind_chat_agent.hub.conversation_store import DONE, RUNNING
    url = request.getfixturevalue("redis_server").url if backend == "redis" else "memory"
    store = open_store(url, 2, 256, 60, data_home=lambda: str(tmp_path))
    begun = store.begin("s", "t1")
    assert begun.record is None and begun.history == []            # ours to run
    again = store.begin("s", "t1").record
    assert again.state == RUNNING and again.owner_alive            # its owner is this hub
    exchange = Exchange("count 2", "one\ntwo", ANSWERED)
    store.finish("s", "t1", exchange, ["one", "two"], begun.history, keep_exchange=True)
    done = store.turn_record("s", "t1")
    assert (done.state, done.sentences, done.ended) == (DONE, ["one", "two"], ANSWERED)
    assert store.history("s") == [exchange] and not store.take_over("s", "t1")
    store.close()


def test_the_memory_store_keeps_turn_records_bounded(tmp_path):
    from hivemind_chat_agent.hub.conversation_store import MemoryStore
    store = MemoryStore(2, 256, data_home=lambda: str(tmp_path))
    assert store.claim_turn("s", "t1") is None
    assert not store.take_over("s", "t1")
    for i in range(MemoryStore.MAX_TURN_RECORDS + 5):
        store.claim_turn("s", f"many-{i}")
    assert store.turn_record("s", "t1") is None                # the oldest went first


def test_redis_stopped_and_restarted_under_load_fails_turns_cleanly_then_nothing_is_wrong(
        redis_server, replicas):
    """Back-to-back turns of four conversations while Redis goes away for a second: each
    turn is answered or fails with store_unavailable (none hangs, none is answered wrongly),
    and once Redis is back every turn is answered and each conversation's history is its
    own."""
    import threading
    a = replicas()
    outage = threading.Timer(0.5, lambda: (redis_server.stop(), time.sleep(1.0),
                                           redis_server.start()))
    outage.start()
    answered = failed = 0
    deadline = time.monotonic() + 3.0
    i = 0
    while time.monotonic() < deadline:
        [reply] = a.ask(f"turn {i}", session_id=f"load-{i % 4}")
        if isinstance(reply, dict):
            assert reply["reason"] == "store_unavailable", reply
            failed += 1
        else:
            assert reply == f"you said turn {i}"
            answered += 1
        i += 1
    outage.join()
    assert answered and failed, (answered, failed)
    for n in range(8):
        assert a.ask(f"after {n}", session_id=f"load-{n % 4}") == [f"you said after {n}"]
    for s in range(4):
        history = json.loads(a.ask("history", session_id=f"load-{s}")[0])
        users = [text for role, text in history if role == "user"]
        assert users[-2:] == [f"after {s}", f"after {s + 4}"]
        assert all(int(u.split()[1]) % 4 == s for u in users if u.startswith("turn"))
