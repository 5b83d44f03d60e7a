"""Which replies a connection hands to a turn, fed straight into it (no socket): the session id
rules of both hub generations and of the 4.13-4.14 hubs that namespace ids without restoring."""
import time

import pytest
from ovos_bus_client.message import Message
from ovos_bus_client.session import Session

from hivemind_chat_agent.client.config import ClientConfig
from hivemind_chat_agent.client.connection import HubConnection
from hivemind_chat_agent.core.protocol_names import TURN_TAG_KEY
from hivemind_chat_agent.client.session_book import SessionBook
from hivemind_chat_agent.core.turns import Sentence

CONFIG = ClientConfig.from_dict({"host": "127.0.0.1", "key": "k", "password": "p",
                                 "plays_audio": True})


@pytest.fixture
def conn():
    c = HubConnection(CONFIG, Session("mine"), SessionBook("d"))
    yield c
    c._transport.release()


def open_turn(conn, sid, tag):
    return conn.turns.open(sid, tag, 5, check=lambda: None)    # as start_turn, unsent


def speak(conn, text, sid, tag):
    context = {"session": {"session_id": sid}}
    if tag is not None:
        context[TURN_TAG_KEY] = tag
    conn._on_bus(Message("speak", {"utterance": text}, context))


def heard(handle):
    out = []
    while not handle.events.empty():
        event = handle.events.get()
        if isinstance(event, Sentence):
            out.append(event.text)
    return out


def test_a_reply_with_our_tag_but_another_session_never_reaches_the_turn(conn):
    handle = open_turn(conn, "mine", "t1")
    speak(conn, "forged", "someone-else", "t1")
    speak(conn, "forged too", "0123456789abcdef:someone-else", "t1")
    speak(conn, "genuine", "mine", "t1")
    assert heard(handle) == ["genuine"]


def test_a_namespaced_answer_is_ours_and_ends_sharing(conn):
    conn.many_sessions = True
    handle = open_turn(conn, "mine", "t1")
    speak(conn, "namespaced", "0123456789abcdef:mine", "t1")
    assert heard(handle) == ["namespaced"] and not conn.many_sessions


def test_a_shared_connection_takes_every_session_it_carried_and_no_other(conn):
    conn.many_sessions = True
    a, b = open_turn(conn, "a", "ta"), open_turn(conn, "b", "tb")
    speak(conn, "for b", "b", "tb")
    speak(conn, "for a", "a", "ta")
    speak(conn, "for a, untagged", "a", None)
    speak(conn, "never carried", "c", None)
    assert heard(a) == ["for a", "for a, untagged"] and heard(b) == ["for b"]


def test_an_untagged_namespaced_reply_is_ours_only_under_our_own_prefix(conn):
    handle = open_turn(conn, "mine", "t1")
    speak(conn, "someone's", "fedcba9876543210:mine", None)    # prefix not seen yet: no
    speak(conn, "tagged", "0123456789abcdef:mine", "t1")        # our turn shows our prefix
    speak(conn, "untagged, ours", "0123456789abcdef:mine", None)
    speak(conn, "untagged, another prefix", "fedcba9876543210:mine", None)
    assert heard(handle) == ["tagged", "untagged, ours"]


def test_the_audio_end_is_repeated_at_growing_gaps_until_the_turn_ends(monkeypatch):
    """ovos-core may subscribe to the audio end after our report (a skill's
    wait_while_speaking checks, then listens): repeats while the turn is open cover a late
    listener, and stop once the turn is over."""
    from hivemind_chat_agent.client import satellite_reports
    monkeypatch.setattr(satellite_reports, "AUDIO_END_ECHO", 0.05)
    monkeypatch.setattr(satellite_reports, "AUDIO_END_ECHO_MAX", 0.2)
    c = HubConnection(ClientConfig.from_dict({"host": "127.0.0.1", "key": "k", "password": "p"}),
                      Session("mine"), SessionBook("d"))
    c._ready.set()                # as after the handshake
    reports = []
    monkeypatch.setattr(c.reports, "audio_end",
                        lambda session_id, tag=None: reports.append(time.monotonic()))
    try:
        handle = open_turn(c, "mine", "t1")
        start = time.monotonic()
        speak(c, "still thinking", "mine", "t1")
        time.sleep(0.75)          # reports at 0, .05, .15, .35, .55, .75 (gaps capped at .2)
        assert heard(handle) == ["still thinking"]
        gaps = [round(b - a, 2) for a, b in zip(reports, reports[1:])]
        assert len(reports) >= 5 and reports[0] - start < 0.02, gaps
        assert gaps[0] < 0.1 and all(g <= 0.3 for g in gaps), gaps
        c.finish_turn(handle)         # the turn is over: the next repeat is the last
        time.sleep(0.5)
        count = len(reports)
        time.sleep(0.5)
        assert len(reports) == count
    finally:
        c._ended.set()
        c._transport.release()


def test_the_first_speaker_is_told_once():
    """The agent relaxes its churn gate when the hub answers through our plugin."""
    told = []
    c = HubConnection(CONFIG, Session("mine"), SessionBook("d"), on_speaker=told.append)
    try:
        handle = open_turn(c, "mine", "t1")
        for _ in range(2):
            c._on_bus(Message("speak", {"utterance": "hi",
                                        "meta": {"skill": "hivemind-chat-agent-plugin"}},
                              {"session": {"session_id": "mine"}, TURN_TAG_KEY: "t1"}))
        assert heard(handle) == ["hi", "hi"] and told == ["hivemind-chat-agent-plugin"]
    finally:
        c._transport.release()


def test_a_send_that_races_the_hubs_pin_refusal_raises_the_refusal():
    """A 5.x hub checks our static key only after the last handshake message: the transport
    has dropped the channel, but the socket thread has not yet read the close (a clean-clone
    CI run raised "refusing to send before the connection is encrypted" instead of the fix)."""
    import threading
    from hivemind_chat_agent.errors import ClientKeyRefusedError
    c = HubConnection(CONFIG, Session("mine"), SessionBook("d"))
    c._ready.set()                # the client's side of the handshake finished
    c.many_sessions = True        # a v3 channel, since dropped by the transport
    late_close = threading.Timer(0.2, c._transport.on_close, (None, 1008, "invalid message"))
    late_close.start()
    try:
        with pytest.raises(ClientKeyRefusedError, match="reset-noise-pin"):
            c.start_turn(Session("mine"), "hello", "t1", timeout=5)
    finally:
        late_close.cancel()
        c._transport.release()
