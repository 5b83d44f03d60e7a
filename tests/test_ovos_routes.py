"""core/ovos_routes.OvosRoutes, the OVOS mode's decisions, without sockets: sessions namespaced
both ways, replies only to the satellite they name and own, bounds, fairness between clients,
and failures for utterances the bus cannot take."""
import pytest
from fake_clock import FakeClock

from hivemind_chat_agent.core.ovos_probation import Probation
from hivemind_chat_agent.core.ovos_replies import failure_replies
from hivemind_chat_agent.core.ovos_route_terms import Refusal, RouteLimits, Satellite
from hivemind_chat_agent.core.ovos_routes import OvosRoutes
from hivemind_chat_agent.core.turns import EndReason


def satellite(name="a", session="kitchen", client=None, conn=None):
    return Satellite(conn=conn or f"conn-{name}", client=client or f"key-{name}",
                     peer=f"sat-{name}::{client or name}::{session}",
                     declared_session=session, session_id=f"sat-{client or name}-{session}",
                     handle=f"handle-{conn or name}")


def utterance(sat, text="hello world", tag="t1"):
    return {"type": "recognizer_loop:utterance", "data": {"utterances": [text]},
            "context": {"session": {"session_id": sat.declared_session, "lang": "en-US"},
                        "source": sat.peer, "peer": sat.peer, "hivemind_chat_turn": tag}}


def reply(sat, msg_type="speak", session_id=None, destination=None, source="skills"):
    return {"type": msg_type, "data": {"utterance": "Hello world"},
            "context": {"session": {"session_id": session_id or sat.session_id},
                        "destination": sat.peer if destination is None else destination,
                        "source": source, "hivemind_chat_turn": "t1"}}


@pytest.fixture
def clock():
    return FakeClock(100.0)


LIMITS = RouteLimits(max_queued_per_client=4, max_in_flight_per_session=2,
                     max_in_flight_per_client=3, in_flight_timeout=60,
                     max_sessions_per_client=2, session_ttl=600)


@pytest.fixture
def routes(clock):
    """The bounds alone (no probation after a refusal: its tests make their own)."""
    r = OvosRoutes(LIMITS, clock.now, probation=Probation(seconds=0))
    r.bus_connected()
    return r


def drain(routes):
    out = []
    while routes.has_outbound():
        out.append(routes.next_outbound())
    return out


def test_an_utterance_goes_to_the_bus_under_the_namespaced_session(routes):
    a = satellite("a")
    assert routes.accept(a, utterance(a)) is None
    [out] = drain(routes)
    assert out.message["context"]["session"] == {"session_id": a.session_id, "lang": "en-US"}
    assert out.message["context"]["hivemind_chat_turn"] == "t1"
    assert out.message["data"] == {"utterances": ["hello world"]}


def test_a_reply_comes_back_to_its_satellite_under_its_declared_id(routes):
    a = satellite("a")
    routes.accept(a, utterance(a))
    drain(routes)
    [delivery] = routes.route(reply(a))
    assert delivery.handle == a.handle and delivery.peer == a.peer
    assert delivery.message["context"]["session"]["session_id"] == "kitchen"
    assert delivery.message["context"]["hivemind_chat_turn"] == "t1"


def test_two_satellites_with_the_same_declared_session_never_see_each_others_replies(routes):
    a, b = satellite("a"), satellite("b")     # both declare "kitchen"
    for sat in (a, b):
        routes.accept(sat, utterance(sat))
    drain(routes)
    assert a.session_id != b.session_id
    assert [d.handle for d in routes.route(reply(a))] == [a.handle]
    assert [d.handle for d in routes.route(reply(b))] == [b.handle]
    # a bus message naming b's peer but carrying a's Session reaches nobody
    assert routes.route(reply(a, destination=b.peer)) == []
    # a Session that is no satellite's (the hub's "default") is not read by anyone
    assert routes.route(reply(a, session_id="default")) == []


def test_a_satellites_own_request_echoed_by_the_bus_is_not_delivered(routes):
    a = satellite("a")
    routes.accept(a, utterance(a))
    [out] = drain(routes)
    echo = dict(out.message, context=dict(out.message["context"], destination=a.peer))
    assert routes.route(echo) == []


def test_messages_for_services_and_unknown_peers_go_nowhere(routes):
    a = satellite("a")
    routes.accept(a, utterance(a))
    drain(routes)
    assert routes.route(reply(a, destination="audio")) == []
    assert routes.route(reply(a, destination=[])) == []
    assert routes.route({"type": "speak", "data": {}, "context": "nonsense"}) == []


def test_speech_between_turns_reaches_the_sessions_satellite_after_a_rename(routes):
    a = satellite("a")
    routes.accept(a, utterance(a))
    drain(routes)
    renamed = Satellite(a.conn, a.client, "sat-a::a::other", "other", "sat-a-other", a.handle)
    routes.accept(renamed, utterance(renamed))
    [delivery] = routes.route(reply(a, destination="gone::peer::name"))   # an old alarm
    assert delivery.handle == a.handle
    assert delivery.message["context"]["session"]["session_id"] == "kitchen"


def test_a_closed_connection_gets_nothing_and_its_sessions_are_forgotten(routes):
    a = satellite("a")
    routes.accept(a, utterance(a))
    drain(routes)
    routes.closed(a.conn)
    assert routes.route(reply(a)) == [] and len(routes) == 0 and routes.connections == 0


def test_a_flooding_client_waits_behind_itself_only(routes):
    flood, quiet = satellite("f"), satellite("q")
    for _ in range(4):
        routes.accept(flood, {"type": "recognizer_loop:audio_output_end", "data": {},
                              "context": {"session": {"session_id": "kitchen"}}})
    assert routes.accept(flood, utterance(flood)).reason is EndReason.BUSY   # queue full
    assert routes.accept(quiet, utterance(quiet)) is None
    order = [o.sender.client for o in drain(routes)]
    assert order[:2] == ["key-f", "key-q"]          # the quiet one's turn comes second


def test_a_stop_overtakes_its_clients_backlog(routes):
    a = satellite("a")
    for _ in range(3):
        routes.accept(a, {"type": "recognizer_loop:audio_output_end", "data": {},
                          "context": {}})
    routes.accept(a, {"type": "mycroft.stop", "data": {}, "context": {}})
    assert routes.next_outbound().message["type"] == "mycroft.stop"


def test_utterances_in_flight_are_bounded_per_session_and_per_client(routes, clock):
    a = satellite("a", session="one")
    a2 = satellite("a", session="two")
    assert routes.accept(a, utterance(a)) is None
    assert routes.accept(a, utterance(a)) is None
    refusal = routes.accept(a, utterance(a))
    assert refusal.reason is EndReason.BUSY and "session" in refusal.why
    assert routes.accept(a2, utterance(a2)) is None
    refusal = routes.accept(a2, utterance(a2))
    assert refusal.reason is EndReason.BUSY and "client" in refusal.why
    drain(routes)
    routes.route(reply(a, msg_type="ovos.utterance.handled"))   # one of a's is done
    assert routes.accept(a, utterance(a)) is None
    # a get_response answer never gets its handled: forgotten after in_flight_timeout
    assert routes.accept(a, utterance(a)).reason is EndReason.BUSY
    clock.advance(61)
    assert routes.accept(a, utterance(a)) is None


def test_sessions_per_client_are_bounded_and_expire(routes, clock):
    sats = [satellite("a", session=f"s{i}") for i in range(3)]
    for sat in sats:
        routes.accept(sat, {"type": "recognizer_loop:audio_output_end", "data": {},
                            "context": {}})
    assert len(routes) == 2                  # the least recently seen went
    drain(routes)
    assert routes.route(reply(sats[0])) == []
    clock.advance(601)
    other = satellite("b")
    routes.accept(other, {"type": "x", "data": {}, "context": {}})
    assert len(routes) == 1                  # the idle ones expired


def test_while_the_bus_is_down_an_utterance_is_refused_at_once(routes):
    a = satellite("a")
    routes.bus_lost()
    refusal = routes.accept(a, utterance(a))
    assert refusal.reason is EndReason.BACKEND_UNAVAILABLE
    routes.bus_connected()
    assert routes.accept(a, utterance(a)) is None


def test_losing_the_bus_fails_every_utterance_queued_or_in_flight(routes):
    a, b = satellite("a"), satellite("b")
    routes.accept(a, utterance(a, tag="sent"))
    drain(routes)
    routes.accept(b, utterance(b, tag="queued"))
    routes.accept(b, {"type": "recognizer_loop:audio_output_end", "data": {}, "context": {}})
    lost = routes.bus_lost()
    assert sorted(o.message["context"]["hivemind_chat_turn"] for o in lost) == \
        ["queued", "sent"]
    assert not routes.has_outbound()


def test_an_utterance_being_written_as_the_bus_goes_down_is_told_once(routes):
    a = satellite("a")
    routes.accept(a, utterance(a))
    outbound = routes.next_outbound()
    assert routes.bus_lost() == [outbound]         # told with the others
    assert routes.unsent(outbound) is False        # its failed write: not told again


def test_an_utterance_is_in_flight_before_it_is_written(routes):
    """ovos-core may answer before the sender thread's write returns: the `handled` then
    finds it in flight (else it stayed there, a phantom, until in_flight_timeout)."""
    a = satellite("a")
    routes.accept(a, utterance(a))
    outbound = routes.next_outbound()
    assert routes.utterances_by_connection() == {a.conn: 1}
    sid = outbound.message["context"]["session"]["session_id"]
    routes.route({"type": "ovos.utterance.handled", "data": {},
                  "context": {"destination": a.peer, "session": {"session_id": sid}}})
    assert routes.utterances_by_connection() == {}


def test_an_utterance_whose_write_failed_is_told_and_not_in_flight(routes):
    a = satellite("a")
    routes.accept(a, utterance(a))
    outbound = routes.next_outbound()
    assert routes.unsent(outbound) is True
    assert routes.utterances_by_connection() == {}


def test_a_failure_is_the_chat_modes_shape_under_the_declared_session(routes):
    a = satellite("a")
    routes.accept(a, utterance(a, tag="t9"))
    [outbound] = drain(routes)
    failure, handled = failure_replies(outbound, Refusal(EndReason.BACKEND_UNAVAILABLE,
                                                         "bus down"))
    assert failure["type"] == "complete_intent_failure"
    assert failure["data"] == {"reason": "backend_unavailable", "message": "bus down"}
    assert handled["type"] == "ovos.utterance.handled"
    for msg in (failure, handled):
        assert msg["context"]["destination"] == a.peer
        assert msg["context"]["session"]["session_id"] == "kitchen"
        assert msg["context"]["hivemind_chat_turn"] == "t9"


def test_connection_names_are_bounded(routes):
    a = satellite("a")
    for i in range(50):
        renamed = Satellite(a.conn, a.client, f"sat-a::a::s{i}", "kitchen", a.session_id,
                            a.handle)
        routes.accept(renamed, {"type": "x", "data": {}, "context": {}})
        drain(routes)
    assert len(routes._conn_of_peer) <= 8


def test_a_marked_twin_of_the_frame_just_routed_is_dropped(routes):
    """ovos-core 3.x sends `ovos.utterance.speak`, then `speak` marked as its twin: the
    satellite hears the sentence once, as through the stock plugin's bus client."""
    a = satellite("a")
    routes.accept(a, utterance(a))
    drain(routes)
    assert len(routes.route(reply(a, msg_type="ovos.utterance.speak"))) == 1
    twin = reply(a)
    twin["context"]["_namespace_compat_twin"] = True
    assert routes.route(twin) == []
    # a marker copied onto another frame (no first frame like it) is delivered
    other = reply(a)
    other["data"] = {"utterance": "something else"}
    other["context"]["_namespace_compat_twin"] = True
    assert len(routes.route(other)) == 1


def test_a_twin_that_comes_after_other_frames_of_its_session_is_dropped_once(routes):
    """Several utterances of one session in flight: other frames come between a first frame
    and its twin (a flood on 5.x heard a sentence twice); each twin drops its own first frame,
    once: the same sentence spoken again later is delivered again."""
    a = satellite("a")
    routes.accept(a, utterance(a))
    drain(routes)

    def said(text, twin=False):
        frame = reply(a, msg_type="speak" if twin else "ovos.utterance.speak")
        frame["data"] = {"utterance": text}
        if twin:
            frame["context"]["_namespace_compat_twin"] = True
        return len(routes.route(frame))
    assert said("first") == 1
    assert said("second") == 1
    assert said("third") == 1
    assert said("first", twin=True) == 0       # its first frame came three frames ago
    assert said("third", twin=True) == 0
    assert said("second", twin=True) == 0
    assert said("first", twin=True) == 1       # no first frame left to match: delivered


def test_a_dialog_of_questions_and_answers_never_piles_up_in_flight(routes):
    """Each get_response answer gets no `handled` of its own; its hand-over to the waiting
    skill (`<skill>.converse.get_response`) closes it instead."""
    a = satellite("a")
    for _ in range(5):             # more pairs than max_in_flight_per_session (2)
        assert routes.accept(a, utterance(a, "set an alarm")) is None      # the question
        drain(routes)
        assert routes.accept(a, utterance(a, "in five hours")) is None     # its answer
        drain(routes)
        routes.route(reply(a, msg_type="ovos-skill-alerts.openvoiceos.converse.get_response"))
        routes.route(reply(a, msg_type="ovos.utterance.handled"))          # the question's


# ---- probation (core/ovos_probation.py) ----
@pytest.fixture
def on_trial(clock):
    r = OvosRoutes(LIMITS, clock.now, probation=Probation(seconds=2.0, share=0.5))
    r.bus_connected()
    return r


def handled(routes, sat, clock, took):
    drain(routes)
    clock.advance(took)
    routes.route(reply(sat, msg_type="ovos.utterance.handled"))


def test_a_satellite_that_waits_for_its_answers_is_never_on_probation(on_trial, clock):
    a = satellite("a")
    for _ in range(20):          # back to back, each sent once the last is handled
        assert on_trial.accept(a, utterance(a)) is None
        handled(on_trial, a, clock, 0.002)
    assert len(on_trial.probation) == 0


def test_over_its_bounds_a_connection_sends_one_at_a_time_for_a_while(on_trial, clock):
    a, b = satellite("a", session="one"), satellite("a", session="two")
    other = satellite("o")
    assert on_trial.accept(a, utterance(a)) is None
    assert on_trial.accept(a, utterance(a)) is None
    assert "session" in on_trial.accept(a, utterance(a)).why      # a bound: on probation
    handled(on_trial, a, clock, 0.010)      # one of its two ends after 10 ms
    # one of its is still at OVOS: refused, whichever of its sessions
    refusal = on_trial.accept(b, utterance(b))
    assert refusal.reason is EndReason.BUSY and "one utterance at a time" in refusal.why
    assert on_trial.accept(other, utterance(other)) is None       # others are not touched
    handled(on_trial, other, clock, 0.0)
    handled(on_trial, a, clock, 0.004)      # its last ends, 14 ms after it was sent
    # it may keep OVOS busy half the time: the next waits as long again as that one took
    refusal = on_trial.accept(a, utterance(a))
    assert refusal.reason is EndReason.BUSY and "50% of the time" in refusal.why
    clock.advance(0.0141)
    assert on_trial.accept(a, utterance(a)) is None
    # its own refusals do not renew the probation: 2 s after the bound's, it is over
    clock.advance(2.0)
    handled(on_trial, a, clock, 0.001)
    assert on_trial.accept(a, utterance(a)) is None
    assert on_trial.accept(a, utterance(a)) is None
    assert len(on_trial.probation) == 0


def test_on_probation_a_connection_waits_until_the_others_turns_are_over(on_trial, clock):
    """OVOS runs turns side by side on one CPU budget: a flood utterance started beside another
    satellite's turn slows it, so one on probation goes only while nobody else's is open."""
    a, other, rogue = satellite("a"), satellite("o"), satellite("r")
    for flooder in (a, rogue):
        for _ in range(3):
            on_trial.accept(flooder, utterance(flooder))
        handled(on_trial, flooder, clock, 0.0)
        handled(on_trial, flooder, clock, 0.0)
    clock.advance(0.001)
    assert on_trial.accept(other, utterance(other)) is None
    refusal = on_trial.accept(a, utterance(a))
    assert refusal.reason is EndReason.BUSY and "other satellites' turns" in refusal.why
    handled(on_trial, other, clock, 0.050)
    assert on_trial.accept(a, utterance(a)) is None
    # another connection on probation is no one to wait for: the shares keep those apart
    assert on_trial.accept(rogue, utterance(rogue)) is None
    assert len(on_trial.probation) == 2


def test_probation_goes_with_the_connection(on_trial, clock):
    a = satellite("a")
    for _ in range(3):
        on_trial.accept(a, utterance(a))
    assert len(on_trial.probation) == 1
    on_trial.closed(a.conn)
    assert len(on_trial.probation) == 0


def test_probation_refuses_nonsense():
    for bad in ({"seconds": -1}, {"share": 0}, {"share": 1.5}):
        with pytest.raises(ValueError):
            Probation(**bad)
