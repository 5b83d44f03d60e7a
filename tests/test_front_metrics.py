"""The fronts' metrics without sockets or hubs (bridges/front_metrics.py, docs/metrics.md):
the outcome label of a front's turn, what FrontMetrics counts as the agent's observer, the
pool's reconnects and the driver's resends as they happen, and GuardedApp counting requests
by status and serving /metrics only past the front's own checks. The same with genuine hubs
and the real clients: tests/test_front_metrics_hub.py."""
import asyncio
import json

import pytest
from fake_clock import FakeClock
from fake_connections import SharingConnection, make_pool
from ovos_bus_client.session import Session

from hivemind_chat_agent.bridges.front_metrics import FrontMetrics, metrics_for
from hivemind_chat_agent.bridges.http_front import GuardedApp
from hivemind_chat_agent.client.observer import ClientObserver
from hivemind_chat_agent.core.front_guard import FrontGuard, Keys
from hivemind_chat_agent.core.health import OUTCOMES, front_outcome
from hivemind_chat_agent.core.outcomes import TurnStatus


class Recorder(ClientObserver):
    def __init__(self):
        self.events = []

    def turn_began(self):
        self.events.append("began")

    def first_sentence(self, seconds):
        self.events.append("first")

    def turn_ended(self, status, seconds):
        self.events.append(("ended", status))

    def reconnected(self):
        self.events.append("reconnected")

    def resent(self, reason):
        self.events.append(("resent", reason))


def value(metrics, name, **labels):
    return metrics.registry.get_sample_value(name, labels) or 0.0


def test_every_turn_status_maps_to_one_of_the_hubs_outcomes():
    expected = {TurnStatus.ANSWERED: "answered", TurnStatus.ASKED: "asked",
                TurnStatus.NOT_UNDERSTOOD: "not_understood", TurnStatus.CANCELLED: "stopped",
                TurnStatus.TIMED_OUT: "timed_out", TurnStatus.LOST: "failed",
                TurnStatus.FAILED: "failed", TurnStatus.WAITING: "failed",
                TurnStatus.SPEAKING: "failed"}
    for status, outcome in expected.items():
        assert front_outcome(status) == outcome, status
    assert front_outcome(None) == "failed"          # never sent: no connection, a bad key
    assert set(expected.values()) <= set(OUTCOMES)


def test_front_metrics_counts_turns_in_flight_histograms_reconnects_and_resends():
    m = FrontMetrics("openai")
    for outcome in OUTCOMES:                         # every label there from the start, at 0
        assert m.registry.get_sample_value("hivemind_chat_turns_total",
                                           {"front": "openai", "outcome": outcome}) == 0.0
    m.turn_began()
    m.turn_began()
    assert value(m, "hivemind_chat_turns_in_flight", front="openai") == 2
    m.first_sentence(0.2)
    m.turn_ended(TurnStatus.ANSWERED, 0.3)
    m.turn_ended(None, 0.01)
    assert value(m, "hivemind_chat_turns_in_flight", front="openai") == 0
    assert value(m, "hivemind_chat_turns_total", front="openai", outcome="answered") == 1
    assert value(m, "hivemind_chat_turns_total", front="openai", outcome="failed") == 1
    assert value(m, "hivemind_chat_turn_seconds_count", front="openai") == 2
    assert value(m, "hivemind_chat_turn_first_sentence_seconds_count", front="openai") == 1
    m.reconnected()
    m.resent("lost")
    m.resent("draining")
    m.resent("draining")
    assert value(m, "hivemind_chat_client_reconnects_total", front="openai") == 1
    assert value(m, "hivemind_chat_client_resends_total", front="openai", reason="draining") == 2
    assert value(m, "hivemind_chat_client_resends_total", front="openai", reason="unsent") == 0
    m.request(200)
    m.request(200)
    m.request(401)
    assert value(m, "hivemind_chat_front_requests_total", front="openai", status="200") == 2
    assert value(m, "hivemind_chat_front_requests_total", front="openai", status="401") == 1
    body, content_type = m.exposition()
    assert b'hivemind_chat_front_requests_total{front="openai",status="401"} 1.0' in body
    assert content_type.startswith("text/plain")
    with pytest.raises(ValueError):
        FrontMetrics("ftp")


def test_wyoming_statuses_are_there_from_the_start():
    m = FrontMetrics("wyoming")
    assert m.registry.get_sample_value("hivemind_chat_front_requests_total",
                                       {"front": "wyoming", "status": "handled"}) == 0.0


def test_metrics_are_off_unless_asked():
    assert metrics_for("openai", False) is None
    assert isinstance(metrics_for("openai", True), FrontMetrics)


def test_metrics_asked_without_the_extra_is_an_error_naming_it(monkeypatch):
    from hivemind_chat_agent import extras
    from hivemind_chat_agent.errors import MissingExtraError
    monkeypatch.setattr(extras, "missing_modules", lambda extra: ["prometheus_client"])
    with pytest.raises(MissingExtraError, match=r"\[metrics\]"):
        metrics_for("a2a", True)


# ---- the client: where it reconnects and resends ----

def test_a_reconnect_is_counted_once_per_broken_connection_own_and_shared():
    own = make_pool(clock=FakeClock(), max_connections=4, idle_timeout=10)
    own.observer = seen = Recorder()
    a = own.acquire(Session("a"))
    own.release(a)
    assert own.acquire(Session("a")) is a and seen.events == []   # reuse: no reconnect
    own.release(a)
    a.alive = False                                  # found dead at the next turn
    b = own.acquire(Session("a"))
    own.release(b)
    own.broke("a", b)                                # lost mid-turn, then discarded
    own.discard("a")
    own.release(own.acquire(Session("a")))
    own.release(own.acquire(Session("new")))         # a new session's connect is none
    assert seen.events == ["reconnected", "reconnected"]
    own.close_all()

    shared = make_pool(SharingConnection, clock=FakeClock(), max_connections=2,
                       idle_timeout=10, shared_connections=4)
    shared.observer = seen = Recorder()
    x = shared.acquire(Session("s1"))
    assert shared.acquire(Session("s2")) is x
    shared.release(x)
    shared.release(x)
    x.alive = False                                  # the hub went: both sessions were on it
    y = shared.acquire(Session("s1"))
    assert shared.acquire(Session("s2")) is y and y is not x
    assert seen.events == ["reconnected"]            # one connection replaced one
    shared.release(y)
    shared.release(y)
    a, b = shared.acquire(Session("s1")), shared.acquire(Session("s2"))
    assert a is b is y
    y.alive = False                                  # both turns on it are lost
    for sid in ("s1", "s2"):                         # as each turn's driver reports it
        shared.broke(sid, y)
        shared.discard(sid)
        shared.release(y)
    z = shared.acquire(Session("s1"))
    assert shared.acquire(Session("s2")) is z
    assert seen.events == ["reconnected", "reconnected"]   # y replaced once, for both
    shared.close_all()


def test_the_driver_reports_the_turn_its_resends_and_the_broken_connections(tmp_path):
    """A draining replica refuses twice, the third attempt answers (test_turns' scenario):
    the observer hears two resends (draining), the sentence and one answered end."""
    import threading
    from types import SimpleNamespace

    from hivemind_bus_client.message import HiveMessage, HiveMessageType
    from ovos_bus_client.message import Message
    from test_connection_routing import ready_connection, say
    from test_turns import Host, OneConnection

    from hivemind_chat_agent.client.chat_turn import ChatTurn
    from hivemind_chat_agent.client.turn_driver import DRAINING_PAUSE, TurnDriver
    from hivemind_chat_agent.core.protocol_names import TURN_TAG_KEY
    clock = FakeClock()
    conn = ready_connection(tmp_path, clock=clock)
    pool = OneConnection(conn, clock)
    host = Host(pool, conn.config)
    host.observer = seen = Recorder()
    session_lock = SimpleNamespace(lock=threading.Lock())
    session_lock.lock.acquire()
    driver = TurnDriver(host, "mine", session_lock)
    turn = driver.turn = ChatTurn("mine", "hello", "en-US")
    driver.send(Session("mine"), "hello")
    tag = driver.handle.turn.tag

    def bus(msg_type, data):
        conn.on_socket_message(HiveMessage(HiveMessageType.BUS, payload=Message(
            msg_type, data, {"session": {"session_id": "mine"}, TURN_TAG_KEY: tag})))

    def refuse():
        bus("complete_intent_failure", {"reason": "draining", "message": "restarting"})
        bus("ovos.utterance.handled", {"turn_records": True})
    clock.call_later(1, refuse)
    clock.call_later(2, refuse)
    clock.call_later(3 + DRAINING_PAUSE, lambda: (say(conn, "hi there", tag),
                                                 bus("ovos.utterance.handled", {})))
    driver.adopt()
    driver.run()
    assert turn.status is TurnStatus.ANSWERED
    assert seen.events == [("resent", "draining"), ("resent", "draining"), "first",
                           ("ended", TurnStatus.ANSWERED)]
    assert pool.broken == ["mine", "mine"]


# ---- the HTTP edge: requests by status, /metrics behind the guard ----

async def _call(app, path, method="GET", headers=(), body=b""):
    scope = {"type": "http", "method": method, "path": path, "client": ("127.0.0.1", 5000),
             "headers": [(k.encode(), v.encode()) for k, v in headers]}
    sent = []
    fed = []

    async def receive():
        if not fed:
            fed.append(True)
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.sleep(3600)

    async def send(message):
        sent.append(message)
    await app(scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    data = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], data


async def _inner(scope, receive, send):
    """The front's own routes: 404 for everything, as Starlette answers unknown paths."""
    await send({"type": "http.response.start", "status": 404, "headers": []})
    await send({"type": "http.response.body", "body": b"{}"})


def _shape(refusal):
    return {"error": refusal.code}


def test_the_http_edge_counts_every_request_and_guards_metrics():
    m = FrontMetrics("mcp")
    app = GuardedApp(_inner, FrontGuard("127.0.0.1", Keys(["sesame"])), _shape, metrics=m)
    local = [("host", "127.0.0.1:8765")]
    key = [("authorization", "Bearer sesame")]

    async def run():
        assert (await _call(app, "/metrics", headers=local))[0] == 401          # no key
        assert (await _call(app, "/metrics", headers=[("host", "evil.example")]
                            + key))[0] == 421                                    # rebound
        assert (await _call(app, "/metrics", headers=local + key + [
            ("origin", "https://evil.example")]))[0] == 403                      # a web page
        assert (await _call(app, "/metrics", "POST", local + key + [
            ("content-type", "application/json")], b"{}"))[0] == 405
        assert (await _call(app, "/elsewhere", headers=local + key))[0] == 404  # the app's
        return await _call(app, "/metrics", headers=local + key)
    status, body = asyncio.run(run())
    assert status == 200
    from prometheus_client.parser import text_string_to_metric_families
    samples = {(s.name, s.labels.get("status")): s.value
               for family in text_string_to_metric_families(body.decode())
               for s in family.samples if s.name == "hivemind_chat_front_requests_total"}
    # the scrape itself is counted once its answer is done, after the body was made
    assert samples == {("hivemind_chat_front_requests_total", "401"): 1,
                       ("hivemind_chat_front_requests_total", "421"): 1,
                       ("hivemind_chat_front_requests_total", "403"): 1,
                       ("hivemind_chat_front_requests_total", "405"): 1,
                       ("hivemind_chat_front_requests_total", "404"): 1}
    assert value(m, "hivemind_chat_front_requests_total", front="mcp", status="200") == 1


def test_without_metrics_the_path_is_the_apps_and_nothing_is_counted():
    app = GuardedApp(_inner, FrontGuard("127.0.0.1"), _shape)
    status, body = asyncio.run(_call(app, "/metrics", headers=[("host", "localhost")]))
    assert status == 404 and json.loads(body) == {}
