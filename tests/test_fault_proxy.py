"""Byte-level faults between the client and a genuine hub (tests/fault_proxy.py in the middle):
forged, corrupted, lost, stalled and slow frames. Each ends the turn with the genuine, complete
answer or a typed error, quickly, and the next turn on the same agent works."""
import logging
import time

import pytest
from fault_proxy import FaultProxy
from leaks import agent_threads, threads_left
from ovos_bus_client.session import SessionManager
from ovos_plugin_manager.templates.agents import AgentMessage, MessageRole
from waiting import UNIT

from hivemind_chat_agent import (
    AuthenticationError,
    ConnectionLostError,
    HandshakeTimeoutError,
    HiveMindChatError,
    HubUnreachableError,
    TurnTimeoutError,
)
from hivemind_chat_agent.client.connection import HubConnection
from hivemind_chat_agent.core.protocol_names import TURN_TAG_KEY

COUNT_3 = ["sentence 1", "sentence 2", "sentence 3"]


@pytest.fixture
def proxy(hub):
    p = FaultProxy(hub.port)
    yield p
    p.close()
    assert p.threads_alive == 0, "proxy threads left running"


@pytest.fixture
def warnings_seen(monkeypatch):
    """Every WARNING (or worse) any logger of this process emits during the test."""
    records = []
    call_handlers = logging.Logger.callHandlers

    def spy(logger, record):
        if record.levelno >= logging.WARNING:
            records.append(record.getMessage())
        return call_handlers(logger, record)
    monkeypatch.setattr(logging.Logger, "callHandlers", spy)
    return records


@pytest.fixture
def on_turn_sent(monkeypatch):
    """on_turn_sent(fn): fn(tag) runs right after each turn's utterance is sent."""
    hooks = []
    start_turn = HubConnection.start_turn

    def spy(self, session, utterance, tag, timeout, sink):
        handle = start_turn(self, session, utterance, tag, timeout, sink)
        for fn in hooks:
            fn(tag)
        return handle
    monkeypatch.setattr(HubConnection, "start_turn", spy)
    return hooks.append


def stream(agent, text, session_id):
    return agent.stream_sentences([AgentMessage(MessageRole.USER, text)], session_id=session_id)


def actions(proxy):
    return [action for action, _, _ in proxy.frames]


@pytest.mark.parametrize("tagged", [True, False], ids=["tagged", "untagged"])
def test_an_injected_plain_text_answer_is_never_read(creds, proxy, make_agent, on_turn_sent,
                                                     warnings_seen, tagged):
    """A plain-text speak + handled inserted on the wire while the hub is still working on the
    answer: the turn waits for the genuine, encrypted one and the Session is not overwritten."""
    sid = f"inject-{'tagged' if tagged else 'untagged'}"
    agent = make_agent(creds.agent_config(port=proxy.port, timeout=5))
    assert agent.get_response("hello", session_id=sid) == "hello there"
    lang = SessionManager.sessions[sid].lang
    assert lang != "xx-XX"

    def forge(tag):
        context = {"session": {"session_id": sid, "lang": "xx-XX"}}
        if tagged:
            context[TURN_TAG_KEY] = tag
        for msg_type, data in (("speak", {"utterance": "forged"}),
                               ("ovos.utterance.handled", {})):
            proxy.inject_plaintext({"msg_type": "bus", "payload": {
                "type": msg_type, "data": data, "context": context}})
    on_turn_sent(forge)
    assert agent.get_response("slow 1 0.5", session_id=sid) == "slow sentence 1"
    assert actions(proxy).count("injected") == 2          # the forgery did reach the client
    dropped = [w for w in warnings_seen if "dropped a frame from the hub" in w]
    assert len(dropped) == 2, warnings_seen               # ... and both frames were refused
    assert SessionManager.sessions[sid].lang == lang
    assert agent.get_response("hello", session_id=sid) == "hello there"
    assert proxy.connections == 1                         # refused, not a reason to reconnect


def test_a_corrupted_ciphertext_mid_turn_ends_it_as_tampered(creds, proxy, make_agent):
    agent = make_agent(creds.agent_config(port=proxy.port, timeout=5))
    assert agent.get_response("hello", session_id="corrupt") == "hello there"
    proxy.frames.clear()
    proxy.corrupt_next("auth", skip=1)                    # "sentence 2" fails authentication
    got = []
    start = time.monotonic()
    with pytest.raises(ConnectionLostError, match="tampered"):
        for sentence in stream(agent, "count 3", "corrupt"):
            got.append(sentence)
    assert time.monotonic() - start < 7 * UNIT          # at once, not after the timeout
    assert got == ["sentence 1"]                          # nothing after the bad frame is read
    assert actions(proxy)[:2] == ["sent", "corrupted"]
    assert agent.get_response("hello", session_id="corrupt") == "hello there"
    assert proxy.connections == 2                         # the next turn reconnected


@pytest.mark.parametrize("mode", ["garbage", "text"])
def test_a_garbled_frame_mid_turn_is_a_typed_error_not_a_shorter_answer(creds, proxy,
                                                                        make_agent, mode):
    """"garbage": the payload overwritten with invalid UTF-8 (line noise); "text": with
    printable text that is not JSON. Either way a genuine frame of the answer is gone."""
    sid = f"garble-{mode}"
    agent = make_agent(creds.agent_config(port=proxy.port, timeout=3))
    assert agent.get_response("hello", session_id=sid) == "hello there"
    proxy.corrupt_next(mode, skip=1)                      # "sentence 2"
    start = time.monotonic()
    with pytest.raises(ConnectionLostError):
        answer = agent.get_response("count 3", session_id=sid)
        pytest.fail(f"a clean answer with a sentence missing: {answer!r}")
    assert time.monotonic() - start < 7 * UNIT          # at once, not after the timeout
    assert "corrupted" in actions(proxy)
    assert agent.get_response("count 2", session_id=sid) == "sentence 1\nsentence 2"


def test_a_dropped_handled_returns_the_sentences_after_the_timeout(creds, proxy, make_agent,
                                                                   warnings_seen, generation):
    """docs/message_flow.md: no reply for `timeout` seconds with sentences already in: those
    sentences and a warning; the connection is kept. On 5.x the Noise nonces make the gap
    visible at the next frame: that turn fails as tampered, and the one after reconnects."""
    agent = make_agent(creds.agent_config(port=proxy.port, timeout=1.5))
    assert agent.get_response("hello", session_id="nohandled") == "hello there"
    proxy.drop_next(skip=3)                               # count 3's ovos.utterance.handled
    start = time.monotonic()
    assert agent.get_response("count 3", session_id="nohandled") == "\n".join(COUNT_3)
    assert 1.4 <= time.monotonic() - start < 1.5 + 5 * UNIT   # it did wait for the handled
    assert actions(proxy)[-4:] == ["sent"] * 3 + ["dropped"]
    assert any("hub stopped mid-answer" in w for w in warnings_seen), warnings_seen
    if generation == "4.0":      # AES-GCM frames stand alone: a missing one goes unseen
        assert agent.get_response("count 2", session_id="nohandled") == "sentence 1\nsentence 2"
        assert proxy.connections == 1
        return
    with pytest.raises(ConnectionLostError, match="tampered"):
        agent.get_response("count 2", session_id="nohandled")
    assert agent.get_response("count 2", session_id="nohandled") == "sentence 1\nsentence 2"
    assert proxy.connections == 2


def test_a_blackhole_mid_turn_times_out_and_late_replies_stay_out_of_the_next_turn(
        creds, proxy, make_agent, on_turn_sent):
    before = agent_threads()
    agent = make_agent(creds.agent_config(port=proxy.port, timeout=1.5))
    sub = agent.subscribe("partition")                    # where late speech must go
    assert agent.get_response("hello", session_id="partition") == "hello there"
    blackholed = []

    def partition(_tag):
        if not blackholed:
            proxy.blackhole()
            blackholed.append(True)
    on_turn_sent(partition)
    start = time.monotonic()
    with pytest.raises(TurnTimeoutError):
        agent.get_response("slow 2 0.3", session_id="partition")
    assert 1.4 <= time.monotonic() - start < 1.5 + 3 * UNIT
    proxy.heal()                                          # the held bytes flow again
    assert agent.get_response("count 2", session_id="partition") == "sentence 1\nsentence 2"
    late = [sub.get(timeout=3), sub.get(timeout=3)]
    assert late == ["slow sentence 1", "slow sentence 2"]   # as asides, not as an answer
    assert agent.get_response("hello", session_id="partition") == "hello there"
    agent.shutdown()
    assert threads_left(before) == set()


def test_a_blackhole_until_the_socket_closes_recovers_on_a_new_connection(creds, proxy,
                                                                          make_agent):
    """Partitioned, then the hub side goes away: the next turn reconnects through the proxy."""
    before = agent_threads()
    agent = make_agent(creds.agent_config(port=proxy.port, timeout=1, connect_timeout=1))
    assert agent.get_response("hello", session_id="cut") == "hello there"
    proxy.blackhole()
    with pytest.raises((TurnTimeoutError, ConnectionLostError)):
        agent.get_response("hello", session_id="cut")
    proxy.cut()                                           # the partition ends in a reset
    proxy.heal()
    deadline = time.monotonic() + 5
    while True:
        try:
            assert agent.get_response("count 1", session_id="cut") == "sentence 1"
            break
        except ConnectionLostError:                      # the old socket's close, if not seen yet
            assert time.monotonic() < deadline
    assert proxy.connections == 2
    agent.shutdown()
    assert threads_left(before) == set()


def test_slow_frames_give_complete_answers_in_order(creds, proxy, make_agent):
    proxy.delay(0.3)                                      # the handshake too
    agent = make_agent(creds.agent_config(port=proxy.port, timeout=3))
    assert agent.get_response("hello", session_id="slow-link") == "hello there"
    arrivals = []
    start = time.monotonic()
    for sentence in stream(agent, "count 3", "slow-link"):
        arrivals.append((sentence, time.monotonic() - start))
    assert [s for s, _ in arrivals] == COUNT_3
    gaps = [b - a for (_, a), (_, b) in zip(arrivals, arrivals[1:], strict=False)]
    assert all(g >= 0.25 for g in gaps), arrivals         # the delay was really there
    assert agent.get_response("count 2", session_id="slow-link") == "sentence 1\nsentence 2"


@pytest.mark.parametrize("after, error, says", [
    (0, HubUnreachableError, "no HiveMind hub answered"),         # not even the HTTP upgrade
    (2, HandshakeTimeoutError, "did not finish the handshake"),   # the hub's envelope held
], ids=["before-upgrade", "before-key"])
def test_a_blackhole_during_the_handshake_is_a_typed_error_within_connect_timeout(
        creds, proxy, make_agent, after, error, says):
    before = agent_threads()
    proxy.blackhole(after=after)
    agent = make_agent(creds.agent_config(port=proxy.port, connect_timeout=1))
    start = time.monotonic()
    with pytest.raises(error, match=says):
        agent.get_response("hello", session_id=f"hs-{after}")
    assert 0.9 <= time.monotonic() - start < 1 + 3 * UNIT
    assert actions(proxy)[:after] == ["sent"] * after
    proxy.heal()
    assert agent.get_response("hello", session_id=f"hs-{after}") == "hello there"
    agent.shutdown()
    assert threads_left(before) == set()


def test_line_noise_during_the_handshake_is_not_blamed_on_the_access_key(creds, proxy,
                                                                         make_agent):
    """The hub's HANDSHAKE request arrives as invalid UTF-8: the key is fine and the hub closed
    nothing, so the error must not send the user to re-register the client."""
    proxy.corrupt_next("garbage", skip=1)                 # HELLO passes, HANDSHAKE garbled
    agent = make_agent(creds.agent_config(port=proxy.port, connect_timeout=2))
    start = time.monotonic()
    with pytest.raises(HiveMindChatError) as err:
        agent.get_response("hello", session_id="noise")
    assert time.monotonic() - start < 2 + 3 * UNIT     # within its connect_timeout
    assert actions(proxy)[:2] == ["sent", "corrupted"]
    assert not isinstance(err.value, AuthenticationError), repr(err.value)
    assert agent.get_response("hello", session_id="noise") == "hello there"
