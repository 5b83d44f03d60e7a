"""Hub-side pure logic: satellite session namespacing/TTL and the keyed serial executor."""
import threading

import pytest
from waiting import UNIT, wait_until

from hivemind_chat_agent.core.satellites import SatelliteSessions, engine_session_id
from hivemind_chat_agent.hub.secret import hub_secret
from hivemind_chat_agent.hub.serial_executor import KeyedSerialExecutor, QueueFull


def test_engine_session_ids_are_namespaced_stable_keyless_and_unguessable(tmp_path):
    import os
    secret = hub_secret(str(tmp_path))
    assert secret == hub_secret(str(tmp_path)) and len(secret) >= 32     # kept across restarts
    path = tmp_path / "hivemind-chat-agent" / "hub-secret"
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    a = engine_session_id(secret, "key-a", "kitchen")
    assert a == engine_session_id(secret, "key-a", "kitchen")
    assert a != engine_session_id(secret, "key-b", "kitchen")
    assert a != engine_session_id(secret, "key-a", "hall")
    assert "key-a" not in a
    other_hub = engine_session_id(b"x" * 32, "key-a", "kitchen")
    assert other_hub != a             # without this hub's secret, nobody can compute it
    import hashlib
    assert hashlib.sha256(b"hivemind-chat-sat:key-a").hexdigest()[:10] not in a


def test_sessions_expire_after_ttl_and_on_last_disconnect():
    book = SatelliteSessions(ttl=10)
    book.touch("s1", "conn-1", "peer-1", now=0)
    book.touch("s2", "conn-2", "peer-2", now=5)
    book.touch("s2", "conn-3", "peer-3", now=6)
    assert book.expired(now=9) == []
    assert book.expired(now=10) == ["s1"]
    assert book.disconnected("peer-2") == []        # still reachable through conn-3
    assert book.disconnected("peer-3") == ["s2"]
    assert len(book) == 0 and book.peers == 1        # conn-1 is still connected
    assert book.disconnected("peer-1") == [] and book.peers == 0


def test_a_connection_that_re_hellos_releases_every_session_on_disconnect():
    """hivemind-core's peer string is name::session and changes with each HELLO; the
    disconnect names only the latest one. Everything the connection used is released, and
    its old names are not kept meanwhile."""
    book = SatelliteSessions(ttl=3600)
    for i in range(3000):
        book.touch(f"s{i}", "conn-a", f"ua::7::sat::s{i}", now=i)
    book.touch("shared", "conn-a", "ua::7::sat::shared", now=1)
    book.touch("shared", "conn-b", "ua::8::other::shared", now=1)
    assert book.peers == 2                          # one name per connection, not 3001
    gone = book.disconnected("ua::7::sat::shared")  # its latest name, as core reports it
    assert len(gone) == 3000 and "shared" not in gone
    assert len(book) == 1 and book.peers == 1      # only conn-b's name is left
    assert book.disconnected("ua::7::sat::s5") == []   # an old name of a gone connection
    assert book.disconnected("ua::8::other::shared") == ["shared"]
    assert len(book) == 0 and book.peers == 0


def test_executor_keeps_one_keys_jobs_in_order_and_runs_keys_in_parallel():
    """Each key's first job waits at a barrier that only the three keys' first jobs running at
    once can pass; a key's later jobs queue behind it and never overlap it."""
    ex = KeyedSerialExecutor(workers=4, max_pending=100)
    log, lock, all_done = [], threading.Lock(), threading.Event()
    together = threading.Barrier(3)
    running = {key: 0 for key in "abc"}
    overlapped = []

    def job(key, i):
        def run():
            with lock:
                running[key] += 1
                if running[key] > 1:
                    overlapped.append((key, i))
            if i == 0:
                together.wait(timeout=5)   # BrokenBarrierError unless the keys run at once
            with lock:
                running[key] -= 1
                log.append((key, i))
                if len(log) == 12:
                    all_done.set()
        return run
    for i in range(4):
        for key in "abc":
            ex.submit(key, job(key, i))
    assert all_done.wait(10), log
    ex.shutdown()
    assert not together.broken and overlapped == []
    for key in "abc":
        assert [i for k, i in log if k == key] == [0, 1, 2, 3]


def held(started, gate):
    """A job that says it started, then holds its worker until `gate` is set."""
    def run():
        started.set()
        gate.wait(10)
    return run


def test_at_once_is_called_only_for_a_job_a_free_worker_takes_now():
    """The hub writes a turn's store round trip in `at_once` (hub/turn_runner.py): only a job
    that no worker cap, running key or busy worker holds back may get one."""
    ex = KeyedSerialExecutor(workers=2, max_pending=10, workers_per_group=1)
    calls, gate, started = [], threading.Event(), threading.Event()

    def noted(name):
        return lambda: calls.append(name)
    ex.submit("a", held(started, gate), group="g", at_once=noted("a"))   # a worker to start
    assert started.wait(5)
    ex.submit("a", lambda: None, group="g", at_once=noted("a again, its key running"))
    ex.submit("b", lambda: None, group="g", at_once=noted("b, its group at its cap"))
    assert wait_until(lambda: ex.idle == 1, 5)
    other_started, other_gate = threading.Event(), threading.Event()
    ex.submit("c", held(other_started, other_gate), group="h", at_once=noted("c"))
    assert other_started.wait(5)
    ex.submit("d", lambda: None, group="i", at_once=noted("d, no worker free"))
    gate.set()
    other_gate.set()
    assert wait_until(lambda: ex.pending == 0 and ex.idle == 2, 5)
    done = threading.Event()
    ex.submit("e", done.set, group="g", at_once=noted("e"))
    assert done.wait(5)
    assert wait_until(lambda: ex.idle == 2, 5)
    third_started, fourth_started, last_gate = (threading.Event(), threading.Event(),
                                                threading.Event())
    ex.submit("f", held(third_started, last_gate), group="g", at_once=noted("f"))
    ex.submit("h", held(fourth_started, last_gate), group="h", at_once=noted("h"))
    ex.submit("i", lambda: None, group="i", at_once=noted("i, two free workers promised"))
    last_gate.set()
    assert wait_until(lambda: ex.pending == 0, 5)
    ex.shutdown()
    assert calls == ["a", "c", "e", "f", "h"]


def test_executor_refuses_beyond_its_bound_and_survives_failing_jobs():
    ex = KeyedSerialExecutor(workers=1, max_pending=2)
    gate, started = threading.Event(), threading.Event()
    ex.submit("a", held(started, gate))
    assert started.wait(5)                          # running, so not pending
    ex.submit("b", lambda: 1 / 0)                   # pending 1
    ex.submit("c", lambda: None)                    # pending 2
    with pytest.raises(QueueFull):
        ex.submit("d", lambda: None)
    gate.set()
    done = threading.Event()
    assert wait_until(lambda: ex.pending == 0, 5)   # b failed, c ran: the places are free
    ex.submit("e", done.set)
    assert done.wait(2)
    ex.shutdown()


def test_executor_caps_each_key_and_cancels_jobs_that_never_started():
    ex = KeyedSerialExecutor(workers=1, max_pending=10, max_pending_per_key=2)
    gate, started = threading.Event(), threading.Event()
    ex.submit("a", held(started, gate))
    assert started.wait(5)                          # running, holds the only worker
    queued = [lambda: None, lambda: None]
    for job in queued:
        ex.submit("a", job)
    with pytest.raises(QueueFull, match="this session"):
        ex.submit("a", lambda: None)
    ex.submit("b", lambda: None)                    # other keys still get in
    assert ex.cancel("a", queued[0]) and ex.pending == 2
    assert not ex.cancel("a", queued[0])            # already gone
    gate.set()
    ex.shutdown()


def test_one_client_with_many_sessions_cannot_starve_another():
    """Client A floods with 40 sessions of turns that hold their workers; client B's turns are
    neither refused nor queued behind A's: A runs on at most its share of workers (2 of 4),
    and B's all finish while every A turn is still held."""
    ex = KeyedSerialExecutor(workers=4, max_pending=64, max_pending_per_key=4,
                             max_pending_per_group=16, workers_per_group=2)
    release_a, lock = threading.Event(), threading.Lock()
    running = {"A": 0, "most A at once": 0}
    b_done = threading.Semaphore(0)

    def a_turn():
        with lock:
            running["A"] += 1
            running["most A at once"] = max(running["most A at once"], running["A"])
        release_a.wait(10)
        with lock:
            running["A"] -= 1
    refused_a = 0
    for i in range(40):
        try:
            ex.submit(f"a-{i}", a_turn, group="A")
        except QueueFull as e:
            assert "of this client" in str(e)
            refused_a += 1
    assert 40 - 16 - 2 <= refused_a <= 40 - 16   # its own quota (2 may already run), no more
    for i in range(6):
        ex.submit(f"b-{i}", b_done.release, group="B")   # never refused
    assert all(b_done.acquire(timeout=5) for _ in range(6)), "B waited behind A"
    wait_until(lambda: running["A"] == 2, 5)       # A's two workers may still be starting
    with lock:
        assert running["most A at once"] == 2 and running["A"] == 2
    release_a.set()
    ex.shutdown()
    assert running["most A at once"] == 2


def test_cancelling_a_ready_job_leaves_the_executor_consistent():
    ex = KeyedSerialExecutor(workers=1, max_pending=10, workers_per_group=1)
    gate, started, third_ran = threading.Event(), threading.Event(), threading.Event()
    ex.submit("busy", held(started, gate), group="g")
    assert started.wait(5)
    ran = []
    job = lambda: ran.append("x")
    ex.submit("other", job, group="g")
    assert ex.cancel("other", job)
    ex.submit("third", lambda: (ran.append("third"), third_ran.set()), group="g")
    gate.set()
    assert third_ran.wait(5)                        # "other" would have run before it
    assert ran == ["third"]
    ex.shutdown()


def test_protocol_repr_never_shows_a_relays_upstream_credentials():
    from hivemind_chat_agent import ChatAgentProtocol
    proto = ChatAgentProtocol(config={
        "engine": "hivemind-chat-agent",
        "engine_config": {"host": "127.0.0.1", "key": "UPSTREAM-KEY-123",
                          "password": "UPSTREAM-PASSWORD-456"}})
    try:
        text = repr(proto) + repr(proto.settings) + repr(proto.engine.settings)
        assert "hivemind-chat-agent" in text
        assert "UPSTREAM-KEY-123" not in text and "UPSTREAM-PASSWORD-456" not in text
    finally:
        proto.shutdown()


def test_the_agent_bus_never_writes_sessions():
    """FakeBus stored every emitted message's Session under the satellite's declared id: a
    satellite could overwrite another's engine Session. The plugin's bus does nothing of that."""
    from engines import ScriptEngine
    from ovos_bus_client.message import Message
    from ovos_bus_client.session import SessionManager

    from hivemind_chat_agent import ChatAgentProtocol
    protocol = ChatAgentProtocol(config={"engine": "engines:ScriptEngine"},
                                 engine=ScriptEngine())
    try:
        seen = []
        protocol.bus.on("some.topic", seen.append)
        SessionManager.sessions.pop("sat-victim-home", None)
        protocol.bus.emit(Message("some.topic", {}, {"session": {"session_id": "sat-victim-home",
                                                                 "lang": "xx-XX"}}))
        protocol.bus.emit(Message("recognizer_loop:utterance", {"utterances": ["x"]},
                                  {"session": {"session_id": "sat-victim-home"}}))
        assert len(seen) == 1
        assert "sat-victim-home" not in SessionManager.sessions
    finally:
        protocol.shutdown()


def test_failed_writes_to_a_vanished_satellite_are_consumed():
    """tornado's write_message returns a Task that fails when the socket closed meanwhile;
    hivemind-core drops it and asyncio reports it at garbage collection. Ours is consumed."""
    import asyncio
    import gc
    import logging

    from hivemind_chat_agent.hub.dialect_v4 import write_frame

    class Handler:
        def __init__(self):
            self.writes = []

        def write_message(self, frame, binary):
            async def fail():
                raise ConnectionResetError("socket closed")
            self.writes.append(asyncio.ensure_future(fail()))
            return self.writes[-1]

    handler = Handler()

    class Client:
        def __init__(self):
            def do_send(payload, is_bin):    # hivemind-websocket-protocol's closure shape
                handler.write_message(payload, is_bin)
            self.send_msg = do_send

    reports = []

    class Catch(logging.Handler):
        def emit(self, record):
            reports.append(record.getMessage())
    catcher = Catch()
    logging.getLogger("asyncio").addHandler(catcher)
    loop = asyncio.new_event_loop()
    try:
        async def run():
            write_frame(Client(), "frame", False)
            await asyncio.wait(handler.writes)     # the write failed (its callbacks run next)
            handler.writes.clear()                 # so that gc can report it if unconsumed
        loop.run_until_complete(run())
        gc.collect()
        loop.run_until_complete(asyncio.sleep(0))
    finally:
        loop.close()
        logging.getLogger("asyncio").removeHandler(catcher)
    assert not any("never retrieved" in r for r in reports), reports


def test_one_client_keeps_a_bounded_number_of_sessions_and_others_keep_theirs():
    book = SatelliteSessions(ttl=100, max_per_client=3)
    assert book.touch("other-1", "conn-o", "peer-o", now=0, client="other") == []
    evicted = []
    for i in range(10):
        evicted += book.touch(f"s{i}", "conn-1", f"peer-1-{i}", now=i, client="flood")
    assert evicted == [f"s{i}" for i in range(7)]
    assert [sid for sid in ("s7", "s8", "s9", "other-1") if sid in book] == \
        ["s7", "s8", "s9", "other-1"]
    assert book.touch("s7", "conn-1", "peer-1-7", now=20, client="flood") == []   # seen again
    assert book.touch("s10", "conn-1", "peer-1-10", now=21, client="flood") == ["s8"]
    assert book.disconnected("peer-1-3") == []          # an old name: only the latest is kept
    assert book.peers == 2
    assert sorted(book.closed("conn-1")) == ["s10", "s7", "s9"]
    assert len(book) == 1 and book.expired(now=200) == ["other-1"] and len(book) == 0
    assert book.clients == 0                            # nothing kept of the flood


def test_an_id_is_refused_past_256_bytes_of_utf8_and_quoted_briefly_whatever_its_length():
    from hivemind_chat_agent.core.limits import MAX_ID_BYTES, id_refusal, shown, shown_name
    assert MAX_ID_BYTES == 256
    for fine in ("", "kitchen", "a" * 256, "é" * 128, "€" * 85, "😀" * 64):
        assert id_refusal("session id", fine) == "", fine
    for over in ("a" * 257, "é" * 129, "€" * 86, "😀" * 65, "x" * 3_000_000):
        why = id_refusal("session id", over)
        assert "over 256 bytes of UTF-8" in why and len(why) < 200, why[:300]
    assert "not valid UTF-8" in id_refusal("turn id", "t\ud800")     # JSON can carry one
    assert shown("a\nb") == "'a\\nb'"                                  # no forged log line
    assert shown("x" * 1000) == f"{'x' * 32!r}… (1000 bytes)"
    assert shown_name("sat::1::kitchen") == "sat::1::kitchen"
    assert shown_name("sat::" + "s" * 10**6).endswith("… (1000005 bytes)")
    assert len(shown_name("sat::\n" + "s" * 10**6)) < 130 and "\n" not in shown_name("\n")


class _Forgetful:
    """An engine and asides at once: notes every session it is told to forget."""

    def __init__(self):
        self.forgotten = []

    def stop(self, session_id):              # the asides
        self.forgotten.append(("asides", session_id))

    def forget_session(self, session_id):    # the engine
        self.forgotten.append(("engine", session_id))


def test_the_satellite_book_lets_a_session_go_with_everything_it_held():
    from types import SimpleNamespace

    from fake_clock import FakeClock
    from ovos_bus_client.session import Session, SessionManager

    from hivemind_chat_agent.core.transcript import ANSWERED, Exchange
    from hivemind_chat_agent.hub.conversation_store import MemoryStore
    from hivemind_chat_agent.hub.satellite_book import SatelliteBook
    clock, held, store = FakeClock(), _Forgetful(), MemoryStore(10, 10_000, lambda: "unused")
    settings = SimpleNamespace(session_ttl=30.0, max_sessions_per_client=2)
    book = SatelliteBook(settings, clock, store, held, held)
    conn, other = SimpleNamespace(key="key-a"), SimpleNamespace(key="key-b")
    for sid in ("a1", "a2", "b1"):
        SessionManager.sessions[sid] = Session(sid)
        store.record(sid, Exchange("q", "a", ANSWERED))
    book.touch("a1", conn, "peer-a")
    book.touch("b1", other, "peer-b")
    book.touch("a2", conn, "peer-a")
    assert len(book) == 3 and book.peers == 2 and held.forgotten == []
    book.touch("a3", conn, "peer-a")           # key-a's third: its least recent goes
    assert "a1" not in book and "a1" not in SessionManager.sessions
    assert store.history("a1") == [] and store.history("a2") != []
    assert held.forgotten == [("asides", "a1"), ("engine", "a1")]
    book.closed(conn)
    assert len(book) == 1 and "b1" in book and "a2" not in SessionManager.sessions
    assert store.history("a2") == [] and store.history("b1") != []
    book.keep_sweeping()
    book.keep_sweeping()                       # one sweep timer, however often asked
    assert clock.pending == 1
    clock.advance(30)
    assert len(book) == 0 and "b1" not in SessionManager.sessions and clock.pending == 1
    book.forget_if_untracked("gone")           # a turn that outlived its satellite
    assert held.forgotten[-2:] == [("asides", "gone"), ("engine", "gone")]


class _TurnHost:
    """What a HubTurn needs of the plugin; notes what was sent, and what had been sent when
    the ended turn was kept."""

    def __init__(self):
        from fake_clock import FakeClock

        from hivemind_chat_agent.hub.hub_turn import OpenTurns
        from hivemind_chat_agent.hub.metrics import NO_METRICS
        from hivemind_chat_agent.hub.settings import HubSettings
        self.settings, self.clock = HubSettings.from_dict({"engine": "x"}), FakeClock()
        self.metrics = NO_METRICS
        self.open_turns, self.sent, self.kept = OpenTurns(), [], []
        self.queued = threading.Event()

    def deliver(self, turn, reply):
        turn.loop.add_callback(self.sent.append, reply.msg_type)
        if reply.msg_type == "ovos.utterance.handled":
            self.queued.set()

    def keep_exchange(self, ended):
        self.kept.append((ended.ended, list(self.sent)))


def _turn_on_a_loop(host):
    import asyncio

    from ovos_bus_client.message import Message
    from tornado.ioloop import IOLoop

    from hivemind_chat_agent.hub.hub_turn import HubTurn
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    turn = HubTurn(host, Message("recognizer_loop:utterance", {}, {}), object(), "peer",
                   IOLoop.current(), "hello", {"session_id": "s"}, "s")
    return loop, turn


def test_a_turn_ended_on_a_worker_is_kept_only_after_the_io_loop_wrote_its_end(monkeypatch):
    """The hand-off that replaced time.sleep(0): the store write waits for the IO loop to
    have run the end's writes (queue order), however late the loop gets to them."""
    import asyncio

    from hivemind_chat_agent.hub import hub_turn
    monkeypatch.setattr(hub_turn, "TOLD_WAIT", 60.0)   # far beyond this test's pause
    host = _TurnHost()
    loop, turn = _turn_on_a_loop(host)
    try:
        worker = threading.Thread(target=turn.finish, args=(False,))
        worker.start()
        assert host.queued.wait(5)             # the end is queued; the loop has not run
        worker.join(UNIT)                      # (a worker without the hand-off ends here)
        assert worker.is_alive() and host.kept == []   # so nothing is written yet
        loop.run_until_complete(loop.run_in_executor(None, worker.join, 10))   # loop runs
        assert host.kept == [("answered", ["ovos.utterance.handled"])]
    finally:
        loop.close()
        asyncio.set_event_loop(None)


def test_a_turn_ended_on_the_io_loop_is_kept_at_once_and_a_stopped_loop_delays_no_one(
        monkeypatch):
    import asyncio

    from hivemind_chat_agent.core.turns import EndReason
    from hivemind_chat_agent.hub import hub_turn
    host = _TurnHost()
    loop, turn = _turn_on_a_loop(host)
    try:
        assert turn.finish(failed=True, why="late", reason=EndReason.TIMEOUT)   # the loop's
        assert host.kept == [("timeout", [])]  # written before the loop's callback returns
        monkeypatch.setattr(hub_turn, "TOLD_WAIT", 0.05)
        loop.close()
        loop, turn = _turn_on_a_loop(host)
        loop.close()                           # a stopped loop runs no marker
        worker = threading.Thread(target=turn.finish, args=(False,))
        worker.start()
        worker.join(5)
        assert not worker.is_alive() and host.kept[-1] == ("answered", [])
    finally:
        asyncio.set_event_loop(None)
