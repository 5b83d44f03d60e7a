"""The OVOS mode as an operated service (hub/ovos_operations.py), without sockets to OVOS: a drain
counted by the routes (an utterance counts until ovos-core handled it), what an utterance
hears while the hub drains, how each utterance's end is counted in the metrics, and the health
endpoint's `/readyz` following the bus and the drain (a real socket on 127.0.0.1). A genuine
hub draining in OVOS mode: tests/test_ovos_mode_drain.py."""
import json
import socket
import threading

import pytest
from hubs import free_port
from test_hub_health import samples
from test_ovos_mode_shell import FakeSatellite, protocol_with, utterance
from waiting import wait_until

from hivemind_chat_agent.core.drain import Drain
from hivemind_chat_agent.core.health import ovos_readiness
from hivemind_chat_agent.core.ovos_route_terms import RouteLimits, Satellite
from hivemind_chat_agent.core.ovos_routes import OvosRoutes
from hivemind_chat_agent.errors import ConfigurationError
from hivemind_chat_agent.hub.draining import DRAINING_SPEECH
from hivemind_chat_agent.hub.ovos_settings import OvosModeSettings


# ---- the plan, counted by the shell ----
def test_a_counted_drain_closes_each_connection_once_its_utterances_were_handled():
    plan = Drain(timeout=10)
    plan.running_now({"a": 1, "b": 0}, 0.0, ["a", "b"])      # serving: no decision
    decision = plan.stop(0.0, ["a", "b", "c"])
    assert decision.close == {"b", "c"} and not decision.exit
    assert plan.running_now({"a": 1}, 1.0, ["a"]).close == frozenset()
    decision = plan.running_now({}, 2.0, ["a"])
    assert decision.exit and decision.close == {"a"} and decision.cut == 0


def test_a_counted_drain_cuts_what_is_still_at_ovos_at_the_timeout():
    plan = Drain(timeout=1)
    plan.running_now({"a": 2}, 0.0, ["a"])
    assert plan.stop(0.0, ["a"]).close == frozenset()
    decision = plan.running_now({"a": 2}, 1.0, ["a"])
    assert decision.exit and decision.cut == 2


# ---- the routes' counts and outcomes ----
class Recorder:
    def __init__(self):
        self.firsts, self.ends = [], []

    def first_sentence(self, seconds):
        self.firsts.append(seconds)

    def turn_ended(self, outcome, seconds):
        self.ends.append((outcome, seconds))


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def sat(conn="c1", client="key-a", session="ns:kitchen"):
    return Satellite(conn, client, f"{client}::{conn}", "kitchen", session, object())


def routed(routes, sender, msg_type, data=None):
    return routes.route({"type": msg_type, "data": data or {},
                         "context": {"destination": sender.peer,
                                     "session": {"session_id": sender.session_id}}})


def sent(routes, sender, text="hello"):
    assert routes.accept(sender, {"type": "recognizer_loop:utterance",
                                  "data": {"utterances": [text]}, "context": {}}) is None
    routes.next_outbound()


def test_utterances_count_for_their_connection_until_handled():
    clock = Clock()
    routes = OvosRoutes(RouteLimits(), clock)
    routes.bus_connected()
    a, b = sat("c1"), sat("c2", session="ns:hall")
    sent(routes, a)
    assert routes.accept(b, {"type": "recognizer_loop:utterance", "data": {},
                             "context": {}}) is None          # queued, not written yet
    assert routes.utterances_by_connection() == {"c1": 1, "c2": 1}
    routed(routes, a, "ovos.utterance.handled")
    assert routes.utterances_by_connection() == {"c2": 1}


def test_each_utterance_is_counted_once_by_how_it_ended():
    clock, metrics = Clock(), Recorder()
    routes = OvosRoutes(RouteLimits(in_flight_timeout=30), clock, metrics=metrics)
    routes.bus_connected()
    a = sat()
    sent(routes, a)
    clock.t += 0.25
    routed(routes, a, "speak", {"utterance": "Hello"})
    routed(routes, a, "speak", {"utterance": "again"})          # timed once
    clock.t += 0.25
    routed(routes, a, "ovos.utterance.handled")
    sent(routes, a)
    routed(routes, a, "speak", {"utterance": "For how long?", "expect_response": True})
    routed(routes, a, "ovos.utterance.handled")
    sent(routes, a)
    routed(routes, a, "complete_intent_failure")
    routed(routes, a, "ovos.utterance.handled")
    sent(routes, a)
    clock.t += 31
    routes.accept(a, {"type": "mycroft.stop", "data": {}, "context": {}})   # sweeps
    routes.next_outbound()
    sent(routes, a)
    routes.closed("c1")                                          # left before its end
    assert metrics.firsts == [0.25, 0.0]
    assert [o for o, _ in metrics.ends] == ["answered", "asked", "not_understood",
                                            "timed_out", "stopped"]
    assert metrics.ends[0][1] == 0.5


# ---- the shell: refusals while draining, the drain, the endpoint ----
def test_while_draining_a_stock_satellite_hears_why_and_ours_gets_the_refusal_alone():
    stock, ours = FakeSatellite("sat::a::kitchen", "key-a"), FakeSatellite("sat::b::hall",
                                                                           "key-b")
    protocol = protocol_with(stock, ours)
    try:
        protocol.operations._draining.set()
        protocol.bus.emit(utterance(stock))
        tagged = utterance(ours)
        tagged.context["hivemind_chat_turn"] = "t-1"
        protocol.bus.emit(tagged)
        protocol.loop.run()
        assert [m.msg_type for m in stock.written] == [
            "speak", "complete_intent_failure", "ovos.utterance.handled"]
        assert stock.written[0].data["utterance"] == DRAINING_SPEECH
        assert stock.written[1].data["reason"] == "draining"
        assert [m.msg_type for m in ours.written] == ["complete_intent_failure",
                                                      "ovos.utterance.handled"]
        assert ours.written[0].context["hivemind_chat_turn"] == "t-1"
        assert protocol.ovos.sent == []              # nothing reached OVOS
    finally:
        protocol.shutdown()


def handled_for(protocol, sat, index=0):
    sid = protocol.ovos.sent[index]["context"]["session"]["session_id"]
    return json.dumps({"type": "ovos.utterance.handled", "data": {},
                       "context": {"destination": sat.peer, "session": {"session_id": sid}}})


def test_the_drain_waits_for_ovos_to_handle_what_it_has_then_shuts_down():
    busy, idle = FakeSatellite("sat::a::kitchen", "key-a"), FakeSatellite("sat::b::hall",
                                                                          "key-b")
    closed = []
    for s in (busy, idle):
        s.disconnect = lambda code, reason, s=s: closed.append((s.peer, code))
    protocol = protocol_with(busy, idle, drain_timeout=10)
    try:
        protocol.bus.emit(utterance(busy))
        assert wait_until(lambda: protocol.ovos.sent, 5)
        report = {}
        drain = threading.Thread(target=lambda: report.update(r=protocol.drain()))
        drain.start()
        assert wait_until(lambda: protocol.operations.draining, 5)
        assert wait_until(lambda: protocol.loop.callbacks, 5)
        protocol.loop.run()
        assert closed == [(idle.peer, 1001)]          # idle at once, busy not yet
        protocol.ovos.on_message(handled_for(protocol, busy).encode())
        assert wait_until(lambda: len(closed) == 2 or protocol.loop.run(), 5)
        drain.join(5)
        assert report["r"].finished == 1 and report["r"].cut == 0
        assert not protocol.serving
    finally:
        protocol.shutdown()


def http_get(port, path):
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), body.decode()


def test_readyz_follows_the_bus_and_the_drain_and_metrics_count_the_utterances():
    port = free_port()
    sat = FakeSatellite("sat::a::kitchen", "key-a")
    protocol = protocol_with(sat, health=f"127.0.0.1:{port}")
    try:
        assert http_get(port, "/readyz") == (200, '{"ready": true}')
        protocol.bus.emit(utterance(sat))
        assert wait_until(lambda: protocol.ovos.sent, 5)
        got = samples(http_get(port, "/metrics")[1])
        assert got[("hivemind_chat_turns_in_flight", ())] == 1
        assert got[("hivemind_chat_sessions", ())] == 1
        protocol.ovos.on_message(handled_for(protocol, sat).encode())
        protocol.ovos.connected.clear()
        protocol.ovos.on_down()
        status, body = http_get(port, "/readyz")
        assert status == 503 and json.loads(body)["reason"] == "ovos_unavailable"
        protocol.bus.emit(utterance(sat))                 # refused: the bus is down
        got = samples(http_get(port, "/metrics")[1])
        assert got[("hivemind_chat_turns_total", (("outcome", "answered"),))] == 1
        assert got[("hivemind_chat_turns_total", (("outcome", "failed"),))] == 1
        assert got[("hivemind_chat_turns_in_flight", ())] == 0
        protocol.operations._draining.set()
        status, body = http_get(port, "/readyz")
        assert status == 503 and json.loads(body)["reason"] == "draining"
        assert http_get(port, "/readyz?not_ready=404")[0] == 404     # config/haproxy.cfg's
    finally:
        protocol.shutdown()
    with pytest.raises(OSError):                          # the port went with the plugin
        socket.create_connection(("127.0.0.1", port), timeout=1)


def test_ready_when_ovos_takes_utterances_and_not_draining():
    assert ovos_readiness(True, "", False).status == 200
    down = ovos_readiness(False, "the hub's OVOS messagebus is not connected", False)
    assert down.status == 503 and "messagebus" in down.message
    assert ovos_readiness(True, "", True).status == 503


def test_the_ovos_modes_health_is_closed_by_default():
    with pytest.raises(ConfigurationError, match="health_allow_from"):
        OvosModeSettings.from_dict({"mode": "ovos", "health": "0.0.0.0:8008"})
    with pytest.raises(ConfigurationError, match="drain_timeout"):
        OvosModeSettings.from_dict({"mode": "ovos", "drain_timeout": -1})
    assert OvosModeSettings.from_dict({"mode": "ovos"}).health == ""
