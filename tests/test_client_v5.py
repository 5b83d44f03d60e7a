"""What only the current line (hivemind-core 5.x) has, against a genuine 5.x hub on 127.0.0.1:
the Noise handshake and its pinned keys, the message policy, many sessions on one connection.
Everything both generations share runs against both in test_client_real_hub.py."""
import subprocess
import threading
import time

import pytest
from hubs import HubProcess
from waiting import UNIT

from hivemind_chat_agent import (
    AccessKeyRejectedError,
    ClientKeyRefusedError,
    PolicyDeniedError,
    WrongPasswordError,
)

LEGACY, CURRENT, AUDIO_END = ("recognizer_loop:utterance", "ovos.utterance.handle",
                              "recognizer_loop:audio_output_end")


@pytest.fixture(scope="module")
def hub5():
    h = HubProcess(generation="5").start()
    yield h
    h.cleanup()


@pytest.fixture
def keys(tmp_path):
    return str(tmp_path / "noise-keys")


def test_the_noise_handshake_is_spoken_and_the_agent_shares_its_connection(hub5, keys,
                                                                           make_agent):
    agent = make_agent(hub5.add_client().agent_config(noise_key_dir=keys))
    assert agent.get_response("hello", session_id="v5-a") == "hello there"
    conn = agent.pool.peek("v5-a")
    assert conn.generation.startswith("5.x") and conn.many_sessions
    # the hub reads each message's Session: v5-b arrives as v5-b (the test pipeline strips
    # 5.x's per-client namespace), although the connection's HELLO declared v5-a
    assert agent.get_response("whoami", session_id="v5-b") == "session v5-b"
    assert agent.pool.peek("v5-b") is conn and len(agent.pool) == 1


def test_64_sessions_of_one_agent_at_once_share_at_most_4_connections_with_no_crosstalk(
        hub5, keys, make_agent):
    agent = make_agent(hub5.add_client().agent_config(noise_key_dir=keys))
    agent.get_response("hello", session_id="warm")
    answers, errors = {}, []

    def turn(k):
        try:
            answers[k] = agent.get_response(f"echo sixty-four {k}", session_id=f"many-{k}")
        except Exception as e:   # noqa: BLE001 - collected and asserted below
            errors.append(e)
    threads = [threading.Thread(target=turn, args=(k,)) for k in range(64)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert answers == {k: f"you said echo sixty-four {k}" for k in range(64)}
    assert 1 <= len(agent.pool) <= 4
    for k in (0, 31, 63):
        assert agent.get_response("whoami", session_id=f"many-{k}") == f"session many-{k}"


def test_a_client_allowed_only_one_utterance_topic_chats_without_configuration(hub5, keys,
                                                                               make_agent):
    for allowed in (LEGACY, CURRENT):
        creds = hub5.add_client(allow=[allowed, AUDIO_END])
        agent = make_agent(creds.agent_config(noise_key_dir=keys))
        assert agent.get_response("hello", session_id=f"only-{allowed}") == "hello there"
        assert agent.topic.current == allowed
        started = time.monotonic()       # learnt once: the next turn pays nothing for it
        assert agent.get_response("hello", session_id=f"only2-{allowed}") == "hello there"
        assert time.monotonic() - started < 15 * UNIT   # no fallback wait again


def test_a_denied_topic_is_a_fast_typed_error_naming_the_command(hub5, keys, make_agent):
    creds = hub5.add_client(allow=[AUDIO_END])
    agent = make_agent(creds.agent_config(noise_key_dir=keys, timeout=20))
    agent.warm_up()      # the connection and its Noise handshake are not what is timed here
    opened = agent.pool.connections_opened
    started = time.monotonic()
    with pytest.raises(PolicyDeniedError) as info:
        agent.get_response("hello", session_id="denied")
    took = time.monotonic() - started
    # at once, not after the 20 s timeout: the two refusals (each utterance name) and no more
    assert took < 4 * UNIT, took
    assert agent.pool.connections_opened == opened     # on the warm connection
    message = str(info.value)
    assert f"hivemind-core allow-msg {LEGACY} {CURRENT} NODE_ID" in message
    assert creds.key not in message and creds.password not in message
    forced = make_agent(creds.agent_config(noise_key_dir=keys, utterance_topic=CURRENT))
    with pytest.raises(PolicyDeniedError, match=f"allow-msg {CURRENT} NODE_ID"):
        forced.get_response("hello", session_id="denied-forced")


def test_the_static_key_survives_a_restart_and_another_key_is_refused_with_the_fix(
        hub5, keys, tmp_path, make_agent):
    creds = hub5.add_client()
    first = make_agent(creds.agent_config(noise_key_dir=keys))
    assert first.get_response("hello", session_id="pin") == "hello there"
    first.shutdown()
    again = make_agent(creds.agent_config(noise_key_dir=keys))     # "restarted"
    assert again.get_response("hello", session_id="pin") == "hello there"
    warming = make_agent(creds.agent_config(noise_key_dir=str(tmp_path / "elsewhere-too")))
    with pytest.raises(ClientKeyRefusedError, match="reset-noise-pin"):
        warming.warm_up()          # waits for the refusal the hub sends after the handshake
    stranger = make_agent(creds.agent_config(noise_key_dir=str(tmp_path / "elsewhere")))
    started = time.monotonic()
    with pytest.raises(ClientKeyRefusedError, match="reset-noise-pin"):
        stranger.get_response("hello", session_id="pin")
    assert time.monotonic() - started < 4 * UNIT       # at once, not after the timeout
    subprocess.run([hub5.cli, "reset-noise-pin", str(hub5.client_id(creds.key))],
                   env=hub5.env, check=True, capture_output=True, timeout=60)   # the fix
    assert stranger.get_response("hello", session_id="pin") == "hello there"


def test_wrong_password_and_unknown_key_are_typed_on_5x(hub5, keys, make_agent):
    creds = hub5.add_client()
    wrong = make_agent({**creds.agent_config(noise_key_dir=keys),
                        "password": "Not-The-Password-42"})
    with pytest.raises(WrongPasswordError, match="Noise handshake"):
        wrong.get_response("hello", session_id="wrong")
    unknown = make_agent({**creds.agent_config(noise_key_dir=keys),
                          "key": "0" * 32})
    with pytest.raises(AccessKeyRejectedError):
        unknown.get_response("hello", session_id="unknown")
