"""The hub plugin's health endpoint without a hub: how a turn's end is counted (the outcome
labels are a contract, docs/metrics.md), when the hub says it is ready, the settings that keep
the port closed by default, and the HTTP edge against an attacker on 127.0.0.1 (a real socket:
wrong Host, a web page's Origin, other methods and paths, a slow client, a flood of
connections)."""
import socket
import threading
import time

import pytest
from hubs import free_port
from prometheus_client.parser import text_string_to_metric_families
from waiting import UNIT, wait_until

from hivemind_chat_agent.core import health
from hivemind_chat_agent.core.health import OUTCOMES, Verdict, readiness, turn_outcome
from hivemind_chat_agent.core.peer_gate import AllowList, Caps
from hivemind_chat_agent.core.turns import EndReason
from hivemind_chat_agent.errors import ConfigurationError, ConversationStoreError
from hivemind_chat_agent.hub.health_server import HealthServer
from hivemind_chat_agent.hub.metrics import HubMetrics, TimedStore
from hivemind_chat_agent.hub.settings import HubSettings


def samples(text):
    """{(sample name, sorted label items): value} of an exposition, read by prometheus_client's
    own parser."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


# ---- the outcome of a turn: one place, every reason ----
@pytest.mark.parametrize("reason,outcome", [
    (EndReason.NOT_UNDERSTOOD, "not_understood"), (EndReason.NONE, "not_understood"),
    (EndReason.NO_TEXT, "not_understood"), (EndReason.TIMEOUT, "timed_out"),
    (EndReason.BUSY, "failed"), (EndReason.ENGINE_ERROR, "failed"),
    (EndReason.STORE_UNAVAILABLE, "failed"), (EndReason.ID_TOO_LONG, "failed"),
    (EndReason.BACKEND_UNAVAILABLE, "failed"), (EndReason.REFUSED, "failed")])
def test_a_failure_counts_by_its_reason(reason, outcome):
    assert turn_outcome(True, reason) == outcome


def test_every_end_reason_has_an_outcome_of_the_contract():
    assert {turn_outcome(True, r) for r in EndReason} <= set(OUTCOMES)


def test_answers_stops_replays_and_questions():
    assert turn_outcome(False) == "answered"
    assert turn_outcome(False, asked=True) == "asked"
    assert turn_outcome(False, stopped=True) == "stopped"
    assert turn_outcome(False, abandoned=True) == "stopped"     # its satellite left first
    # answered from its record: whatever that first run was, the engine did not run now
    assert turn_outcome(False, replayed=True) == "replayed"
    assert turn_outcome(True, EndReason.TIMEOUT, replayed=True) == "replayed"
    # a stop that came after the timeout's end is not a stop: the failure was the end
    assert turn_outcome(True, EndReason.TIMEOUT, stopped=True) == "timed_out"


# ---- readiness ----
def test_ready_only_when_store_engine_and_no_drain_allow_it():
    assert readiness(True, True, False) == Verdict(200)
    assert readiness(False, True, False).reason == "store_unavailable"
    assert readiness(True, False, False).reason == "engine_not_loaded"
    assert readiness(False, False, True).reason == "draining"     # the first reason
    assert all(readiness(*s).status == 503 for s in [(False, True, False), (True, False, False),
                                                     (True, True, True), (False, False, True)])
    assert readiness(False, True, False).body()["ready"] is False


def test_not_ready_is_404_only_for_a_prober_that_asks_for_it():
    """HAProxy's disable-on-404 reads 404 as "no new connections, keep the open ones", where a
    503 would cut them: config/haproxy.cfg asks `/readyz?not_ready=404`. Any other prober is
    answered 503, and a ready hub 200 whatever the query."""
    from hivemind_chat_agent.core.health import as_asked
    for verdict in (readiness(True, True, True), readiness(False, True, False),
                    readiness(True, False, False)):
        assert as_asked(verdict, "/readyz?not_ready=404") == Verdict(404, verdict.reason,
                                                                     verdict.message)
        assert as_asked(verdict, "/readyz?x=1&not_ready=404").status == 404
        for target in ("/readyz", "/readyz?not_ready=4044", "/readyz?draining=404"):
            assert as_asked(verdict, target) == verdict
    assert as_asked(Verdict(200), "/readyz?not_ready=404") == Verdict(200)


def test_the_plugin_is_ready_while_it_serves_and_engine_not_loaded_once_shut_down():
    """The engine loads with the plugin (a failure stops the hub's start), so a running
    plugin's engine is there; `engine_not_loaded` is what /readyz says from its shutdown on,
    until the health port goes with it."""
    from engines import ScriptEngine

    from hivemind_chat_agent import ChatAgentProtocol
    protocol = ChatAgentProtocol(config={"engine": "engines:ScriptEngine"},
                                 engine=ScriptEngine())
    try:
        assert protocol.readiness() == Verdict(200)
    finally:
        protocol.shutdown()
    assert protocol.readiness().reason == "engine_not_loaded"
    assert protocol.readiness().status == 503


# ---- settings: off by default, closed by default ----
def test_health_is_off_unless_set_and_loopback_unless_the_operator_says_who():
    assert HubSettings.from_dict({"engine": "x"}).health == ""
    assert HubSettings.from_dict({"engine": "x", "health": ":8008"}).health_address() == \
        ("127.0.0.1", 8008)
    assert HubSettings.from_dict({"engine": "x", "health": "[::1]:8008"}).health_address() == \
        ("::1", 8008)
    with pytest.raises(ConfigurationError, match="health_allow_from"):
        HubSettings.from_dict({"engine": "x", "health": "0.0.0.0:8008"})
    with pytest.raises(ConfigurationError, match="HOST:PORT"):
        HubSettings.from_dict({"engine": "x", "health": "127.0.0.1:http"})
    lan = HubSettings.from_dict({"engine": "x", "health": "0.0.0.0:8008",
                                 "health_allow_from": "10.0.0.5"})
    allow = lan.health_allow()
    assert allow.allows("10.0.0.5") and not allow.allows("10.0.0.6")
    assert not allow.allows("127.0.0.1")     # a named list is the whole list


def test_a_drain_gives_running_turns_20_seconds_unless_the_operator_says_otherwise():
    """The issue's default, and the operator's own value (docs/scale-out.md)."""
    assert HubSettings.from_dict({"engine": "x"}).drain_timeout == 20.0
    assert HubSettings.from_dict({"engine": "x", "drain_timeout": 5}).drain_timeout == 5.0
    with pytest.raises(ConfigurationError, match="drain_timeout"):
        HubSettings.from_dict({"engine": "x", "drain_timeout": -1})


def test_health_without_the_metrics_extra_names_it(monkeypatch):
    import importlib.util

    from engines import ScriptEngine

    from hivemind_chat_agent import ChatAgentProtocol
    from hivemind_chat_agent.errors import MissingExtraError
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None
                        if name.split(".")[0] == "prometheus_client" else real(name, *a))
    with pytest.raises(MissingExtraError, match=r'hivemind-chat-agent\[metrics\]'):
        ChatAgentProtocol(config={"engine": "engines:ScriptEngine",
                                  "health": f"127.0.0.1:{free_port()}"}, engine=ScriptEngine())


# ---- a turn is counted once, whatever ends it ----
def test_a_turn_is_counted_once_by_whichever_end_comes_first():
    from test_hub_units import _turn_on_a_loop, _TurnHost
    host = _TurnHost()
    host.metrics = metrics = HubMetrics(lambda: 0, lambda: 0, lambda: 0)
    loop, turn = _turn_on_a_loop(host)
    try:
        host.clock.advance(0.3)
        assert turn.speak("one")
        host.clock.advance(0.2)
        assert turn.stop()                      # the satellite's stop ends it
        assert not turn.finish(failed=True, why="late", reason=EndReason.TIMEOUT)
        assert not turn.finish(failed=False)     # the engine's own end, later
        assert not turn.abandon()
    finally:
        loop.close()
    got = samples(metrics.exposition()[0].decode())
    assert got[("hivemind_chat_turns_total", (("outcome", "stopped"),))] == 1
    assert sum(v for (name, _), v in got.items() if name == "hivemind_chat_turns_total") == 1
    assert got[("hivemind_chat_turn_first_sentence_seconds_sum", ())] == pytest.approx(0.3)
    assert got[("hivemind_chat_turn_seconds_count", ())] == 1
    assert got[("hivemind_chat_turn_seconds_sum", ())] == pytest.approx(0.5)


def test_store_calls_are_timed_by_operation_and_failures_counted():
    class Down:
        def begin(self, *a, **k):
            raise ConversationStoreError("down")

        def ping(self):
            return False
    metrics = HubMetrics(lambda: 0, lambda: 0, lambda: 0)
    store = TimedStore(Down(), metrics)
    with pytest.raises(ConversationStoreError):
        store.begin("s", "")
    assert store.ping() is False
    got = samples(metrics.exposition()[0].decode())
    assert got[("hivemind_chat_store_seconds_count", (("op", "begin"),))] == 1
    assert got[("hivemind_chat_store_seconds_count", (("op", "ping"),))] == 1
    assert got[("hivemind_chat_store_errors_total", ())] == 2


def test_the_secret_is_timed_at_its_first_read_only_and_a_failed_read_is_tried_again():
    """The hub asks for the secret at every message; the stores keep it once read, so only
    the read that reaches the store is a store call (and one that failed is tried again)."""
    class Keeps:
        reads = 0

        def secret(self):
            Keeps.reads += 1
            if Keeps.reads == 1:
                raise ConversationStoreError("down")
            return b"s" * 32
    metrics = HubMetrics(lambda: 0, lambda: 0, lambda: 0)
    store = TimedStore(Keeps(), metrics)
    with pytest.raises(ConversationStoreError):
        store.secret()
    assert [store.secret() for _ in range(5)] == [b"s" * 32] * 5
    assert Keeps.reads == 2
    got = samples(metrics.exposition()[0].decode())
    assert got[("hivemind_chat_store_seconds_count", (("op", "secret"),))] == 2
    assert got[("hivemind_chat_store_errors_total", ())] == 1


def test_a_store_operation_has_a_series_from_its_first_call_only():
    metrics = HubMetrics(lambda: 0, lambda: 0, lambda: 0)
    text = metrics.exposition()[0].decode()
    assert "hivemind_chat_store_seconds_count" not in text
    assert "# TYPE hivemind_chat_store_seconds histogram" in text     # the family is declared
    metrics.store_call("begin", 0.001, False)
    got = samples(metrics.exposition()[0].decode())
    ops = {dict(labels)["op"] for (name, labels) in got
           if name == "hivemind_chat_store_seconds_count"}
    assert ops == {"begin"}


def test_a_timed_store_has_every_turns_operations_from_the_start():
    """begin and finish are asked by every turn: made when the store is wrapped, at 0, so
    that rate() counts the first turn's (a series that appears at 1 has nothing to count
    from)."""
    metrics = HubMetrics(lambda: 0, lambda: 0, lambda: 0)
    TimedStore(object(), metrics)
    got = samples(metrics.exposition()[0].decode())
    ops = {dict(labels)["op"]: value for (name, labels), value in got.items()
           if name == "hivemind_chat_store_seconds_count"}
    assert ops == {"begin": 0, "finish": 0}


def test_every_operation_a_timed_store_times_is_in_the_contract():
    """The `op` label's values are docs/metrics.md's (metrics.STORE_OPS): a call named
    otherwise would make a series no dashboard knows."""
    from hivemind_chat_agent.hub import metrics as module

    class Answers:
        def __getattr__(self, name):
            return lambda *args, **kwargs: None if name != "ping" else True

    class Seen(module.NoMetrics):
        ops = set()

        def store_call(self, op, seconds, failed):
            self.ops.add(op)
    seen = Seen()
    store = TimedStore(Answers(), seen)
    for name in ("begin", "finish", "history", "record", "keep_session", "secret",
                 "claim_turn", "take_over", "turn_record", "unclaim", "ping"):
        getattr(store, name)(*(["s", "t"] if name in ("begin", "take_over", "turn_record",
                                                     "claim_turn", "unclaim") else
                               [] if name in ("secret", "ping") else ["s"]))
    assert seen.ops <= set(module.STORE_OPS)
    assert len(seen.ops) == len(module.STORE_OPS)     # and each of the contract's is timed


def test_two_plugins_in_one_process_count_apart():
    one, two = (HubMetrics(lambda: 0, lambda: 0, lambda: 0) for _ in range(2))
    one.turn_ended("answered", 0.1)
    assert samples(one.exposition()[0].decode())[
        ("hivemind_chat_turns_total", (("outcome", "answered"),))] == 1
    assert samples(two.exposition()[0].decode())[
        ("hivemind_chat_turns_total", (("outcome", "answered"),))] == 0


# ---- the HTTP edge, on a real socket ----
@pytest.fixture
def edge():
    state = {"ready": Verdict(200)}
    metrics = HubMetrics(lambda: 2, lambda: 1, lambda: 0)
    server = HealthServer("127.0.0.1", free_port(), lambda: state["ready"], metrics.exposition,
                          AllowList(), caps=Caps(connections=3, connections_per_peer=3),
                          deadline=4 * UNIT).start()
    server.state = state
    yield server
    server.stop()


def ask(server, raw: bytes, timeout: float = 10.0) -> bytes:
    with socket.create_connection(server.address, timeout=timeout) as s:
        s.sendall(raw)
        return read_all(s)


def read_all(s) -> bytes:
    chunks = []
    while True:
        chunk = s.recv(65536)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def get(path, host="127.0.0.1:8008", method="GET", extra=""):
    return f"{method} {path} HTTP/1.1\r\nHost: {host}\r\n{extra}\r\n".encode()


def status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


def test_the_three_paths(edge):
    assert status(ask(edge, get("/healthz"))) == 200
    assert ask(edge, get("/readyz")).endswith(b'{"ready": true}')
    edge.state["ready"] = readiness(False, True, False)
    answer = ask(edge, get("/readyz", host="localhost"))
    assert status(answer) == 503 and b'"reason": "store_unavailable"' in answer
    text = ask(edge, get("/metrics")).split(b"\r\n\r\n", 1)[1].decode()
    got = samples(text)
    assert got[("hivemind_chat_sessions", ())] == 2 and got[("hivemind_chat_satellites", ())] == 1
    assert {labels for (name, labels) in got if name == "hivemind_chat_turns_total"} == \
        {(("outcome", o),) for o in OUTCOMES}


def test_an_attacker_on_loopback_gets_refusals_and_nothing_else(edge):
    assert status(ask(edge, get("/metrics", host="evil.example:8008"))) == 421   # rebinding
    assert status(ask(edge, b"GET /metrics HTTP/1.0\r\n\r\n")) == 421           # no Host
    assert status(ask(edge, get("/metrics", extra="Origin: https://evil.example\r\n"))) == 403
    posted = ask(edge, get("/readyz", method="POST", extra="Content-Length: 0\r\n"))
    assert status(posted) == 405 and b"Allow: GET" in posted
    assert status(ask(edge, get("/admin"))) == 404
    assert status(ask(edge, get("/metrics/../readyz"))) == 404
    assert status(ask(edge, b"\x16\x03\x01 garbage\r\n\r\n")) == 400
    assert ask(edge, b"GET /" + b"a" * 20000) == b""         # a head over 8 KiB: cut


def test_a_slow_client_is_cut_at_the_deadline_whatever_it_trickles(edge):
    with socket.create_connection(edge.address, timeout=30) as s:
        started = time.monotonic()
        cut = threading.Event()

        def trickle():
            for byte in b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Slow: " + b"x" * 500:
                if cut.is_set():
                    return
                try:
                    s.send(bytes([byte]))
                except OSError:
                    return
                cut.wait(UNIT / 10)
        sender = threading.Thread(target=trickle)
        sender.start()
        try:
            assert read_all(s) == b""                 # closed unanswered
        finally:
            cut.set()
            sender.join()
        assert 4 * UNIT * 0.9 <= time.monotonic() - started < 4 * UNIT + 10 * UNIT


def test_connections_over_the_cap_are_closed_at_accept(edge):
    idle = [socket.create_connection(edge.address, timeout=10) for _ in range(3)]
    try:
        assert wait_until(lambda: len(edge._open) == 3)
        assert ask(edge, get("/healthz")) == b""      # a fourth: closed before it is read
    finally:
        for s in idle:
            s.close()
    assert wait_until(lambda: not edge._open)
    assert status(ask(edge, get("/healthz"))) == 200


def test_stop_releases_the_port_and_every_thread(edge):
    idle = socket.create_connection(edge.address, timeout=10)    # a connection still open
    assert wait_until(lambda: len(edge._open) == 1)
    before = {t.name for t in threading.enumerate()}
    assert "hivemind-chat-health" in before
    started = time.monotonic()
    edge.stop()
    assert time.monotonic() - started < 4 * UNIT     # the open connection was cut, not waited
    assert "hivemind-chat-health" not in {t.name for t in threading.enumerate()}
    assert not edge._server._threads or not any(t.is_alive() for t in edge._server._threads)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(edge.address, timeout=10)
    with socket.socket() as again:    # the port is free again (as a restarted hub binds it)
        again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        again.bind(edge.address)
        again.listen()
    idle.close()


def test_a_parsed_address_of_the_setting():
    assert health.parse_address("127.0.0.1:8008") == ("127.0.0.1", 8008)
    assert health.parse_address("8008") == ("127.0.0.1", 8008)
    for wrong in ("", "host:", "127.0.0.1:0", "127.0.0.1:70000"):
        with pytest.raises(ValueError):
            health.parse_address(wrong)
