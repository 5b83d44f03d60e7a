"""The frame gate with a 4.x (password) channel, without sockets: nothing unencrypted or
unauthenticated is ever read, and nothing after the handshake goes out unsealed. The 5.x
(Noise) channel: tests/test_handshakes.py."""
import json

import pytest
from hivemind_bus_client.encryption import encrypt_as_json, encrypt_bin
from hivemind_bus_client.message import HiveMessage, HiveMessageType
from ovos_bus_client.message import Message

from hivemind_chat_agent.core.exchange import frames_to_send
from hivemind_chat_agent.core.frames import Verdict, open_frame
from hivemind_chat_agent.core.handshake_password import PasswordChannel
from hivemind_chat_agent.errors import ConnectionLostError

KEY = b"0123456789abcdef"
CIPHER, ENCODING = "AES-GCM", "JSON-B64"


def bus(msg_type="speak", text="forged"):
    return HiveMessage(HiveMessageType.BUS, payload=Message(
        msg_type, {"utterance": text}, {"session": {"session_id": "s"}})).serialize()


def sealed(plain, key=KEY):
    return encrypt_as_json(key, plain, cipher=CIPHER, encoding=ENCODING)


def opened(raw, key=KEY, limit=1 << 20):
    return open_frame(raw, PasswordChannel(key, CIPHER, ENCODING) if key else None, limit)


def test_ciphertext_under_the_session_key_is_read():
    result = opened(sealed(bus(text="real")))
    assert result.verdict is Verdict.OK
    assert result.message.msg_type == HiveMessageType.BUS


def test_plain_text_after_the_handshake_is_dropped_unread():
    for raw in (bus(), json.dumps({"msg_type": "bus", "payload": {}}), json.dumps(["a"])):
        result = opened(raw)
        assert result.verdict is Verdict.DROP and result.message is None


def test_a_frame_that_is_not_even_json_after_the_handshake_is_tampering():
    """A genuine frame garbled on the way: dropping it would hand back an answer with a
    sentence silently missing."""
    result = opened("{ not json")
    assert result.verdict is Verdict.TAMPERED and result.message is None


def test_a_frame_failing_authentication_is_tampering():
    good = json.loads(sealed(bus()))
    flipped = dict(good, ciphertext=good["ciphertext"][:-4] + ("AAAA" if not
                   good["ciphertext"].endswith("AAAA") else "BBBB"))
    for raw in (json.dumps(flipped), sealed(bus(), key=b"fedcba9876543210"),
                encrypt_bin(b"fedcba9876543210", b"x" * 40, cipher=CIPHER)):
        assert opened(raw).verdict is Verdict.TAMPERED


def test_before_the_key_only_hello_and_handshake_are_accepted_in_plain_text():
    hello = HiveMessage(HiveMessageType.HELLO, payload={"pubkey": "x"}).serialize()
    handshake = HiveMessage(HiveMessageType.HANDSHAKE, payload={"password": True}).serialize()
    assert opened(hello, key=None).verdict is Verdict.OK
    assert opened(handshake, key=None).verdict is Verdict.OK
    for raw in (bus(), b"\x00binary", "garbage", sealed(bus())):
        assert opened(raw, key=None).verdict is Verdict.DROP


def test_an_oversized_frame_is_refused():
    raw = sealed(bus(text="x" * 10_000))
    assert opened(raw, limit=5000).verdict is Verdict.TOO_LARGE
    assert opened(raw, limit=1 << 20).verdict is Verdict.OK


def test_what_goes_out_is_sealed_but_the_handshake_and_never_plain_without_a_channel():
    """frames_to_send, which both transports (websocket, MQTT) write: the handshake in the
    clear, the rest through the channel; with none, nothing at all."""
    hello = bus(text="hello")
    assert frames_to_send(HiveMessageType.HANDSHAKE, '{"x": 1}', None) == [('{"x": 1}', False)]
    [(data, binary)] = frames_to_send(HiveMessageType.BUS, hello,
                                      PasswordChannel(KEY, CIPHER, ENCODING))
    assert not binary and "hello" not in data
    assert opened(data).message.payload.data["utterance"] == "hello"
    with pytest.raises(ConnectionLostError, match="before the connection is encrypted"):
        frames_to_send(HiveMessageType.BUS, hello, None)
