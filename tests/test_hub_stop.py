"""Barge-in through our hub plugin inside the real `hivemind-core listen`, on both generations:
a satellite's `ChatTurn.terminate()` reaches the hub's engine (tests/engines.py records when its
answer's generator closed and when `stop_session` was called, on CLOCK_MONOTONIC, which every
process here shares), the satellite hears nothing more of that answer, and the next turn runs.
"""
import json
import time

import pytest
from hubs import HubProcess, plugin_config
from ovos_bus_client.message import Message
from ovos_bus_client.session import Session
from ovos_plugin_manager.templates.agents import AgentMessage, MessageRole
from raw_satellite import HUB_GENERATIONS, RawSatellite
from waiting import UNIT, hold_still, wait_until

from hivemind_chat_agent import HiveMindChatAgent, HubEngineError, TurnStatus


def user(text):
    return [AgentMessage(role=MessageRole.USER, content=text)]


@pytest.fixture(scope="module", params=HUB_GENERATIONS)
def generation(request):
    return request.param


@pytest.fixture(scope="module")
def stop_hub(generation):
    hub = HubProcess(plugin_config(timeout=5, workers=4), generation=generation).start()
    yield hub
    hub.cleanup()


def engine_stops(agent):
    """What the hub's engine recorded, asked from a session of its own."""
    return [tuple(s) for s in json.loads(agent.get_response("stops", session_id="probe"))]


def test_barge_in_stops_the_engine_and_the_next_turn_runs(stop_hub, make_agent):
    agent = make_agent(stop_hub.add_client().agent_config(timeout=10))
    seen = len(engine_stops(agent))
    heard_between_turns = []
    sub = agent.subscribe("barge", callback=heard_between_turns.append)
    turn = agent.begin(user("talk 100 0.1"), session_id="barge")
    sentences = iter(turn)
    assert [next(sentences), next(sentences)] == ["talk sentence 1", "talk sentence 2"]
    stopped_at = time.monotonic()
    turn.terminate()
    assert turn.status is TurnStatus.CANCELLED and turn.is_done()
    # the plugin answers the stop like a skill does, with our turn's tag
    assert wait_until(lambda: turn.get_snapshot()["hub_stopped_at"]), turn.get_snapshot()
    # the engine was told (stop_session) and its answer ended: it returned, or its generator
    # was closed at its next sentence
    new = wait_until(lambda: (lambda s: s if {"stop_session"} < {k for k, _ in s} else None)(
        engine_stops(agent)[seen:]))
    assert new and {"returned", "closed"} & {kind for kind, _ in new}, new
    assert all(0 <= when - stopped_at < 4 * UNIT for _, when in new), (stopped_at, new)
    assert agent.get_response("count 2", session_id="barge") == "sentence 1\nsentence 2"
    hold_still()                 # a late sentence of the stopped answer would be here by now
    assert not any("talk" in s for s in heard_between_turns), heard_between_turns
    sub.close()


def test_a_stock_satellites_stop_gets_the_turns_end_and_nothing_more(stop_hub):
    """What goes over the wire, seen by a plain hivemind-bus-client satellite: after its
    mycroft.stop the stopped turn gets exactly its `handled` and the plugin's stop answer,
    never another sentence; the next utterance is answered normally."""
    sat = RawSatellite(stop_hub.add_client(name="raw-stop"))
    try:
        session = Session(sat.client.session_id).serialize()
        sat.received.clear()
        sat.handled.clear()
        sat.client.emit(Message("recognizer_loop:utterance", {"utterances": ["talk 50 0.1"]},
                                {"session": session}))
        assert wait_until(lambda: sat.received.count("speak") >= 2)
        sat.client.emit(Message("mycroft.stop", {}, {"session": session}))
        assert sat.handled.wait(2)
        spoken = sat.received.count("speak")
        probe = HiveMindChatAgent(stop_hub.add_client(name="raw-stop-probe").agent_config())
        try:        # the engine's answer ended; then a UNIT for a sentence still under way
            assert wait_until(lambda: probe.get_response("talking", session_id="p") == "0")
        finally:
            probe.shutdown()
        hold_still()
        after = [t for t in sat.received if t != "recognizer_loop:utterance"]
        assert after.count("speak") == spoken and after.count("ovos.utterance.handled") == 1
        assert "hivemind-chat-agent-plugin.stop.response" in after, after
        assert sat.ask("count 2") == ["speak", "speak", "ovos.utterance.handled"]
    finally:
        sat.close()


def test_a_stop_between_turns_or_from_another_satellite_stops_nothing(stop_hub, make_agent):
    a = make_agent(stop_hub.add_client().agent_config(timeout=10))
    b = make_agent(stop_hub.add_client().agent_config(timeout=10))
    seen = len(engine_stops(a))
    turn = a.begin(user("talk 8 0.1"), session_id="same-name")
    b_turn = b.begin(user("talk 2 0.1"), session_id="same-name")
    b_turn.terminate()                            # b's stop: never a's answer
    assert turn.full_response(timeout=5).count("talk sentence") == 8
    assert turn.status is TurnStatus.ANSWERED
    assert a.stop_session("same-name") is False   # nothing running
    assert len([k for k, _ in engine_stops(a)[seen:] if k == "stop_session"]) == 1


def test_an_engine_failure_is_a_failed_turn(stop_hub, make_agent):
    agent = make_agent(stop_hub.add_client().agent_config(timeout=10))
    turn = agent.begin(user("raise"), session_id="failing")
    with pytest.raises(HubEngineError):
        turn.full_response(timeout=5)
    assert turn.status is TurnStatus.FAILED
    assert isinstance(turn.get_exception(), HubEngineError)
    assert turn.get_snapshot()["status"] == "failed"
    not_understood = agent.begin(user("empty"), session_id="failing")
    assert not_understood.full_response(timeout=5) == ""
    assert not_understood.status is TurnStatus.NOT_UNDERSTOOD


def test_a_relay_passes_the_stop_upstream(generation):
    """satellite -> hub B (this plugin, engine hivemind-chat-agent) -> hub A (this plugin,
    the script engine): the satellite's stop ends B's turn, B's agent stops its own turn, and
    A's engine sees the stop."""
    hub_a = HubProcess(plugin_config(timeout=5), generation=generation).start()
    hub_b = satellite = None
    try:
        hub_b = HubProcess(plugin_config(engine="hivemind-chat-agent",
                                         engine_config=hub_a.add_client().agent_config(),
                                         timeout=5), generation=generation).start()
        satellite = HiveMindChatAgent(hub_b.add_client().agent_config(timeout=10))
        probe = HiveMindChatAgent(hub_a.add_client().agent_config(timeout=10))
        seen = len(engine_stops(probe))
        turn = satellite.begin(user("talk 100 0.1"), session_id="relayed")
        assert next(iter(turn)) == "talk sentence 1"
        stopped_at = time.monotonic()
        turn.terminate()
        new = wait_until(lambda: engine_stops(probe)[seen:], timeout=5)
        assert new and all(0 <= when - stopped_at < 7 * UNIT for _, when in new), new
        assert satellite.get_response("count 2", session_id="relayed") == \
            "sentence 1\nsentence 2"
        probe.shutdown()
    finally:
        if satellite is not None:
            satellite.shutdown()
        if hub_b is not None:
            hub_b.cleanup()
        hub_a.cleanup()
