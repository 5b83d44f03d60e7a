"""HubLink, the connection's protocol state, driven directly: the hub side of the same
libraries hivemind-core uses answers the handshake (tests/handshake_vectors.NoiseHub); no
socket, no thread, no sleep."""
import pytest
from handshake_vectors import HELLO_5, OFFER_5, NoiseHub, inputs
from hivemind_bus_client.message import HiveMessage, HiveMessageType
from ovos_bus_client.message import Message

from hivemind_chat_agent.core.frames import Opened, Verdict
from hivemind_chat_agent.core.hub_link import HubLink, LinkState
from hivemind_chat_agent.core.turns import EndReason
from hivemind_chat_agent.errors import (
    ClientKeyRefusedError,
    ConnectionLostError,
    HubUnreachableError,
    WrongPasswordError,
)

SESSION = {"session_id": "kitchen", "lang": "en-US", "active_skills": [["a", 1]],
           "site_id": "hall"}


def handshake(tmp_path, link, hub=None):
    """Drive `link` through the hub's HELLO and Noise handshake; the last decision."""
    hub = hub or NoiseHub(tmp_path)
    link.opened()
    assert link.frame_received(HiveMessage(HiveMessageType.HELLO, HELLO_5)).send == []
    first = link.frame_received(HiveMessage(HiveMessageType.HANDSHAKE, OFFER_5))
    assert link.state is LinkState.HANDSHAKING and len(first.send) == 1
    last = link.frame_received(HiveMessage(HiveMessageType.HANDSHAKE,
                                           hub.answer(first.send[0])))
    if last.channel is not None:
        hub.finish(last.send[0])
    return last


def bus(text="hi"):
    return HiveMessage(HiveMessageType.BUS, payload=Message(
        "speak", {"utterance": text}, {"session": {"session_id": "kitchen"}}))


def test_the_noise_handshake_makes_it_ready_and_says_hello_with_only_the_sessions_name(
        tmp_path):
    link = HubLink(inputs(tmp_path), "hall", SESSION)
    assert link.state is LinkState.CONNECTING
    last = handshake(tmp_path, link)
    assert link.state is LinkState.READY and link.generation.startswith("5.x")
    assert link.many_sessions and last.channel is not None and len(last.send) == 1
    [hello] = last.then_send
    assert hello.msg_type == HiveMessageType.HELLO
    assert hello.payload == {"session": {"session_id": "kitchen", "site_id": "hall"},
                             "site_id": "hall"}   # no conversation fills another's gaps


def test_a_spare_says_hello_only_when_claimed(tmp_path):
    link = HubLink(inputs(tmp_path), "hall", None)
    assert handshake(tmp_path, link).then_send == []
    assert link.claim(SESSION).payload["session"]["session_id"] == "kitchen"
    with pytest.raises(RuntimeError):
        link.claim(SESSION)


def test_bus_messages_count_only_once_ready(tmp_path):
    link = HubLink(inputs(tmp_path), "", SESSION)
    link.opened()
    assert link.frame_received(bus()).bus is None          # before the channel: nothing
    handshake(tmp_path, link)
    assert not link.hub_spoke
    assert link.frame_received(bus("hello")).bus.data["utterance"] == "hello"
    assert link.hub_spoke


def test_a_wrong_password_fails_the_connect_with_its_error(tmp_path):
    link = HubLink(inputs(tmp_path, password="wrong"), "", SESSION)
    last = handshake(tmp_path, link)
    assert isinstance(last.failed, WrongPasswordError) and last.close
    assert link.state is LinkState.CLOSED and link.error is last.failed


def test_the_pin_refusal_after_a_silent_handshake_refuses_the_turns(tmp_path):
    """A 5.x hub checks our key only after the last handshake message, says nothing when
    content, and often closes with just "invalid message" when not."""
    link = HubLink(inputs(tmp_path), "", SESSION)
    handshake(tmp_path, link)
    decision = link.closed(1008, "invalid message")
    assert isinstance(decision.refuse_turns, ClientKeyRefusedError)
    assert "reset-noise-pin" in str(decision.refuse_turns)
    assert link.error is decision.refuse_turns and link.is_closed
    assert link.closed(1000, "").lose_turns is None         # closed once, for good


def test_a_close_after_the_hub_has_answered_loses_the_turns_and_says_how(tmp_path):
    link = HubLink(inputs(tmp_path), "", SESSION)
    handshake(tmp_path, link)
    link.frame_received(bus())
    decision = link.closed(1008, "invalid message")
    assert decision.refuse_turns is None
    assert decision.lose_turns == ("the hub closed the connection during the turn",
                                   EndReason.NONE)
    link2 = HubLink(inputs(tmp_path), "", SESSION)
    handshake(tmp_path, link2)
    link2.frame_received(bus())
    reason, _ = link2.closed(broken=ConnectionLostError("x")).lose_turns
    assert "corrupted" in reason


def test_a_close_frame_with_the_pinned_key_reason_refuses_before_ready(tmp_path):
    link = HubLink(inputs(tmp_path), "", SESSION)
    link.opened()
    decision = link.closed(1008, "client Noise static key contradicts the pinned key")
    assert isinstance(decision.failed, ClientKeyRefusedError) and link.is_closed


def test_a_tampered_frame_closes_a_ready_link_and_loses_its_turns_as_tampered(tmp_path):
    link = HubLink(inputs(tmp_path), "", SESSION)
    handshake(tmp_path, link)
    decision = link.untrusted(Opened(Verdict.TAMPERED, why="bad tag"), 1 << 20)
    assert decision.close and decision.lose_turns[1] is EndReason.TAMPERED
    too_large = HubLink(inputs(tmp_path), "", SESSION)
    handshake(tmp_path, too_large)
    decision = too_large.untrusted(Opened(Verdict.TOO_LARGE, why="2 MB"), 1 << 20)
    assert decision.lose_turns[1] is EndReason.TOO_LARGE


def test_a_failure_before_ready_is_the_connects_error_and_after_it_loses_the_turns(tmp_path):
    link = HubLink(inputs(tmp_path), "", SESSION)
    error = HubUnreachableError("nobody there")
    assert link.failed(error).failed is error and link.error is error
    assert link.failed(HubUnreachableError("later")).failed is None   # the first error stays
    ready = HubLink(inputs(tmp_path), "", SESSION)
    handshake(tmp_path, ready)
    decision = ready.failed(HubUnreachableError("gone"))
    assert decision.failed is None and decision.lose_turns == ("gone", EndReason.NONE)


def test_our_own_close_loses_open_turns_once(tmp_path):
    link = HubLink(inputs(tmp_path), "", SESSION)
    handshake(tmp_path, link)
    assert link.close().lose_turns == ("the connection was closed", EndReason.NONE)
    assert link.close().lose_turns is None and link.error is None
