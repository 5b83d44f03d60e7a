"""The hub's conversation store: in memory, and on a real redis-server shared by two plugin
instances (replicas); the tests marked BOTH (and the "cluster" backend) also on a real Redis
Cluster of three primaries (tests/clusters.py), their assertions the same for both layouts.
The satellites are connection objects shaped as hivemind-core 5.x's, recording what they are
sent; no hub process (tests/test_hub_history.py has the real hubs)."""
import asyncio
import json
from types import SimpleNamespace

import pytest
from engines import ScriptEngine
from ovos_bus_client.message import Message
from ovos_bus_client.session import SessionManager
from waiting import wait_until

from hivemind_chat_agent import ChatAgentProtocol
from hivemind_chat_agent.core.protocol_names import TURN_TAG_KEY
from hivemind_chat_agent.core.transcript import ANSWERED, Exchange
from hivemind_chat_agent.errors import ConfigurationError, ConversationStoreError
from hivemind_chat_agent.hub.conversation_store import exchanges_from_json
from hivemind_chat_agent.hub.stores import open_store


class Satellite:
    """What the plugin needs of a 5.x connection; `heard` keeps (type, data) of each reply."""

    def __init__(self, peer="sat::1::x::s", key="key-1"):
        self.noise_transport, self.peer, self.key = object(), peer, key
        self.heard = []

    def send(self, hive_message):
        self.heard.append((hive_message.payload.msg_type, hive_message.payload.data))


class Replica:
    """One ChatAgentProtocol with its IO loop run by the test thread."""

    def __init__(self, store_url, tmp_path, satellite, clock=None, **config):
        self.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self.loop)
        self.satellite = satellite
        self.protocol = ChatAgentProtocol(
            config={"engine": "engines:ScriptEngine", "conversation_store": store_url,
                    **config},
            engine=ScriptEngine(), hm_protocol=SimpleNamespace(clients={satellite.peer:
                                                                         satellite}),
            clock=clock)

    def send(self, text, session_id="kitchen", turn_id=None):
        """Hand the plugin an utterance (with our client's turn id, if given)."""
        asyncio.set_event_loop(self.loop)
        self._start = len(self.satellite.heard)
        context = {"source": self.satellite.peer, "session": {"session_id": session_id}}
        if turn_id is not None:
            context[TURN_TAG_KEY] = turn_id
        self.protocol.bus.emit(Message("recognizer_loop:utterance", {"utterances": [text]},
                                       context))

    def pump_until(self, condition, timeout=10.0):
        """Run this replica's event loop (which delivers the replies) until `condition()`
        holds or `timeout` seconds passed; its last value."""
        asyncio.set_event_loop(self.loop)

        def pumped():
            self.loop.run_until_complete(asyncio.sleep(0.01))
            return condition()
        return wait_until(pumped, timeout, poll=0)

    def finish(self):
        """The sentences (or the failure) answering the last utterance, once its end came."""
        def ended():
            replies = self.satellite.heard[self._start:]
            return bool(replies) and replies[-1][0] == "ovos.utterance.handled"
        if not self.pump_until(ended):
            raise AssertionError(f"no end: {self.satellite.heard[self._start:]}")
        return [data.get("utterance") or data for kind, data in
                self.satellite.heard[self._start:-1]]

    def ask(self, text, session_id="kitchen", turn_id=None):
        self.send(text, session_id, turn_id)
        return self.finish()

    def close(self):
        self.protocol.shutdown()
        self.loop.close()
        asyncio.set_event_loop(None)


BOTH = pytest.mark.parametrize("shared_redis", ["redis", "cluster"], indirect=True)
BACKENDS = ["memory", pytest.param("redis", marks=pytest.mark.hub),
            pytest.param("cluster", marks=pytest.mark.hub)]


def store_url(backend, request):
    """The URL of a BACKENDS store: "memory", the test's redis-server, or the run's cluster
    (emptied)."""
    if backend == "memory":
        return "memory"
    if backend == "redis":
        return request.getfixturevalue("redis_server").url
    from clusters import SharedRedis
    cluster = request.getfixturevalue("redis_cluster")
    shared = SharedRedis(cluster.url, cluster)
    shared.flush()
    shared.close()
    return cluster.url


@pytest.fixture
def replicas(shared_redis, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    made = []

    def make(**config):
        made.append(Replica(shared_redis.url, tmp_path, Satellite(), **config))
        return made[-1]
    yield make
    for replica in made:
        replica.close()


@BOTH
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


@BOTH
def test_redis_bounds_each_conversation_and_every_key_expires(shared_redis):
    store = open_store(shared_redis.url, 3, 256, 60, data_home=lambda: "unused")
    for i in range(5):
        store.record("s1", Exchange(f"question {i}", f"answer {i}", ANSWERED))
    assert [e.user for e in store.history("s1")] == ["question 2", "question 3", "question 4"]
    store.record("s1", Exchange("q", "x" * 230, ANSWERED))   # bytes: older ones make room
    assert [e.user for e in store.history("s1")] == ["question 4", "q"]
    store.keep_session("s1", {"session_id": "s1", "lang": "de-DE"})
    assert store.begin("s1", "").session["lang"] == "de-DE"
    assert store.begin("s2", "").session is None
    raw = shared_redis.raw
    raw.rpush(shared_redis.key("s1", "history:s1"), "not json", json.dumps([1, 2, 3]))
    assert [e.user for e in store.history("s1")] == ["question 4", "q"]   # junk is skipped
    assert [e.user for e in store.begin("s1", "").history] == ["question 4", "q"]
    assert all(0 < raw.ttl(key) <= 60 for key in shared_redis.stored()
               if not key.endswith("secret"))
    other = open_store(shared_redis.url, 3, 256, 60, data_home=lambda: "unused")
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


def test_a_stored_history_is_read_in_one_parse_and_no_entry_is_trusted_blindly():
    """exchanges_from_json parses a history's entries as one JSON list; entries that would
    parse together but not alone (one spanning the next) or that are not exchanges are
    left out, as one parse each leaves them out."""
    good = [json.dumps([f"q{i}", f"a{i}", ANSWERED]) for i in range(3)]
    assert [e.user for e in exchanges_from_json(good)] == ["q0", "q1", "q2"]
    assert exchanges_from_json([]) == []
    spanning = ['["q", "a"', '"answered"]']          # one list only when joined
    assert exchanges_from_json(spanning) == []
    two_in_one = [good[0] + "," + good[1], good[2]]  # two lists in one entry
    assert [e.user for e in exchanges_from_json(two_in_one)] == ["q2"]
    junk = ["not json", json.dumps([1, 2, 3]), json.dumps(["q", "a"]), json.dumps({"q": 1}),
            json.dumps(["q", "a", ANSWERED, "extra"]), json.dumps("abc"),
            json.dumps({"q": "1", "a": "2", "e": "3"}), good[1]]
    assert [e.user for e in exchanges_from_json(junk)] == ["q1"]
    assert exchanges_from_json([json.dumps(["q", "a", ANSWERED])]) == [
        Exchange("q", "a", ANSWERED)]


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


@BOTH
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


@BOTH
def test_a_turn_id_still_running_elsewhere_is_waited_for_not_run_again(replicas):
    a, b = replicas(), replicas()
    a.send("wait 1", turn_id="t-slow")
    assert wait_until(lambda: a.protocol.engine.asked == ["wait 1"], 5)   # a is running it
    assert b.ask("wait 1", turn_id="t-slow") == ["done waiting"]
    assert a.finish() == ["done waiting"]
    assert a.protocol.engine.asked == ["wait 1"] and b.protocol.engine.asked == []


@BOTH
def test_a_turn_whose_owner_died_is_taken_over_and_run_again(replicas, shared_redis):
    """A record left 'running' by a replica that is gone (its alive key lapsed)."""
    from hivemind_chat_agent.hub.conversation_store import RUNNING, TurnRecord, record_to_json
    b = replicas()
    b.ask("hello")                             # the engine session id of this satellite
    [session_key] = shared_redis.keys("history:*")
    session_id = session_key.split("history:", 1)[1]
    shared_redis.raw.set(shared_redis.key(
        session_id, f"turn:{len(session_id.encode())}:{session_id}:t-orphan"), record_to_json(
        TurnRecord(RUNNING, "a-replica-that-died")))
    assert b.ask("count 2", turn_id="t-orphan") == ["sentence 1", "sentence 2"]
    assert b.protocol.engine.asked == ["hello", "count 2"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_turn_record_is_claimed_once_and_done_with_what_was_said(backend, tmp_path,
                                                                    request):
    from hivemind_chat_agent.hub.conversation_store import DONE, RUNNING
    url = store_url(backend, request)
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


def answered(store, session_id, turn_id, client, said="said"):
    """One turn of `client` run through `store`, with its record done."""
    begun = store.begin(session_id, turn_id, client=client)
    assert begun.record is None, begun.record
    store.finish(session_id, turn_id, Exchange("q", said, ANSWERED), [said], begun.history,
                 keep_exchange=True, client=client)


def test_one_clients_churn_never_evicts_another_clients_running_record(tmp_path):
    """The memory store's turn records were one table of 4,096 for all clients: any client's
    churn evicted the oldest, another client's running one too, and that turn, sent again,
    ran twice."""
    from hivemind_chat_agent.hub.conversation_store import RUNNING, MemoryStore
    store = MemoryStore(2, 256, data_home=lambda: str(tmp_path), max_turn_records_per_client=8)
    assert store.begin("sat-a-kitchen", "t-running", client="a").record is None
    for i in range(5000):
        answered(store, f"sat-b-{i % 40}", f"churn-{i}", "b")
    assert store.turn_record("sat-a-kitchen", "t-running").state == RUNNING
    again = store.begin("sat-a-kitchen", "t-running", client="a").record
    assert again.state == RUNNING        # the resent turn waits for its run: never a second
    assert store.turns.count("b") == 8 and store.turns.count("a") == 1
    assert store.turn_record("sat-b-39", "churn-4999").sentences == ["said"]


def record_done(store, turn_id) -> bool:
    """The memory store holds a finished record of `turn_id` (whatever its session's id)."""
    from hivemind_chat_agent.hub.conversation_store import DONE
    keys = [key for key in list(store.turns._held) if key[1] == turn_id]   # test-only peek
    return any((store.turn_record(*key) or SimpleNamespace(state=None)).state == DONE
               for key in keys)


def test_a_turn_that_finds_all_its_clients_records_running_is_answered_busy(tmp_path,
                                                                           monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    hub = Replica("memory", tmp_path, Satellite(), max_turn_records_per_client=1)
    try:
        hub.send("wait 1", session_id="s1", turn_id="t-long")
        assert wait_until(lambda: hub.protocol.engine.asked == ["wait 1"], 5)   # record taken
        [refused] = hub.ask("hello", session_id="s2", turn_id="t-new")
        assert refused["reason"] == "busy" and "max_turn_records_per_client" in \
            refused["message"], refused
        # the first one's end: its record is marked done on its worker just after its
        # `handled` went out (hub/hub_turn.py), so a turn asked at its last sentence, or even
        # at its `handled`, can still find it running (seen in a full run on a loaded machine)
        assert hub.pump_until(lambda: record_done(hub.protocol.store, "t-long"))
        assert ("speak", "done waiting") in [(k, d.get("utterance"))
                                             for k, d in hub.satellite.heard]
        assert hub.ask("hello", session_id="s2", turn_id="t-new") == ["hello there"]
        assert hub.protocol.engine.asked == ["wait 1", "hello"]
    finally:
        hub.close()


def test_a_client_over_its_cap_drops_its_own_oldest_finished_record_or_refuses_the_turn():
    from fake_clock import FakeClock

    from hivemind_chat_agent.errors import HubBusyError
    from hivemind_chat_agent.hub.conversation_store import DONE, RUNNING
    from hivemind_chat_agent.hub.turn_table import TurnRecordsFull, TurnRecordTable
    clock = FakeClock()
    table = TurnRecordTable(3, ttl=600, now=clock.now)
    assert table.claim("a", "s", "t1") is None
    table.done("s", "t1", ["one"], ANSWERED)
    assert table.claim("a", "s", "t2") is None                 # stays running
    assert table.claim("a", "s", "t3") is None
    table.done("s", "t3", ["three"], ANSWERED)
    assert table.claim("a", "s", "t4") is None                 # t1, the oldest done, goes
    assert table.get("s", "t1") is None and table.get("s", "t2").state == RUNNING
    assert table.claim("a", "s", "t5") is None                 # then t3; t2 still running
    assert table.get("s", "t3") is None and table.get("s", "t2").state == RUNNING
    with pytest.raises(TurnRecordsFull, match="all belong to turns still running") as full:
        table.claim("a", "s", "t6")                            # t2, t4, t5 all running
    assert isinstance(full.value, HubBusyError)                # the satellite hears "busy"
    assert table.get("s", "t6") is None and table.count("a") == 3
    assert table.claim("b", "s2", "t1") is None                # another client is not full
    assert table.claim("a", "s", "t2").state == RUNNING        # a repeat is still answered
    table.done("s", "t4", ["four"], ANSWERED)
    assert table.claim("a", "s", "t6") is None                 # room again: t4 goes
    assert table.get("s", "t4") is None and table.get("s", "t6").state == RUNNING
    clock.advance(601)                                         # every record lapses, in order
    assert table.get("s", "t2") is None
    assert table.claim("a", "s", "t7") is None and table.count("a") == 1
    table.done("s", "t7", ["seven"], ANSWERED)
    assert (table.get("s", "t7").state, table.get("s", "t7").sentences) == (DONE, ["seven"])


@BOTH
def test_redis_holds_max_sessions_per_client_and_deletes_an_evicted_sessions_keys(
        shared_redis, tmp_path, monkeypatch):
    """Redis kept every session until its TTL: 40 sessions of a client capped at 8 left 40
    histories. Now the client's least recently used session goes, with its history, its
    Session and its finished turn records, whichever replica its turns were on; another
    client keeps its own."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    keys = shared_redis.keys
    a, b = (Replica(shared_redis.url, tmp_path, Satellite(), max_sessions_per_client=8)
            for _ in range(2))
    other = Replica(shared_redis.url, tmp_path, Satellite(peer="other::1", key="key-2"),
                    max_sessions_per_client=8)
    try:
        assert other.ask("note the blue door", session_id="keep", turn_id="o-1") == ["noted"]
        for i in range(40):
            replica = a if i % 2 else b
            assert replica.ask(f"note thing {i}", session_id=f"s{i}", turn_id=f"t{i}") == \
                ["noted"]
        [kept_other] = [k for k in keys("history:*") if k.endswith("-keep")]
        histories = [k for k in keys("history:*") if k != kept_other]
        assert [k.rsplit("-", 1)[1] for k in histories] == sorted(f"s{i}" for i in range(32, 40))
        sessions = [k for k in keys("session:*") if not k.endswith("-keep")]
        assert len(sessions) == 8, sessions
        records = [k for k in keys("turn:*") if "-keep:" not in k]
        assert sorted(k.rsplit(":", 1)[1] for k in records) == sorted(
            f"t{i}" for i in range(32, 40)), records
        assert json.loads(a.ask("history", session_id="s0")[0]) == []     # evicted: new
        assert other.ask("notes", session_id="keep") == ["notes: the blue door"]
        assert len(keys("sessions:*")) == 2            # one per client
    finally:
        for replica in (a, b, other):
            replica.close()


@BOTH
def test_redis_one_clients_churn_never_evicts_another_clients_running_record(shared_redis,
                                                                            tmp_path):
    """Each client keeps at most max_turn_records_per_client records in Redis too (there
    was no bound but the 10-minute TTL), making room with its own finished ones: another
    client's running record stays, and a client whose records all run is refused."""
    from hivemind_chat_agent.hub.conversation_store import RUNNING, TurnRecordsFull
    keys = shared_redis.keys
    store = open_store(shared_redis.url, 2, 256, 60, data_home=lambda: "",
                       max_sessions_per_client=8, max_turn_records_per_client=8)
    assert store.begin("sat-a-kitchen", "t-running", client="a").record is None
    for i in range(200):
        answered(store, f"sat-b-{i % 5}", f"churn-{i}", "b")
    assert store.turn_record("sat-a-kitchen", "t-running").state == RUNNING
    assert store.begin("sat-a-kitchen", "t-running", client="a").record.state == RUNNING
    # a turn that ends at the cap leaves one place free, so the next claim needs no script
    b_records = [k for k in keys("turn:*") if "sat-b-" in k]
    assert len(b_records) == 7 and b_records == sorted(
        f"hivemind-chat:turn:7:sat-b-{i % 5}:churn-{i}" for i in range(193, 200))
    for i in range(7):                                     # a's other 7 places, all running
        assert store.claim_turn("sat-a-hall", f"r{i}", client="a") is None
    with pytest.raises(TurnRecordsFull, match="all belong to turns still running"):
        store.begin("sat-a-hall", "one-too-many", client="a")
    assert store.turn_record("sat-a-hall", "one-too-many") is None
    store.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_ids_no_key_name_can_hold_are_refused_with_the_reason(backend, tmp_path, monkeypatch,
                                                              request):
    """A lone surrogate (JSON carries one) in a session or turn id: Redis key names are
    UTF-8, so the Redis store failed inside the worker and the turn waited for its timeout."""
    url = store_url(backend, request)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    from fake_clock import FakeClock
    clock = FakeClock()        # the turn timeout cannot fire: only a refusal can end these
    hub = Replica(url, tmp_path, Satellite(), clock=clock, timeout=5)
    try:
        for session_id, turn_id, what in (("x\ud800", None, "session id"),
                                          ("kitchen", "t\udfff", "turn id")):
            [refused] = hub.ask("hello", session_id=session_id, turn_id=turn_id)
            assert refused["reason"] == "id_too_long", refused
            assert f"{what} " in refused["message"] and "not valid UTF-8" in refused["message"]
            assert clock.now() == 0
        assert hub.ask("hello", session_id="kitchen", turn_id="t-1") == ["hello there"]
        assert hub.protocol.engine.asked == ["hello"]
    finally:
        hub.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_turn_records_of_ids_with_colons_never_collide(backend, tmp_path, monkeypatch, request):
    """Redis named a record turn:<session>:<turn id>: a satellite's session "x:y" with turn
    "z" and its session "x" with turn "y:z" were one key, and the second turn was answered
    with the first one's sentences instead of being run."""
    url = store_url(backend, request)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    hub = Replica(url, tmp_path, Satellite())
    pairs = [("x:y", "z"), ("x", "y:z"), ("x:", "y:z"), ("x", ":y:z"), ("x:y:", "z"),
             ("é:x", "y"), ("é", "x:y")]
    try:
        for n, (session_id, turn_id) in enumerate(pairs, 1):
            assert hub.ask(f"count {n}", session_id=session_id, turn_id=turn_id) == \
                [f"sentence {k}" for k in range(1, n + 1)], (session_id, turn_id)
        assert hub.protocol.engine.asked == [f"count {n}" for n in range(1, len(pairs) + 1)]
        for n, (session_id, turn_id) in enumerate(pairs, 1):     # a repeat: its own record
            assert hub.ask("count 9", session_id=session_id, turn_id=turn_id) == \
                [f"sentence {k}" for k in range(1, n + 1)]
        assert len(hub.protocol.engine.asked) == len(pairs)
    finally:
        hub.close()


def test_redis_stopped_and_restarted_under_load_fails_turns_cleanly_then_nothing_is_wrong(
        redis_server, replicas):
    """Back-to-back turns of four conversations while Redis goes away: each turn is answered
    or fails with store_unavailable (none hangs, none is answered wrongly), and once Redis is
    back every turn is answered and each conversation's history is its own. The outage is
    driven by what the turns see (answered before it, failed during it, answered after it),
    not by a timer racing them: on a loaded machine a fixed 3 s window could hold no failure
    at all."""
    import threading
    a = replicas()
    counts = {"answered": 0, "failed": 0}
    stop = threading.Event()
    errors = []

    def turns():
        i = 0
        try:
            while not stop.is_set():
                [reply] = a.ask(f"turn {i}", session_id=f"load-{i % 4}")
                if isinstance(reply, dict):
                    assert reply["reason"] == "store_unavailable", reply
                    counts["failed"] += 1
                else:
                    assert reply == f"you said turn {i}", reply
                    counts["answered"] += 1
                i += 1
        except Exception as e:      # an assertion of the loop: reported by the test
            errors.append(e)
    loop = threading.Thread(target=turns, daemon=True)
    loop.start()
    try:
        assert wait_until(lambda: counts["answered"] >= 3 or errors, 30), counts
        redis_server.stop()
        assert wait_until(lambda: counts["failed"] >= 3 or errors, 30), counts
        answered_in_outage = counts["answered"]
        redis_server.start()
        assert wait_until(lambda: counts["answered"] >= answered_in_outage + 3 or errors,
                          30), counts
    finally:
        stop.set()
        loop.join(30)
    assert not errors, errors
    assert not loop.is_alive(), "a turn hung"
    for n in range(8):
        assert a.ask(f"after {n}", session_id=f"load-{n % 4}") == [f"you said after {n}"]
    for s in range(4):
        history = json.loads(a.ask("history", session_id=f"load-{s}")[0])
        users = [text for role, text in history if role == "user"]
        assert users[-2:] == [f"after {s}", f"after {s + 4}"]
        assert all(int(u.split()[1]) % 4 == s for u in users if u.startswith("turn"))


@pytest.mark.hub
def test_a_begin_written_early_reads_as_the_begin_and_its_connection_is_kept(redis_server,
                                                                             tmp_path):
    """RedisStore.send_begin (the IO loop writes a turn's begin as a free worker takes the
    turn) never connects: nothing until a worker's round trip has connected a connection and
    kept it (hub/redis_connections.py); then the worker reads what a begin would have, on the
    same connection each time; a kept connection that Redis closed meanwhile is dropped, never
    written to, and the next round trip on a worker connects another. The memory store never
    sends early."""
    from hivemind_chat_agent.hub.conversation_store import RUNNING
    memory = open_store("memory", 2, 256, 60, data_home=lambda: str(tmp_path))
    assert memory.send_begin("s", "t0", "c") is None
    assert memory.begin("s", "t0", client="c").record is None
    memory.unclaim("s", "t0", client="c")                          # as if never claimed
    assert memory.turn_record("s", "t0") is None and memory.begin("s", "t0", "c").record is None
    store = open_store(redis_server.url, 2, 256, 60, data_home=lambda: str(tmp_path))
    assert store.send_begin("s", "t0", client="c") is None        # nothing connected yet
    first = store.begin("s", "t0", client="c")
    assert first.record is None
    store.finish("s", "t0", Exchange("hi", "hello", ANSWERED), ["hello"], first.history,
                 keep_exchange=True, client="c")
    connections = set()
    for turn in ("t1", "t2"):
        sent = store.send_begin("s", turn, client="c")
        connections.add(id(sent.connection))
        begun = store.begin("s", turn, client="c", sent=sent)
        assert begun.record is None and [e.user for e in begun.history] == ["hi"]
    assert len(connections) == 1
    again = store.begin("s", "t1", client="c", sent=store.send_begin("s", "t1", client="c"))
    assert again.record.state == RUNNING                          # claimed once only
    store.unclaim("s", "t1", client="c")
    assert store.turn_record("s", "t1") is None
    other = open_store(redis_server.url, 2, 256, 60, data_home=lambda: str(tmp_path))
    assert store.begin("s", "t5", client="c").record is None
    assert other.begin("s", "t5", client="c").record.owner == store.owner
    from hivemind_chat_agent.hub.redis_keys import turn_key
    other._rounds.run(("SET", turn_key(other._prefix("s"), "s", "t5"), other._running))
    store.unclaim("s", "t5", client="c")      # taken over: no longer this hub's, it stays
    assert store.turn_record("s", "t5").owner == other.owner
    other.close()
    redis_server.stop()
    redis_server.start()                     # the kept connection was closed by the restart
    assert store.send_begin("s", "t3", client="c") is None
    third = store.begin("s", "t3", client="c")      # on its worker: connected again, kept
    assert third.record is None
    assert store.send_begin("s", "t4", client="c") is not None
    store.close()


@pytest.mark.hub
def test_a_turn_begun_early_that_then_does_not_run_gives_its_record_up(redis_server,
                                                                       replicas):
    """A turn whose begin went out as it was queued but which did not run (its satellite
    left, or it ended, before the worker took it up) leaves no record behind: the same turn
    sent again runs at once instead of waiting for a record that nobody runs."""
    from hivemind_chat_agent.hub import turn_runner
    a = replicas(timeout=5)
    assert a.ask("hello", turn_id="t0") == ["hello there"]   # a connection kept for them
    store, sent = a.protocol.store, []

    def send_begin(*args, **kwargs):
        sent.append(type(store).send_begin(store, *args, **kwargs))
        return sent[-1]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(store, "send_begin", send_begin)
        patch.setattr(turn_runner, "connection_closed", lambda client: True)
        a.send("hello", turn_id="t1")
        assert a.pump_until(lambda: len(a.protocol.open_turns) == 0)     # abandoned
    assert sent and sent[0] is not None
    assert a.ask("hello", turn_id="t1") == ["hello there"]
