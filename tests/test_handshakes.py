"""Both generations' key exchanges and channels, without sockets, against the hub side of the
same libraries hivemind-core uses (poorman-handshake, hivemind_bus_client.noise)."""
import os
import stat
import threading

import pytest
from handshake_vectors import HELLO_5, OFFER_4, OFFER_5, PASSWORD, NoiseHub, inputs
from hivemind_bus_client.message import HiveMessage, HiveMessageType
from ovos_bus_client.message import Message
from poorman_handshake import PasswordHandShake

from hivemind_chat_agent.client.noise_keys import NoiseKeyring
from hivemind_chat_agent.core.frames import Verdict, open_frame
from hivemind_chat_agent.core.handshake import choose
from hivemind_chat_agent.core.handshake_noise import NoiseExchange
from hivemind_chat_agent.core.handshake_password import PasswordExchange
from hivemind_chat_agent.core.refusals import (
    UtteranceTopic,
    denial_error,
    read_denial,
    refusal_from_close,
)
from hivemind_chat_agent.errors import (
    AccessKeyRejectedError,
    AuthenticationError,
    ClientKeyRefusedError,
    HubKeyChangedError,
    PolicyDeniedError,
    UnsupportedHubError,
    WrongPasswordError,
)


def speak(text="hi"):
    return HiveMessage(HiveMessageType.BUS, payload=Message(
        "speak", {"utterance": text}, {"session": {"session_id": "s"}})).serialize()


def noise_session(tmp_path, client_inputs=None):
    exchange = choose(HELLO_5, OFFER_5, client_inputs or inputs(tmp_path))
    hub = NoiseHub(tmp_path)
    send, channel = exchange.receive(hub.answer(exchange.first()))
    hub.finish(send[0])
    return hub, channel


def test_the_offer_picks_the_generation(tmp_path):
    assert isinstance(choose(HELLO_5, OFFER_5, inputs(tmp_path)), NoiseExchange)
    assert isinstance(choose({}, OFFER_4, inputs(tmp_path)), PasswordExchange)
    with pytest.raises(AuthenticationError, match="no password"):
        choose({}, dict(OFFER_4, password=False), inputs(tmp_path))
    with pytest.raises(UnsupportedHubError, match="none of which"):
        choose(HELLO_5, dict(OFFER_5, noise={"patterns": ["NNpsk0"], "suites": ["x"]}),
               inputs(tmp_path))


def test_noise_exchange_with_the_hub_side_seals_and_opens_both_ways(tmp_path):
    hub, channel = noise_session(tmp_path)
    assert channel.many_sessions
    for data, binary in channel.seal(speak("to the hub")):
        assert binary and b"to the hub" not in data
        assert "to the hub" in hub.transport.decrypt_frame(data)
    for frame in hub.send(speak("from the hub")):
        opened = open_frame(frame, channel, 1 << 20)
        assert opened.verdict is Verdict.OK
        assert opened.message.payload.data["utterance"] == "from the hub"


def test_noise_wrong_password_is_a_typed_error_before_anything_is_sent(tmp_path):
    """XXpsk2 mixes the PSK in at the hub's answer: the client finds out there, and sends
    neither its static key nor anything else."""
    exchange = choose(HELLO_5, OFFER_5, inputs(tmp_path, password="not the password"))
    answer = NoiseHub(tmp_path).answer(exchange.first())
    with pytest.raises(WrongPasswordError, match="password is wrong"):
        exchange.receive(answer)


def test_noise_channel_refuses_plain_tampered_and_oversized_frames(tmp_path):
    hub, channel = noise_session(tmp_path, inputs(tmp_path, max_bytes=100_000))
    assert open_frame(speak(), channel, 1 << 20).verdict is Verdict.DROP     # plain text
    frame = hub.send(speak())[0]
    assert open_frame(frame[:-1] + bytes([frame[-1] ^ 1]), channel,
                      1 << 20).verdict is Verdict.TAMPERED
    hub2, channel2 = noise_session(tmp_path, inputs(tmp_path, max_bytes=100_000))
    parts = hub2.send(speak("x" * 150_000))
    assert len(parts) == 3
    assert open_frame(parts[0], channel2, 1 << 20).verdict is Verdict.MORE
    assert open_frame(parts[1], channel2, 1 << 20).verdict is Verdict.TOO_LARGE


def test_the_hubs_key_is_pinned_on_first_use_and_a_different_one_refused(tmp_path):
    noise_session(tmp_path)
    keyring = NoiseKeyring(str(tmp_path), "key-1")
    first = keyring.pinned("127.0.0.1:5678")
    assert first
    noise_session(tmp_path)                                   # the same hub key: fine
    os.unlink(tmp_path / "hub.key")                           # the hub is "reinstalled"
    with pytest.raises(HubKeyChangedError, match=str(keyring.pins_path)):
        noise_session(tmp_path)
    assert keyring.pinned("127.0.0.1:5678") == first


def test_one_static_key_per_access_key_even_when_created_in_parallel(tmp_path):
    rings = [NoiseKeyring(str(tmp_path / "keys"), "key-9") for _ in range(8)]
    paths = []
    threads = [threading.Thread(target=lambda r=r: paths.append(r.ensure())) for r in rings]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(paths)) == 1
    key_files = [f for f in os.listdir(tmp_path / "keys") if f.endswith(".noise.key")]
    assert len(key_files) == 1 and "key-9" not in key_files[0]
    assert stat.S_IMODE(os.stat(paths[0]).st_mode) == 0o600
    other = NoiseKeyring(str(tmp_path / "keys"), "key-10").ensure()
    assert other != paths[0]


def test_password_exchange_against_the_hub_side(tmp_path):
    exchange = choose({}, OFFER_4, inputs(tmp_path))
    first = exchange.first()
    hub = PasswordHandShake(PASSWORD)
    envelope = hub.generate_handshake()
    assert hub.receive_and_verify(first.payload["envelope"])
    send, channel = exchange.receive({"envelope": envelope,
                                      "cipher": "AES-GCM", "encoding": "JSON-B64"})
    assert send == [] and channel.key == hub.secret and not channel.many_sessions
    wrong = choose({}, OFFER_4, inputs(tmp_path, password="another one"))
    wrong.first()
    with pytest.raises(WrongPasswordError):
        wrong.receive({"envelope": PasswordHandShake(PASSWORD).generate_handshake()})


def test_a_hub_closing_with_a_reason_is_a_typed_refusal():
    assert isinstance(refusal_from_close(1008, "invalid api key"), AccessKeyRejectedError)
    pinned = refusal_from_close(1008, "client Noise static key contradicts the pinned key")
    assert isinstance(pinned, ClientKeyRefusedError) and "reset-noise-pin" in str(pinned)
    assert isinstance(refusal_from_close(1008, "this node requires the v3 Noise handshake"),
                      UnsupportedHubError)
    assert refusal_from_close(1000, "") is None and refusal_from_close(None, "") is None


def test_utterance_topic_falls_back_once_and_names_the_command():
    topic = UtteranceTopic()
    assert topic.current == "recognizer_loop:utterance"
    assert topic.denied("recognizer_loop:utterance") == "ovos.utterance.handle"
    assert topic.denied("ovos.utterance.handle") is None
    assert topic.tried == ["recognizer_loop:utterance", "ovos.utterance.handle"]
    error = denial_error("ovos.utterance.handle", "acl_disallowed_type", "", topic.to_allow)
    assert isinstance(error, PolicyDeniedError)
    assert ("hivemind-core allow-msg recognizer_loop:utterance ovos.utterance.handle NODE_ID"
            in str(error))
    forced = UtteranceTopic("ovos.utterance.handle")
    assert forced.denied("ovos.utterance.handle") is None
    told = UtteranceTopic()
    assert told.denied("recognizer_loop:utterance", allowed=["speak"]) is None
    back = UtteranceTopic()       # the hub's list decides, also to go back to the legacy name
    assert back.denied("recognizer_loop:utterance",
                       allowed=["ovos.utterance.handle"]) == "ovos.utterance.handle"
    assert back.denied("ovos.utterance.handle",
                       allowed=["recognizer_loop:utterance"]) == "recognizer_loop:utterance"
    quota = denial_error("recognizer_loop:utterance", "quota_exceeded", "10 per minute", [])
    assert isinstance(quota, PolicyDeniedError) and "allow-msg" not in str(quota)
    denied = {"denied_type": "x", "code": "acl_disallowed_type", "reason": "r" * 500,
              "data": {"allowed": []}}
    assert read_denial(denied)[2] == "r" * 300 and read_denial("junk") == (None, "", "", {})


def test_a_v3_hub_without_noise_installed_is_a_typed_error_naming_the_upgrade(tmp_path,
                                                                             monkeypatch):
    """Our client inside a stock hivemind-core 4.0.0 venv (hivemind-bus-client 0.9.1a1 has no
    Noise module) meeting a 5.x hub: refused before anything is sent, with the fix."""
    import sys
    monkeypatch.setitem(sys.modules, "hivemind_chat_agent.core.handshake_noise", None)
    with pytest.raises(UnsupportedHubError, match="hivemind-bus-client>=1.2.12a1"):
        choose(HELLO_5, OFFER_5, inputs(tmp_path))


def test_a_hub_that_spoke_noise_and_now_offers_a_password_is_refused_unsent(tmp_path):
    """Stripping the Noise offer would get the password envelope (a fast hash) sent."""
    noise_session(tmp_path)                                   # pins the hub's key
    with pytest.raises(HubKeyChangedError, match="downgrading"):
        choose(HELLO_5, OFFER_4, inputs(tmp_path))
    assert "password" not in repr(inputs(tmp_path)) and PASSWORD not in repr(inputs(tmp_path))


def test_a_key_directory_or_key_others_can_touch_is_refused(tmp_path):
    from hivemind_chat_agent.errors import ConfigurationError
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    with pytest.raises(ConfigurationError, match="writable by other users"):
        NoiseKeyring(str(shared), "key-1").ensure()
    ring = NoiseKeyring(str(tmp_path / "private"), "key-1")
    os.chmod(ring.ensure(), 0o644)
    with pytest.raises(ConfigurationError, match="readable by other users"):
        ring.ensure()


def test_yes_no_config_keys_read_strings_as_people_mean_them():
    from hivemind_chat_agent.client.config import ClientConfig
    from hivemind_chat_agent.errors import ConfigurationError
    base = {"host": "127.0.0.1", "key": "k", "password": "p"}
    assert ClientConfig.from_dict({**base, "share_connections": "false"}).share_connections \
        is False
    assert ClientConfig.from_dict({**base, "plays_audio": "yes"}).plays_audio is True
    with pytest.raises(ConfigurationError, match="plays_audio"):
        ClientConfig.from_dict({**base, "plays_audio": "maybe"})


def test_a_denial_plan_retries_refuses_or_leaves_turns_to_their_timeout():
    from hivemind_chat_agent.core.refusals import (
        ACL_DENIED,
        CURRENT_UTTERANCE_TYPE,
        UTTERANCE_TOPICS,
        UtteranceTopic,
        plan_denial,
    )
    legacy = UTTERANCE_TOPICS[0]
    plan = plan_denial(legacy, ACL_DENIED, "no", {}, 3, UtteranceTopic())
    assert plan.retry == CURRENT_UTTERANCE_TYPE and plan.refuse is None
    topic = UtteranceTopic()
    topic.denied(CURRENT_UTTERANCE_TYPE)
    plan = plan_denial(legacy, ACL_DENIED, "no", {}, 2, topic)     # both names denied now
    assert plan.retry is None and "allow-msg" in str(plan.refuse)
    forced = plan_denial(legacy, ACL_DENIED, "no", {"allowed": [CURRENT_UTTERANCE_TYPE]}, 1,
                         UtteranceTopic(legacy))
    assert forced.retry is None and legacy in str(forced.refuse)
    quota = plan_denial(legacy, "rate_limited", "slow down", {}, 1, UtteranceTopic())
    assert "rate_limited" in str(quota.refuse)
    unsure = plan_denial(legacy, "rate_limited", "slow down", {}, 2, UtteranceTopic())
    assert unsure.refuse is None and unsure.retry is None and unsure.loud
    assert plan_denial(legacy, ACL_DENIED, "", {}, 0, UtteranceTopic()).note
